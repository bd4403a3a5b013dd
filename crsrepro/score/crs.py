"""The Clinical Reliability Score (CRS) and its fixed reference frame (DESIGN.md section 9).

The CRS scores *reliability profiles*: the paper's four dimensions of one encoder x dataset cell
(DESIGN.md section 8), ``auroc`` (discrimination D), ``ece`` (calibration C, lower is better),
``retention`` (label efficiency L) and ``robustness`` (R_raw), built from the runs table by
:func:`crsrepro.score.dimensions.reliability_profiles`. A reliability-profiles table is a DataFrame with
the columns ``encoder, dataset, auroc, ece, retention, robustness`` and either one row per cell
(already averaged over seeds) or one row per seed with a ``seed`` column; seeds are averaged first,
as the paper scores seed-averaged cells.

Scoring has two steps.

1. **Normalise** each dimension with the frame's fixed anchors, ``p = (x - worst) / (best - worst)``
   clipped to [0, 1]; the anchors are AUROC 0.5 -> 0 and 1.0 -> 1, ECE 0.25 -> 0 and 0 -> 1,
   retention 0.5 -> 0 and 1.0 -> 1, R_raw 0.75 -> 0 and 1.0 -> 1 **[ours, inferred from "fixed
   anchors"]**. The normalised profile p is reported as the columns ``p_auroc, p_ece, p_retention,
   p_robustness``.
2. **Score** p against the frame's frozen reference profiles for the same dataset:

   - ``pareto``: the share of *peer* reference profiles that p dominates (>= on all four dimensions
     and > on at least one, **[ours: weak dominance]**). Peers are the reference profiles of the
     dataset other than the encoder's own (matched by encoder id); a newcomer's peers are the whole
     reference set.
   - ``proximity`` = 1 - ||1 - p||_2 / 2 **[ours]** (0 at the worst corner, 1 at the ideal).
   - ``worst`` = min_k p_k.
   - ``crs`` = 0.60 pareto + 0.25 proximity + 0.15 worst (the paper's weights).

Because a score depends only on (profile, frame), adding encoders changes no published score
(the paper's invariance property; ``tests/test_crs.py`` proves it bit for bit). ``mode="cohort"``
instead re-normalises min-max over the current panel and counts dominance within it: it exists only
for the paper's insertion experiment (:func:`crsrepro.analyse.findings.insertion_experiment`).

This module is the one implementation of the score. Its functions work on arrays of normalised
profiles of shape ``(..., n, 4)``: the last axis holds the four dimensions in :data:`DIMENSIONS`
order, the one before it the n cells, and any leading axes are replicates (the seed-paired bootstrap's
draws, the multiverse's combinations). The [ours] choices are parameters, with the package's own as
the default: the normalisation (:func:`normalise` with fixed anchors, or :func:`cohort_normalise`,
:data:`COHORT_NORMALISATIONS`), the dominance (:data:`DOMINANCE`) and the proximity (:data:`PROXIMITY`).
:func:`crs_scores` and :func:`aggregate_crs` (the book's CRS), the seed-paired bootstrap
(:func:`crsrepro.score.stats.seed_paired_bootstrap`) and the multiverse of [ours] choices
(:func:`crsrepro.analyse.sensitivity.multiverse`, DESIGN.md section 14) all call them.

Examples
--------
>>> import pandas as pd
>>> panel = pd.DataFrame({"encoder": ["a", "b", "c"], "dataset": "isic2019",
...                       "auroc": [0.9, 0.8, 0.7], "ece": [0.05, 0.10, 0.20],
...                       "retention": [0.95, 0.9, 0.8], "robustness": [0.95, 0.9, 0.85]})
>>> frame = ReferenceFrame.freeze(panel)
>>> crs_scores(panel, frame)[["encoder", "pareto", "crs"]].round(3)
  encoder  pareto    crs
0       a     1.0  0.925
1       b     0.5  0.550
2       c     0.0  0.126
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.special import ndtr

from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import atomic_write
from crsrepro.core.schema import METRICS
from crsrepro.score.dimensions import ProfileTableError

logger = logging.getLogger(__name__)

DIMENSIONS = ("auroc", "ece", "retention", "robustness")
"""The four raw dimensions of a reliability profile, in the paper's order D, C, L, R."""
NORMALISED = tuple(f"p_{d}" for d in DIMENSIONS)
"""The columns of the normalised profile p in [0, 1]^4."""
HIGHER_IS_BETTER = {"auroc": METRICS["auroc"].higher_is_better, "ece": METRICS["ece"].higher_is_better,
                    "retention": True, "robustness": True}
