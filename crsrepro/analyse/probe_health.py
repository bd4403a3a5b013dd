"""How the linear probes were fitted: the unconverged share and where C was chosen (issue 24; DESIGN.md section 7).

Every linear-probe fit records the C it chose (``probe_C``) and whether its optimiser converged within
``probe.max_iter`` (``converged``) in each of its result rows. These tables count the *fits* (one per
encoder, dataset, seed, label fraction and layer), not the rows, so that the many perturbed conditions
of one fit count once. Control probes (MLP, k-NN) choose no C and are left out.

Examples
--------
>>> analysis = RunAnalysis.load("demo")              # doctest: +SKIP
>>> convergence_table(analysis.results)                # doctest: +SKIP
>>> c_choice_table(analysis.results, analysis.profile.probe.c_grid)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.core.vocab import LINEAR

MAX_UNCONVERGED = 0.01
"""The largest unconverged share of linear-probe fits a run may have before the book says so in a box
(issue 24: at least 99 % of fits converge) **[ours]**."""
FIT = ["encoder", "dataset", "seed", "label_fraction", "layer"]
"""The columns that name one probe fit."""


def probe_fits(results: pd.DataFrame) -> pd.DataFrame:
    """One row per linear-probe fit of a results table: :data:`FIT`, ``probe_C``, ``converged`` and, where
    the results record them, ``c_rule`` and ``c_tie`` (how C was chosen, :mod:`crsrepro.fit.linear`)."""
    linear = results[results["probe"] == LINEAR]
    columns = FIT + [c for c in ("probe_C", "converged", "c_rule", "c_tie") if c in results.columns]
    fits = linear.drop_duplicates(FIT)[columns].reset_index(drop=True)
    return fits.assign(converged=fits["converged"].astype(bool))


def convergence_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per encoder: the linear-probe fits, how many stopped at ``max_iter`` before converging, and their share.

    Returns
    -------
    DataFrame
        Indexed by encoder: ``fits``, ``unconverged``, ``unconverged_share``; a last row ``all``.

    Examples
    --------
    >>> results = pd.DataFrame({"encoder": ["a", "a", "a", "b"], "dataset": "d", "seed": [0, 0, 1, 0],
    ...                         "label_fraction": 1.0, "layer": "final", "probe": "linear", "probe_C": 1.0,
    ...                         "converged": [False, False, True, True]})
    >>> convergence_table(results)["unconverged_share"].to_dict()
    {'a': 0.5, 'b': 0.0, 'all': 0.3333333333333333}
    """
    fits = probe_fits(results)
    table = fits.groupby("encoder").agg(fits=("converged", "size"), unconverged=("converged", lambda c: int((~c).sum())))
    table.loc["all"] = table.sum()
    return table.assign(unconverged_share=table["unconverged"] / table["fits"])


def c_choice_table(results: pd.DataFrame, c_grid) -> pd.DataFrame:
    """Per dataset and label fraction: how often C was chosen at the grid's edges, by cross-validation,
    and after a tie.

    Many choices at an edge of the grid say that the grid may be too narrow, or that the cases that
    choose C cannot tell the C values apart. Below :data:`crsrepro.fit.linear.MIN_VAL_CASES` val cases C
    is cross-validated inside the labelled subset (``cross_validated``); a tie in AUROC is broken by the
    log-loss (``ties``).

    Returns
    -------
    DataFrame
        Indexed by ``dataset, label_fraction``: ``fits``, ``at_smallest_c`` and ``at_largest_c``, and,
        where the results record them, ``cross_validated`` and ``ties`` (shares).

    Examples
    --------
    >>> results = pd.DataFrame({"encoder": "a", "dataset": "d", "seed": [0, 1, 2, 3], "label_fraction": 0.1,
    ...                         "layer": "final", "probe": "linear", "probe_C": [0.01, 0.01, 1.0, 100.0],
    ...                         "converged": True})
    >>> c_choice_table(results, [0.01, 1.0, 100.0]).iloc[0].to_dict()
    {'fits': 4.0, 'at_smallest_c': 0.5, 'at_largest_c': 0.25}
    """
    grid = np.sort(np.asarray(c_grid, dtype=float))
    fits = probe_fits(results)
    fits = fits.assign(at_smallest_c=np.isclose(fits["probe_C"], grid[0]),
                       at_largest_c=np.isclose(fits["probe_C"], grid[-1]))
    shares = dict(at_smallest_c=("at_smallest_c", "mean"), at_largest_c=("at_largest_c", "mean"))
    if "c_rule" in fits.columns:
        fits = fits.assign(cross_validated=fits["c_rule"] == "cv", ties=fits["c_tie"].astype(bool))
        shares |= dict(cross_validated=("cross_validated", "mean"), ties=("ties", "mean"))
    return fits.groupby(["dataset", "label_fraction"]).agg(fits=("probe_C", "size"), **shares)


__all__ = ["MAX_UNCONVERGED", "c_choice_table", "convergence_table", "probe_fits"]
