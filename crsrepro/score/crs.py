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

from crsrepro.score.dimensions import ProfileTableError
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import atomic_write

logger = logging.getLogger(__name__)

DIMENSIONS = ("auroc", "ece", "retention", "robustness")
"""The four raw dimensions of a reliability profile, in the paper's order D, C, L, R."""
NORMALISED = tuple(f"p_{d}" for d in DIMENSIONS)
"""The columns of the normalised profile p in [0, 1]^4."""
COMPONENTS = ("pareto", "proximity", "worst")
DEFAULT_ANCHORS = {"auroc": (0.5, 1.0), "ece": (0.25, 0.0), "retention": (0.5, 1.0), "robustness": (0.75, 1.0)}
"""(value mapped to 0, value mapped to 1) per dimension, DESIGN.md section 9 **[ours]**."""
DEFAULT_WEIGHTS = {"pareto": 0.60, "proximity": 0.25, "worst": 0.15}
"""The paper's weights of the three components (explicit design parameters, not learned)."""
FRAME_FORMAT_VERSION = 1
"""The version of the frame file layout; :meth:`ReferenceFrame.load` refuses any other."""
MODES = ("fixed", "cohort")


class FrameError(CrsreproError, ValueError):
    """A reference frame file is missing, corrupt, of another version, or lacks a dataset."""


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


def crs_components(p: np.ndarray, reference: np.ndarray, peers: np.ndarray,
                   weights: dict = DEFAULT_WEIGHTS) -> dict[str, np.ndarray]:
    """Pareto share, proximity, worst dimension and CRS of normalised profiles (the formulas above).

    This is the one implementation of the score; :func:`crs_scores` and the seed-paired bootstrap
    (which passes a batch of replicates per cell) both call it.

    Parameters
    ----------
    p : array of shape (n, ..., 4)
        Normalised profiles; any axes between the first and the last are batch axes (replicates).
    reference : array of shape (m, 4) or (..., m, 4)
        The normalised reference profiles of the same dataset: one set for every profile, or one set
        per replicate (the batch axes of ``p``; the seed-paired bootstrap's resampled peers).
    peers : bool array of shape (n, m)
        ``peers[i, j]`` is True when reference profile j is a peer of profile i.
    weights : dict
        Weights of ``pareto``, ``proximity`` and ``worst``.

    Returns
    -------
    dict of arrays of shape (n, ...)
        ``pareto``, ``proximity``, ``worst`` and ``crs``.

    Examples
    --------
    >>> out = crs_components(np.array([[1.0, 1.0, 1.0, 1.0]]), np.zeros((2, 4)), np.array([[True, False]]))
    >>> {k: float(v[0]) for k, v in out.items()}
    {'pareto': 1.0, 'proximity': 1.0, 'worst': 1.0, 'crs': 1.0}
    """
    p = np.asarray(p, float)
    peers = np.asarray(peers, bool).reshape((peers.shape[0],) + (1,) * (p.ndim - 2) + (peers.shape[1],))
    n_peers = peers.sum(-1)
    if np.any(n_peers == 0):
        raise FrameError("the reference frame holds no peer profile for a cell (only its own encoder's): "
                         "freeze the frame from at least two encoders per dataset")
    ahead = p[..., None, :] >= reference          # (n, ..., m, 4)
    strictly = p[..., None, :] > reference
    dominated = ahead.all(-1) & strictly.any(-1) & peers
    pareto = dominated.sum(-1) / n_peers
    proximity = 1.0 - np.sqrt(((1.0 - p) ** 2).sum(-1)) / 2.0
    worst = p.min(-1)
    crs = weights["pareto"] * pareto + weights["proximity"] * proximity + weights["worst"] * worst
    return {"pareto": pareto, "proximity": proximity, "worst": worst, "crs": crs}


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
                            self)

    def check_results(self, results_hash: str | None) -> str | None:
        """None when the frame was frozen from results with this hash, else a one-line message.

        The message names the frame file (or says the frame is not saved) and both hashes (their first
        12 characters); the book shows it as a warning and ``crsrepro score`` raises it as an error
        with the remedy (issue 9). A hash that is None on either side (an old frame, results without
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

PEERS = ("frozen", "resampled")
"""Whose profiles a cell is compared with: the frame's frozen reference profiles, or (for replicates
of the seed-paired bootstrap) the same replicate's profiles of the reference encoders."""


