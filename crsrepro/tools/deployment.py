"""Worked examples for the book page "For deployment teams" (notebooks/09_deployment.ipynb, DESIGN.md section 14).

:func:`example_cohort` writes the csv that a deployment team would export from its own model on a
local cohort, without running the benchmark grid. It is a **simulation**, stated as such in the page:
an over-confident five-grade classifier (APTOS-like grades and class balance), generated as follows
**[ours]**:

1. a case's grade prior is APTOS 2019's class balance (:data:`crsrepro.data.demo_world.APTOS_COUNTS`);
2. its true log-posterior is ``log prior + SIGNAL * e`` with ``e ~ N(0, I_5)``, and its grade is
   drawn from that posterior, so the true posterior is known and calibrated by construction;
3. the model's logits are ``SHARPNESS * (true log-posterior + NOISE * e')``: the right ranking up to a
   little noise, but over-confident, as a network trained to a near-zero training loss tends to be
   (Guo et al. 2017);
4. the csv holds a case id, the model's probabilities per grade rounded to 6 decimals (as an export
   would hold them) and the label.

:func:`example_images` writes a small folder of demo-world fundus images, clean or degraded by one
of :mod:`crsrepro.extract.perturb`'s perturbations, for the ``crsrepro quality-check`` example.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image
from scipy.special import log_softmax, softmax

from crsrepro.core.vocab import CLEAN
from crsrepro.data.demo_world import APTOS_COUNTS, sample_images
from crsrepro.extract.perturb import apply_condition

#: The example's model multiplies the true log-posterior by this **[ours]**.
SHARPNESS = 2.5
#: Spread of the true log-posterior around the log prior **[ours]**.
SIGNAL = 1.5
#: Noise on the model's view of the log-posterior **[ours]**.
NOISE = 0.3
GRADES = [f"grade_{k}" for k in range(len(APTOS_COUNTS))]


def example_cohort(out_dir, *, n=600, seed=0) -> Path:
    """Write ``<out_dir>/local_cohort.csv``: a simulated over-confident classifier on a local cohort.

    Parameters
    ----------
    out_dir : path
    n : int, default 600
        Cases.
    seed : int, default 0

    Returns
    -------
    Path
        The csv, with columns ``case_id``, ``grade_0`` .. ``grade_4`` (probabilities) and ``label``.

    Examples
    --------
    >>> import tempfile
    >>> table = pd.read_csv(example_cohort(tempfile.mkdtemp(), n=50))
    >>> list(table.columns), len(table)
    (['case_id', 'grade_0', 'grade_1', 'grade_2', 'grade_3', 'grade_4', 'label'], 50)
    """
    rng = np.random.default_rng(seed)
    log_prior = np.log(APTOS_COUNTS / APTOS_COUNTS.sum())
    true_log_posterior = log_softmax(log_prior + SIGNAL * rng.standard_normal((n, len(GRADES))), axis=1)
    cumulative = np.exp(true_log_posterior).cumsum(axis=1)
    labels = np.minimum((rng.uniform(size=(n, 1)) > cumulative).sum(axis=1), len(GRADES) - 1)
    model_probs = softmax(SHARPNESS * (true_log_posterior + NOISE * rng.standard_normal((n, len(GRADES)))), axis=1)
    table = pd.DataFrame(np.round(model_probs, 6), columns=GRADES)
    table.insert(0, "case_id", [f"case_{i:04d}" for i in range(n)])
    table["label"] = np.array(GRADES)[labels]
    out = Path(out_dir) / "local_cohort.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    return out


def example_images(out_dir, *, n=12, condition=CLEAN, seed=0, image_size=128) -> Path:
    """Write ``n`` demo-world fundus images (PNG) under ``condition`` (``"clean"`` or ``"jpeg@2"`` ...).

    The same ``seed`` gives the same underlying images, so a clean and a degraded folder differ only
    by the degradation.

    Returns
    -------
    Path
        ``out_dir``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images, _ = sample_images("aptos2019", n, seed=seed, image_size=image_size)
    for i, image in enumerate(images):
        image_id = f"fundus_{i:03d}"
        Image.fromarray(apply_condition(image, condition, image_id)).save(out_dir / f"{image_id}.png")
    return out_dir