"""The direction of each dimension: D and C take their metric's (:data:`crsrepro.core.schema.METRICS`);
retention and R_raw are higher-is-better by construction (DESIGN.md section 8). The fixed anchors
encode the same directions (value mapped to 0 > value mapped to 1 for ECE)."""
COMPONENTS = ("pareto", "proximity", "worst")
DEFAULT_ANCHORS = {"auroc": (0.5, 1.0), "ece": (0.25, 0.0), "retention": (0.5, 1.0), "robustness": (0.75, 1.0)}
"""(value mapped to 0, value mapped to 1) per dimension, DESIGN.md section 9 **[ours]**."""
DEFAULT_WEIGHTS = {"pareto": 0.60, "proximity": 0.25, "worst": 0.15}
"""The paper's weights of the three components (explicit design parameters, not learned)."""
FRAME_FORMAT_VERSION = 1
"""The version of the frame file layout; :meth:`ReferenceFrame.load` refuses any other."""
MODES = ("fixed", "cohort")
COHORT_NORMALISATIONS = ("minmax", "zscore")
"""How :func:`cohort_normalise` maps a panel's raw dimensions to [0, 1]; ``minmax`` is the cohort mode's."""
DOMINANCE = ("weak", "strict")
"""When a profile dominates a peer in the Pareto share: ``weak`` (>= on all four dimensions and > on
at least one; the package's choice **[ours]**) or ``strict`` (> on all four)."""
PROXIMITY = ("l2", "l1", "chebyshev")
"""The distance of p from the ideal corner, scaled so that the worst corner scores 0: ``l2``
(1 - ||1 - p||_2 / 2, the package's choice **[ours]**), ``l1`` (1 - ||1 - p||_1 / 4) or
``chebyshev`` (1 - max_k (1 - p_k))."""


class FrameError(CrsreproError, ValueError):
    """A reference frame file is missing, corrupt, of another version, or lacks a dataset; or a cell
    has no peer among the reference profiles."""


# --------------------------------------------------------------------------- reliability-profiles tables

def cell_means(profiles: pd.DataFrame, *, where: str = "profiles") -> pd.DataFrame:
    """Validate a reliability-profiles table and return one row per (encoder, dataset) cell, seeds averaged.

    Parameters
    ----------
    profiles : DataFrame
        Columns ``encoder, dataset, auroc, ece, retention, robustness`` and optionally ``seed``.
    where : str
        What to call the table in error messages.

    Returns
    -------
    DataFrame
        Columns ``encoder, dataset`` + :data:`DIMENSIONS` (+ ``n_seeds`` when a ``seed`` column was
        given), sorted by encoder then dataset, with a fresh index.

    Raises
    ------
    ProfileTableError
        A column is missing, a value is not finite, or a cell (or cell x seed) appears twice.
    """
    missing = [c for c in ("encoder", "dataset", *DIMENSIONS) if c not in profiles.columns]
    if missing:
        raise ProfileTableError(f"{where}: missing column(s) {', '.join(missing)} "
                                f"(expected encoder, dataset, {', '.join(DIMENSIONS)} [, seed])")
    key = ["encoder", "dataset"] + (["seed"] if "seed" in profiles.columns else [])
    values = profiles[list(DIMENSIONS)].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    bad_rows, bad_cols = np.nonzero(~np.isfinite(values))
    if len(bad_rows):
        row = profiles.iloc[bad_rows[0]]
        raise ProfileTableError(f"{where}: row {profiles.index[bad_rows[0]]} (encoder {row['encoder']}, dataset "
                                f"{row['dataset']}): {DIMENSIONS[bad_cols[0]]} must be a finite number, "
                                f"got {row[DIMENSIONS[bad_cols[0]]]!r}")
    dup = profiles.duplicated(key, keep=False)
    if dup.any():
        row = profiles[dup].iloc[0]
        raise ProfileTableError(f"{where}: row {profiles.index[dup][0]} repeats the cell "
                                + ", ".join(f"{k} {row[k]}" for k in key))
    table = profiles[key].assign(**dict(zip(DIMENSIONS, values.T)))
    if "seed" in key:
        grouped = table.groupby(["encoder", "dataset"], sort=True)
        table = grouped[list(DIMENSIONS)].mean().join(grouped.size().rename("n_seeds")).reset_index()
    return table.sort_values(["encoder", "dataset"]).reset_index(drop=True)