def score_by_dataset(cells: pd.DataFrame, p: np.ndarray, frame: ReferenceFrame, *,
                     peers: str = "frozen") -> dict[str, np.ndarray]:
    """The CRS components of normalised profiles ``p``, dataset by dataset, under ``frame``.

    This is the one loop over datasets, reference profiles and peers; :func:`crs_scores` and the
    seed-paired bootstrap both call it.

    Parameters
    ----------
    cells : DataFrame
        Columns ``encoder, dataset``, one row per row of ``p``.
    p : array of shape (n, ..., 4)
        Normalised profiles (any axes between the first and the last are replicates).
    frame : ReferenceFrame
        Supplies the weights, the reference encoders and their frozen profiles.
    peers : {"frozen", "resampled"}, default "frozen"
        ``frozen``: compare with the frame's reference profiles. ``resampled``: a reference encoder
        with a row in ``cells`` on the dataset is represented by that row of ``p`` (replicate by
        replicate); reference encoders without a row keep their frozen profile (their count is logged).

    Returns
    -------
    dict of arrays of shape (n, ...)
        ``pareto``, ``proximity``, ``worst`` and ``crs``.
    """
    if peers not in PEERS:
        raise ValueError(f"peers must be one of {', '.join(PEERS)}, got {peers!r}")
    p = np.asarray(p, float)
    encoders = cells["encoder"].to_numpy()
    out = {c: np.empty(p.shape[:-1]) for c in (*COMPONENTS, "crs")}
    for dataset, rows in cells.groupby("dataset", sort=True).indices.items():
        ref_encoders, reference = frame.reference_for(dataset)
        if peers == "resampled":
            row_of = dict(zip(encoders[rows], rows))
            frozen = [e for e in ref_encoders if e not in row_of]
            if frozen:
                logger.info("dataset %s: %d reference encoder(s) have no profiles here and keep their frozen "
                            "profile as peers: %s", dataset, len(frozen), ", ".join(frozen))
            reference = np.stack([p[row_of[e]] if e in row_of else np.broadcast_to(ref, p.shape[1:])
                                  for e, ref in zip(ref_encoders, reference)], axis=-2)  # (..., m, 4)
        peer_mask = encoders[rows, None] != ref_encoders[None, :]
        for name, values in crs_components(p[rows], reference, peer_mask, frame.weights).items():
            out[name][rows] = values
    return out


def _score_cells(cells: pd.DataFrame, p: np.ndarray, frame: ReferenceFrame) -> pd.DataFrame:
    """Score normalised profiles ``p`` (rows of ``cells``: encoder, dataset) against ``frame``'s frozen peers."""
    out = score_by_dataset(cells, p, frame)
    return cells.reset_index(drop=True).assign(**dict(zip(NORMALISED, p.T)), **out)


def _cohort_normalise(cells: pd.DataFrame) -> np.ndarray:
    """Min-max per dataset and dimension over the current panel; a constant dimension maps to 1 **[ours]**."""
    raw = cells[list(DIMENSIONS)].to_numpy(float)
    higher_is_better = np.array([DEFAULT_ANCHORS[d][1] > DEFAULT_ANCHORS[d][0] for d in DIMENSIONS])
    p = np.ones_like(raw)
    for rows in cells.groupby("dataset").indices.values():
        x = raw[rows]
        best = np.where(higher_is_better, x.max(0), x.min(0))
        worst = np.where(higher_is_better, x.min(0), x.max(0))
        span = best - worst
        p[rows] = np.divide(x - worst, span, out=np.ones_like(x), where=span != 0)
    return p


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
        current panel per dataset and dimension, dominance counted within the panel and the default
        weights; only for the insertion experiment.

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
    if mode == "fixed":
        scored = _score_cells(cells[["encoder", "dataset"]], normalise(cells[list(DIMENSIONS)].to_numpy(), frame.anchors), frame)
    else:
        p = _cohort_normalise(cells)
        scored = _score_cells(cells[["encoder", "dataset"]], p, ReferenceFrame(
            reference=cells[["encoder", "dataset"]].assign(**dict(zip(NORMALISED, p.T)))))
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