# --------------------------------------------------------------------------- normalising

def normalise(values: np.ndarray, anchors: dict = DEFAULT_ANCHORS) -> np.ndarray:
    """Map raw dimensions to [0, 1] with fixed anchors: ``clip((x - a0) / (a1 - a0), 0, 1)``.

    Parameters
    ----------
    values : array of shape (..., 4)
        Raw ``auroc, ece, retention, robustness``, last axis in :data:`DIMENSIONS` order.
    anchors : dict
        ``{dimension: (value mapped to 0, value mapped to 1)}``; a0 > a1 means lower is better.

    Examples
    --------
    >>> normalise(np.array([0.75, 0.05, 1.2, 0.5]))
    array([0.5, 0.8, 1. , 0. ])
    """
    a0 = np.array([anchors[d][0] for d in DIMENSIONS], float)
    a1 = np.array([anchors[d][1] for d in DIMENSIONS], float)
    return np.clip((np.asarray(values, float) - a0) / (a1 - a0), 0.0, 1.0)


def cohort_normalise(raw: np.ndarray, datasets, method: str = "minmax") -> np.ndarray:
    """Map raw dimensions to [0, 1] against the current panel, dataset by dataset and replicate by replicate.

    The lower-is-better ECE (:data:`HIGHER_IS_BETTER`) is negated first; then, per dataset and
    dimension, over the panel's cells on that dataset **[ours]**:

    - ``minmax``: ``(x - min) / (max - min)``, the cohort mode of :func:`crs_scores`;
    - ``zscore``: the standard normal CDF of ``(x - mean) / sd`` (population SD), an alternative of
      the multiverse (:mod:`crsrepro.analyse.sensitivity`).

    A dimension constant over the panel maps to 1.

    Parameters
    ----------
    raw : array of shape (..., n, 4)
        Raw profiles of n cells; leading axes are replicates, each normalised against its own panel.
    datasets : array of shape (n,)
        The dataset of each cell.
    method : {"minmax", "zscore"}

    Examples
    --------
    >>> cohort_normalise(np.array([[0.9, 0.05, 0.9, 0.9], [0.7, 0.15, 0.9, 0.8]]), ["isic2019", "isic2019"])
    array([[1., 1., 1., 1.],
           [0., 0., 1., 0.]])
    """
    if method not in COHORT_NORMALISATIONS:
        raise ValueError(f"method must be one of {', '.join(COHORT_NORMALISATIONS)}, got {method!r}")
    datasets = np.asarray(datasets)
    sign = np.array([1.0 if HIGHER_IS_BETTER[d] else -1.0 for d in DIMENSIONS])
    x = np.asarray(raw, float) * sign
    p = np.ones_like(x)
    for dataset in np.unique(datasets):
        rows = datasets == dataset
        panel = x[..., rows, :]
        if method == "minmax":
            low, span = panel.min(-2, keepdims=True), np.ptp(panel, axis=-2, keepdims=True)
            p[..., rows, :] = np.divide(panel - low, span, out=np.ones_like(panel), where=span > 0)
        else:
            sd = panel.std(-2, keepdims=True)
            z = np.divide(panel - panel.mean(-2, keepdims=True), sd, out=np.full_like(panel, np.inf), where=sd > 0)
            p[..., rows, :] = ndtr(z)
    return p


# --------------------------------------------------------------------------- the components

def pareto_share(p: np.ndarray, reference: np.ndarray, peers: np.ndarray, dominance: str = "weak") -> np.ndarray:
    """The share of its peer reference profiles that each profile dominates (:data:`DOMINANCE`).

    Parameters
    ----------
    p : array of shape (..., n, 4)
        Normalised profiles; leading axes are replicates.
    reference : array of shape (m, 4) or (..., m, 4)
        The normalised reference profiles of the same dataset: one set for every replicate, or one
        set per replicate (the seed-paired bootstrap's resampled peers).
    peers : bool array of shape (n, m)
        ``peers[i, j]`` is True when reference profile j is a peer of profile i.
    dominance : {"weak", "strict"}

    Returns
    -------
    array of shape (..., n)

    Raises
    ------
    FrameError
        A profile has no peer.
    """
    if dominance not in DOMINANCE:
        raise ValueError(f"dominance must be one of {', '.join(DOMINANCE)}, got {dominance!r}")
    peers = np.asarray(peers, bool)
    n_peers = peers.sum(-1)
    if np.any(n_peers == 0):
        raise FrameError("a cell has no peer profile on its dataset (only its own encoder's): the reference "
                         "profiles need at least two encoders per dataset")
    p, reference = np.asarray(p, float), np.asarray(reference, float)
    strictly = p[..., :, None, :] > reference[..., None, :, :]         # (..., n, m, 4)
    if dominance == "weak":
        dominated = (p[..., :, None, :] >= reference[..., None, :, :]).all(-1) & strictly.any(-1)
    else:
        dominated = strictly.all(-1)
    return (dominated & peers).sum(-1) / n_peers


def proximity_to_ideal(p: np.ndarray, proximity: str = "l2") -> np.ndarray:
    """The closeness of normalised profiles (..., 4) to the ideal corner (:data:`PROXIMITY`): array (...).

    >>> proximity_to_ideal(np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]))
    array([1. , 0. , 0.5])
    """
    gap = 1.0 - np.asarray(p, float)
    if proximity == "l2":
        return 1.0 - np.sqrt((gap ** 2).sum(-1)) / 2.0
    if proximity == "l1":
        return 1.0 - gap.sum(-1) / 4.0
    if proximity == "chebyshev":
        return 1.0 - gap.max(-1)
    raise ValueError(f"proximity must be one of {', '.join(PROXIMITY)}, got {proximity!r}")


def weighted_crs(parts: dict, weights: dict = DEFAULT_WEIGHTS) -> np.ndarray:
    """CRS = w_pareto pareto + w_proximity proximity + w_worst worst.

    The weights may be arrays that broadcast against the components: the multiverse passes its whole
    grid of weights at once.

    >>> float(weighted_crs({"pareto": 1.0, "proximity": 0.5, "worst": 0.0}))
    0.725
    """
    return weights["pareto"] * parts["pareto"] + weights["proximity"] * parts["proximity"] + weights["worst"] * parts["worst"]


def crs_components(p: np.ndarray, reference: np.ndarray, peers: np.ndarray, weights: dict = DEFAULT_WEIGHTS, *,
                   dominance: str = "weak", proximity: str = "l2") -> dict[str, np.ndarray]:
    """Pareto share, proximity, worst dimension and CRS of normalised profiles (the formulas above).

    Parameters
    ----------
    p : array of shape (..., n, 4)
        Normalised profiles; leading axes are replicates.
    reference : array of shape (m, 4) or (..., m, 4)
        The normalised reference profiles of the same dataset (see :func:`pareto_share`).
    peers : bool array of shape (n, m)
        ``peers[i, j]`` is True when reference profile j is a peer of profile i.
    weights : dict
        Weights of ``pareto``, ``proximity`` and ``worst``.
    dominance, proximity : str
        The [ours] variants, :data:`DOMINANCE` and :data:`PROXIMITY` (the package's: weak, l2).

    Returns
    -------
    dict of arrays of shape (..., n)
        ``pareto``, ``proximity``, ``worst`` and ``crs``.

    Examples
    --------
    >>> out = crs_components(np.array([[1.0, 1.0, 1.0, 1.0]]), np.zeros((2, 4)), np.array([[True, False]]))
    >>> {k: float(v[0]) for k, v in out.items()}
    {'pareto': 1.0, 'proximity': 1.0, 'worst': 1.0, 'crs': 1.0}
    """
    p = np.asarray(p, float)
    parts = {"pareto": pareto_share(p, reference, peers, dominance), "proximity": proximity_to_ideal(p, proximity),
             "worst": p.min(-1)}
    return parts | {"crs": weighted_crs(parts, weights)}


# --------------------------------------------------------------------------- the frame

@dataclass(frozen=True, eq=False)
class ReferenceFrame:
    """The fixed anchors, the weights and the frozen normalised reference profiles (DESIGN.md 9).

    Build one with :meth:`freeze` from the reference panel's profiles, keep it with :meth:`save`
    (YAML under ``data_manifests/``, with a format version and a SHA-256 of its content) and read it
    back with :meth:`load`, which checks both.

    Attributes
    ----------
    reference : DataFrame
        Columns ``encoder, dataset`` + :data:`NORMALISED`: one frozen profile per reference cell.
    anchors : dict
        ``{dimension: (value mapped to 0, value mapped to 1)}``; default :data:`DEFAULT_ANCHORS`.
    weights : dict
        Component weights; default :data:`DEFAULT_WEIGHTS`.
    description : str
        Free text saved with the frame (e.g. the profile and run it was frozen from).
    results_hash : str or None
        The hash of the results the frame was frozen from (the caller's choice of hash, e.g. the
        SHA-256 of ``results.parquet``), or None when not recorded (frames saved before it existed).
        Saved with the frame and part of its content hash; :meth:`check_results` compares it.
    path : Path or None
        The file the frame was read from (set by :meth:`load`; not part of the content).
    """

    reference: pd.DataFrame = field(repr=False)
    anchors: dict = field(default_factory=lambda: dict(DEFAULT_ANCHORS))
    weights: dict = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    description: str = ""
    results_hash: str | None = None
    path: Path | None = None

    @classmethod
    def freeze(cls, profiles: pd.DataFrame, *, anchors: dict | None = None, weights: dict | None = None,
               description: str = "", results_hash: str | None = None) -> "ReferenceFrame":
        """Normalise the reference panel's reliability profiles (seeds averaged); freeze them with the anchors.

        Parameters
        ----------
        profiles : DataFrame
            A reliability-profiles table (see the module docstring) of the reference panel.
        anchors, weights : dict, optional
            Override :data:`DEFAULT_ANCHORS` / :data:`DEFAULT_WEIGHTS` (every key must be given).
        description : str
            Saved with the frame.
        results_hash : str, optional
            The hash of the results ``profiles`` were built from (see the class attributes).
        """
        if results_hash is not None and not isinstance(results_hash, str):
            raise FrameError(f"results_hash must be a string or None, got {results_hash!r}")
        anchors = {d: tuple(float(v) for v in (anchors or DEFAULT_ANCHORS)[d]) for d in DIMENSIONS}
        weights = {c: float((weights or DEFAULT_WEIGHTS)[c]) for c in COMPONENTS}
        cells = cell_means(profiles, where="reference profiles")
        p = normalise(cells[list(DIMENSIONS)].to_numpy(), anchors)
        reference = cells[["encoder", "dataset"]].assign(**dict(zip(NORMALISED, p.T)))
        return cls(reference=reference, anchors=anchors, weights=weights, description=description,
                   results_hash=results_hash)

    @property
    def datasets(self) -> list[str]:
        return sorted(self.reference["dataset"].unique())

    @property
    def encoders(self) -> list[str]:
        return sorted(self.reference["encoder"].unique())

    def reference_for(self, dataset: str) -> tuple[np.ndarray, np.ndarray]:
        """The reference encoder ids and their normalised profiles (m x 4) for ``dataset``."""
        rows = self.reference[self.reference["dataset"] == dataset]
        if rows.empty:
            raise FrameError(f"the reference frame has no reference profiles for dataset {dataset!r} "
                             f"(it has {', '.join(self.datasets)})")
        return rows["encoder"].to_numpy(), rows[list(NORMALISED)].to_numpy(float)

    def published_scores(self) -> pd.DataFrame:
        """The CRS of every reference cell, scored against its peers: what the frame publishes."""
        return _score_cells(self.reference[["encoder", "dataset"]], self.reference[list(NORMALISED)].to_numpy(float),
                            self, peers="frozen")

    def check_results(self, results_hash: str | None) -> str | None:
        """None when the frame was frozen from results with this hash, else a one-line message.

        The message names the frame file (or says the frame is not saved) and both hashes (their first
        12 characters); the book shows it as a warning and ``crsrepro score`` raises it as an error
        with the remedy (DESIGN.md section 9). A hash that is None on either side (an old frame, results without
        a recorded hash) cannot be checked, and says so, unless both are None.
        """
        if self.results_hash == results_hash:
            return None
        where = str(self.path) if self.path is not None else "the reference frame (not saved)"
        if self.results_hash is None:
            return f"{where}: the frame records no results hash, so it cannot be checked against these results"
        if results_hash is None:
            return f"{where}: the results record no hash, so they cannot be checked against this frame"
        return (f"{where}: frozen from results {self.results_hash[:12]}, but the results now hash to "
                f"{results_hash[:12]}: the frame is stale")

    # ---- persistence
    def to_dict(self) -> dict:
        """The saved content (without the hash): plain Python types, floats exact.

        ``results_hash`` is included only when recorded, so frames saved before it existed keep
        their content hash.
        """
        rows = [{"encoder": str(r.encoder), "dataset": str(r.dataset),
                 **{c: float(getattr(r, c)) for c in NORMALISED}} for r in self.reference.itertuples()]
        content = {"version": FRAME_FORMAT_VERSION, "description": self.description,
                   "anchors": {d: [float(v) for v in self.anchors[d]] for d in DIMENSIONS},
                   "weights": {c: float(self.weights[c]) for c in COMPONENTS},
                   "reference": rows}
        if self.results_hash is not None:
            content["results_hash"] = self.results_hash
        return content

    def content_hash(self) -> str:
        """SHA-256 of the canonical YAML of :meth:`to_dict`."""
        return _sha256(self.to_dict())

    def save(self, path: str | Path) -> Path:
        """Write the frame as YAML with its ``version`` and ``hash``; returns the path."""
        path = Path(path)
        content = self.to_dict()
        content["hash"] = _sha256(content)
        atomic_write(path, ("# crsrepro CRS reference frame (DESIGN.md section 9); do not edit: the hash is checked\n"
                            + yaml.safe_dump(content, sort_keys=True)).encode())
        logger.info("saved the CRS reference frame (%d reference cells) to %s", len(self.reference), path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ReferenceFrame":
        """Read a frame written by :meth:`save`, checking its version and hash.

        Raises
        ------
        FrameError
            The file is missing or not a frame, its version differs, or its content does not match its hash.
        """
        path = Path(path)
        if not path.is_file():
            raise FrameError(f"no CRS reference frame at {path}: freeze one from a complete run of the profile "
                             f"with `crsrepro freeze-frame --profile <name>`")
        try:
            content = yaml.safe_load(path.read_text())
            stored = content.pop("hash")
            version = content["version"]
        except (yaml.YAMLError, AttributeError, KeyError, TypeError):
            raise FrameError(f"{path} is not a CRS reference frame (expected keys version, hash, anchors, "
                             f"weights, reference)") from None
        if version != FRAME_FORMAT_VERSION:
            raise FrameError(f"{path}: frame format version {version!r}, this crsrepro reads version "
                             f"{FRAME_FORMAT_VERSION}")
        if _sha256(content) != stored:
            raise FrameError(f"{path}: content does not match its hash {stored!r} (the file was edited or "
                             f"truncated; re-freeze the frame)")
        try:
            frame = cls(reference=pd.DataFrame(content["reference"], columns=["encoder", "dataset", *NORMALISED]),
                        anchors={d: tuple(content["anchors"][d]) for d in DIMENSIONS},
                        weights={c: content["weights"][c] for c in COMPONENTS},
                        description=content.get("description", ""),
                        results_hash=content.get("results_hash"), path=path)
        except (KeyError, TypeError, ValueError) as exc:
            raise FrameError(f"{path}: malformed frame content ({exc})") from None
        if frame.results_hash is not None and not isinstance(frame.results_hash, str):
            raise FrameError(f"{path}: results_hash must be a string, got {frame.results_hash!r}")
        return frame


def _sha256(content: dict) -> str:
    return hashlib.sha256(yaml.safe_dump(content, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- scoring

PEERS = ("frozen", "resampled", "panel")
"""Whose profiles a cell is compared with: the frame's frozen reference profiles; for replicates of the
seed-paired bootstrap, the same replicate's profiles of the reference encoders; or, cohort-style, the
panel being scored itself (:func:`score_by_dataset`)."""


def score_by_dataset(cells: pd.DataFrame, p: np.ndarray, frame: ReferenceFrame | None = None, *,
                     peers: str = "frozen", dominance: str = "weak", proximity: str = "l2") -> dict[str, np.ndarray]:
    """The CRS components of normalised profiles ``p``, dataset by dataset.

    This is the one loop over datasets, reference profiles and peers; :func:`crs_scores`, the
    seed-paired bootstrap and the multiverse all call it.

    Parameters
    ----------
    cells : DataFrame
        Columns ``encoder, dataset``, one row per cell of ``p``.
    p : array of shape (..., n, 4)
        Normalised profiles of the n cells; leading axes are replicates.
    frame : ReferenceFrame, optional
        Supplies the weights, the reference encoders and their frozen profiles; None with
        ``peers="panel"``, which takes the default weights.
    peers : {"frozen", "resampled", "panel"}, default "frozen"
        ``frozen``: compare with the frame's reference profiles. ``resampled``: a reference encoder
        with a row in ``cells`` on the dataset is represented by that row of ``p`` (replicate by
        replicate); reference encoders without a row keep their frozen profile (their count is
        logged). ``panel``: compare each cell with the other encoders' cells of ``p`` on its dataset,
        replicate by replicate (cohort-style, no frame).
    dominance, proximity : str
        The [ours] variants, :data:`DOMINANCE` and :data:`PROXIMITY`.

    Returns
    -------
    dict of arrays of shape (..., n)
        ``pareto``, ``proximity``, ``worst`` and ``crs``.
    """
    if peers not in PEERS:
        raise ValueError(f"peers must be one of {', '.join(PEERS)}, got {peers!r}")
    if (frame is None) != (peers == "panel"):
        raise ValueError("peers='frozen' and 'resampled' need a ReferenceFrame; peers='panel' takes frame=None")
    p = np.asarray(p, float)
    weights = frame.weights if frame is not None else DEFAULT_WEIGHTS
    encoders = cells["encoder"].to_numpy()
    out = {c: np.empty(p.shape[:-1]) for c in (*COMPONENTS, "crs")}
    for dataset, rows in cells.groupby("dataset", sort=True).indices.items():
        if peers == "panel":
            ref_encoders, reference = encoders[rows], p[..., rows, :]
        else:
            ref_encoders, reference = frame.reference_for(dataset)
        if peers == "resampled":
            row_of = dict(zip(encoders[rows], rows))
            frozen = [e for e in ref_encoders if e not in row_of]
            if frozen:
                logger.info("dataset %s: %d reference encoder(s) have no profiles here and keep their frozen "
                            "profile as peers: %s", dataset, len(frozen), ", ".join(frozen))
            reference = np.stack([p[..., row_of[e], :] if e in row_of else np.broadcast_to(ref, p.shape[:-2] + (4,))
                                  for e, ref in zip(ref_encoders, reference)], axis=-2)  # (..., m, 4)
        peer_mask = encoders[rows, None] != ref_encoders[None, :]
        parts = crs_components(p[..., rows, :], reference, peer_mask, weights, dominance=dominance, proximity=proximity)
        for name, values in parts.items():
            out[name][..., rows] = values
    return out


def _score_cells(cells: pd.DataFrame, p: np.ndarray, frame: ReferenceFrame | None, *, peers: str) -> pd.DataFrame:
    """Score normalised profiles ``p`` (rows of ``cells``: encoder, dataset) with :func:`score_by_dataset`."""
    out = score_by_dataset(cells, p, frame, peers=peers)
    return cells.reset_index(drop=True).assign(**dict(zip(NORMALISED, p.T)), **out)


def encoder_means(values: np.ndarray, encoders) -> tuple[np.ndarray, np.ndarray]:
    """Each encoder's mean over its cells: the last axis of ``values``; leading axes are replicates.

    The means are pandas' ``groupby().mean()``, the mean :func:`aggregate_crs` takes, applied to every
    replicate at once, so an encoder's mean here is its aggregate there to the last bit.

    Parameters
    ----------
    values : array of shape (..., n)
        The values of n cells.
    encoders : array of shape (n,)
        The encoder of each cell.

    Returns
    -------
    names : array of shape (E,)
        The encoders, sorted.
    means : array of shape (..., E)

    Examples
    --------
    >>> names, means = encoder_means(np.array([0.5, 0.7, 0.4]), ["a", "a", "b"])
    >>> names.tolist(), means.tolist()
    (['a', 'b'], [0.6, 0.4])
    """
    values = np.asarray(values, float)
    by_cell = pd.DataFrame(values.reshape(-1, values.shape[-1]).T)  # one row per cell, one column per replicate
    means = by_cell.groupby(np.asarray(encoders), sort=True).mean()
    return means.index.to_numpy(), means.to_numpy().T.reshape(values.shape[:-1] + (len(means),))


def crs_scores(profiles: pd.DataFrame, frame: ReferenceFrame | None, *, mode: str = "fixed") -> pd.DataFrame:
    """The CRS of every cell of a reliability-profiles table.

    Parameters
    ----------
    profiles : DataFrame
        A reliability-profiles table (see the module docstring); seeds are averaged first.
    frame : ReferenceFrame or None
        The frozen frame (``mode="fixed"``); must be None for ``mode="cohort"``.
    mode : {"fixed", "cohort"}
        ``fixed``: the frame's anchors and peers (the paper's CRS). ``cohort``: min-max over the
        current panel per dataset and dimension (:func:`cohort_normalise`), dominance counted within
        the panel (``peers="panel"``) and the default weights; only for the insertion experiment.

    Returns
    -------
    DataFrame
        One row per cell, sorted by encoder then dataset: ``encoder, dataset``, the raw
        :data:`DIMENSIONS`, the normalised :data:`NORMALISED`, ``pareto, proximity, worst, crs``.

    Raises
    ------
    ValueError
        ``mode`` is unknown, or the frame does not fit the mode.
    ProfileTableError, FrameError
        A bad reliability-profiles table, or a dataset the frame does not cover.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if (mode == "fixed") != (frame is not None):
        raise ValueError("mode='fixed' needs a ReferenceFrame; mode='cohort' takes frame=None")
    cells = cell_means(profiles)
    raw = cells[list(DIMENSIONS)].to_numpy()
    if mode == "fixed":
        scored = _score_cells(cells[["encoder", "dataset"]], normalise(raw, frame.anchors), frame, peers="frozen")
    else:
        p = cohort_normalise(raw, cells["dataset"].to_numpy(), "minmax")
        scored = _score_cells(cells[["encoder", "dataset"]], p, None, peers="panel")
    return pd.concat([cells[["encoder", "dataset", *DIMENSIONS]], scored.drop(columns=["encoder", "dataset"])], axis=1)


def aggregate_crs(scores: pd.DataFrame) -> pd.DataFrame:
    """Each encoder's mean CRS and mean AUROC over its available cells; missing cells are never imputed.

    Parameters
    ----------
    scores : DataFrame
        The output of :func:`crs_scores` (columns ``encoder, dataset, crs`` and ``auroc``) or of
        :meth:`ReferenceFrame.published_scores` (no ``auroc``: a frame keeps normalised profiles only).

    Returns
    -------
    DataFrame
        Indexed by encoder, sorted by CRS (best first): ``crs``, ``auroc`` (when given), ``n_cells``,
        ``rank_crs`` and ``rank_auroc`` (1 = best; ties share the lowest rank).

    Examples
    --------
    >>> s = pd.DataFrame({"encoder": ["a", "a", "b"], "dataset": ["x", "y", "x"],
    ...                   "auroc": [0.8, 0.9, 0.95], "crs": [0.5, 0.7, 0.4]})
    >>> aggregate_crs(s)  # doctest: +NORMALIZE_WHITESPACE
             crs  auroc  n_cells  rank_crs  rank_auroc
    encoder
    a        0.6   0.85        2         1           2
    b        0.4   0.95        1         2           1
    """
    cells = scores.sort_values(["encoder", "dataset"])
    means = [c for c in ("crs", "auroc") if c in cells.columns]
    out = cells.groupby("encoder")[means].mean().join(cells.groupby("encoder").size().rename("n_cells"))
    for c in means:
        out[f"rank_{c}"] = out[c].rank(ascending=False, method="min").astype(int)
    return out.sort_values([f"rank_{c}" for c in means], kind="stable")


def score_encoder(profile_rows: pd.DataFrame, frame: ReferenceFrame) -> pd.DataFrame:
    """Score a new encoder against a frozen frame, without recomputing the panel (``crsrepro score``).

    Parameters
    ----------
    profile_rows : DataFrame
        The reliability-profiles table of one encoder (one row per dataset, or per dataset and seed).
    frame : ReferenceFrame
        The frozen frame; its published scores are not changed by this call.

    Returns
    -------
    DataFrame
        The encoder's cells as in :func:`crs_scores`, plus ``aggregate_crs`` (its mean over the cells
        given) and ``rank`` (1 + the number of *other* reference encoders whose published aggregate
        CRS is higher) and ``n_published`` (how many other reference encoders there are).
    """
    encoders = profile_rows["encoder"].unique() if "encoder" in profile_rows.columns else []
    if len(encoders) != 1:
        raise ProfileTableError(f"score_encoder takes the profile of one encoder, got encoders {list(encoders)}")
    scored = crs_scores(profile_rows, frame)
    published = aggregate_crs(frame.published_scores()).drop(index=encoders[0], errors="ignore")
    mean = scored["crs"].mean()
    return scored.assign(aggregate_crs=mean, rank=int((published["crs"] > mean).sum()) + 1,
                         n_published=len(published))
