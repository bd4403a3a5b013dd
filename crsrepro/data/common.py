"""Helpers shared by the dataset loaders: csv reading, column checks, label parsing, path checks,
image sizes.

Every check raises :class:`~crsrepro.core.errors.DataError` with the file and the csv line (the header is
line 1) so that a user can open the file and fix it (DESIGN.md section 3, "Bad input").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from PIL import Image, UnidentifiedImageError

from crsrepro.core.errors import DataError
from crsrepro.core.io import sha256_file
from crsrepro.core.vocab import IMAGE_POLICIES, U_POLICIES

logger = logging.getLogger(__name__)

# CheXpert's 14 labels in the order of the columns of CheXpert's train.csv; MIMIC-CXR uses the same
# names (in alphabetical order in its own csv, reordered to this order by the MIMIC loader).
CHEXPERT_LABELS = [
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion",
    "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
    "Pleural Other", "Fracture", "Support Devices",
]
MIN_IMAGE_SIDE = 32
"""An image whose shorter side is below this many pixels is logged as too small by the loaders
(:func:`log_small_images`) and flagged by ``crsrepro quality-check`` **[ours]**: the encoders see
224 px or more, so such an image (a thumbnail, a 1x1 placeholder) is blown up many times and holds
no detail at that scale. It is still read: a warning, not an error."""


def require_file(path: Path, what: str) -> Path:
    """Return ``path`` if it is a file, else raise a DataError that says what was expected there."""
    if not Path(path).is_file():
        raise DataError(f"{path}: file not found (expected {what})")
    return Path(path)


def read_csv(path: Path, columns: list[str], what: str) -> pd.DataFrame:
    """Read a release csv (plain or ``.gz``) as strings; blanks stay ``""``; check ``columns`` exist."""
    require_file(path, what)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read as a csv ({exc})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing} (found {list(df.columns)})")
    if df.empty:
        raise DataError(f"{path}: has a header but no rows")
    return df


def csv_line(row_index: int) -> int:
    """The 1-based line of a 0-based data row in a csv with a one-line header."""
    return int(row_index) + 2


def parse_chexpert_labels(df: pd.DataFrame, label_names: list[str], *, path: Path, u_policy: str,
                          rows=None) -> pd.DataFrame:
    """Turn CheXpert-style label columns (``1``, ``0``, ``-1``, blank) into floats.

    A blank is 0 (the labeller did not mention the finding). An uncertain ``-1`` follows ``u_policy``
    (DESIGN.md section 3, [ours]): ``ignore`` masks it (NaN), ``ones`` makes it 1, ``zeros`` makes it 0.
    Any other value raises a DataError naming the file, line, column and value (``rows``: as in
    :func:`check_rows`).
    """
    if u_policy not in U_POLICIES:
        raise ValueError(f"u_policy must be one of {U_POLICIES}, got {u_policy!r}")
    uncertain = {"ignore": np.nan, "ones": 1.0, "zeros": 0.0}[u_policy]
    out = pd.DataFrame(index=df.index)
    for name in label_names:
        raw = df[name].str.strip()
        values = pd.to_numeric(raw.where(raw != ""), errors="coerce")
        ok = (raw == "") | values.isin([1.0, 0.0, -1.0])
        check_rows(ok, path, lambda i: f"column {name!r} has value {raw.iloc[i]!r} (expected 1, 0, -1 or blank)",
                   rows=rows)
        out[name] = values.fillna(0.0).replace(-1.0, uncertain).astype(float)
    n_uncertain = int(sum((df[name].str.strip().isin(["-1", "-1.0"])).sum() for name in label_names))
    logger.info("%s: %d uncertain (-1) labels -> u_policy=%s", path, n_uncertain, u_policy)
    return out


def check_rows(ok, path: Path, describe, *, rows=None) -> None:
    """Raise a DataError at the first row where ``ok`` is False.

    ``describe(i)`` says what is wrong with row ``i`` (a position in ``ok``); ``rows`` maps positions
    to 0-based data rows of the csv when the frame was filtered (default: the same positions).
    """
    ok = np.asarray(ok, dtype=bool)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        row = i if rows is None else int(np.asarray(rows)[i])
        raise DataError(f"{path}: line {csv_line(row)}: {describe(i)}")


def check_unique(ids: pd.Series, path: Path, what: str) -> None:
    """Raise a DataError at the first repeated id."""
    check_rows(~ids.duplicated().to_numpy(), path, lambda i: f"{what} {ids.iloc[i]} is listed twice")


def select_images(paths: pd.Series, *, csv_path: Path, images: str = "all", rows=None) -> np.ndarray:
    """Which listed images to keep: a boolean mask over ``paths``.

    ``images="all"`` (the default) keeps every row and raises a DataError for the first image file
    that does not exist, naming the csv line and saying how many are missing. ``images="present-only"``
    [ours] keeps the rows whose file exists and logs how many were left out, for a user who has
    downloaded only part of a release (for example some of NIH ChestX-ray14's 12 archives); it still
    raises when none is present. ``rows``: as in :func:`check_rows`.
    """
    if images not in IMAGE_POLICIES:
        raise ValueError(f"images must be one of {IMAGE_POLICIES}, got {images!r}")
    exists = np.fromiter((os.path.isfile(p) for p in paths), dtype=bool, count=len(paths))
    if images == "all":
        check_rows(exists, csv_path, rows=rows, describe=lambda i: (
            f"image file {paths.iloc[i]} does not exist ({int((~exists).sum())} of {len(paths)} listed images "
            f"are missing); images='present-only' reads the ones that exist"))
    else:
        log_filtered(csv_path, int((~exists).sum()), len(paths),
                     "listed images whose file is absent (images='present-only')")
        if not exists.any():
            raise DataError(f"{csv_path}: none of its {len(paths)} listed image files exists")
    log_small_images(paths[exists], what=csv_path)
    return exists


def log_small_images(paths, *, what, min_side: int = MIN_IMAGE_SIDE, n_named: int = 5) -> int:
    """Log a warning naming the images of ``paths`` whose shorter side is below ``min_side`` pixels
    (:data:`MIN_IMAGE_SIDE`); returns how many there are.

    Only each file's header is read (its size). A file whose header cannot be read is left to
    :func:`crsrepro.data.read_image`, which names it when the image is decoded.
    """
    small = []
    for path in paths:
        try:
            with Image.open(path) as image:
                side = min(image.size)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
            continue
        if side < min_side:
            small.append(f"{path} ({side} px)")
    if small:
        logger.warning("%s: %d of %d images have a side shorter than %d px (MIN_IMAGE_SIDE), e.g. %s; they are "
                       "read, but hold no detail at the encoders' scale", what, len(small), len(paths), min_side,
                       ", ".join(small[:n_named]))
    return len(small)


def drop_byte_duplicates(df: pd.DataFrame, *, what: str) -> pd.DataFrame:
    """Keep one row per distinct image file content (SHA-256 of the bytes), the first in ``df``'s order.

    Some releases hold the same image file under two ids (ISIC 2017, Kermany); left in, a copy can land
    in train and test at once. The later copies are left out and counted in the log, and
    ``attrs["duplicates"]`` maps each dropped image_id to the kept one. Copies with different labels
    raise a DataError naming both files (no rule can choose between them).
    """
    digest = pd.Series([sha256_file(p) for p in df["path"]], index=df.index)
    first = df.groupby(digest, sort=False)["image_id"].transform("first")
    first_label = df.groupby(digest, sort=False)["label"].transform("first")
    conflict = np.flatnonzero(df["label"].to_numpy() != first_label.to_numpy())
    if len(conflict):
        i = conflict[0]
        raise DataError(f"{df['path'].iloc[i]}: byte-identical to the image {first.iloc[i]} but labelled "
                        f"{df['label'].iloc[i]} instead of {first_label.iloc[i]}")
    duplicate = digest.duplicated().to_numpy()
    dropped = dict(zip(df["image_id"][duplicate], first[duplicate]))
    logger.info("%s: left out %d of %d images: byte-identical copies of an earlier image (%d distinct images copied)",
                what, len(dropped), len(df), len(set(dropped.values())))
    out = df[~duplicate].reset_index(drop=True)
    out.attrs["duplicates"] = dropped
    return out


def log_filtered(path: Path, n_removed: int, n_total: int, reason: str) -> None:
    """Log what a loader leaves out on purpose (never silently)."""
    logger.info("%s: left out %d of %d rows: %s", path, n_removed, n_total, reason)


# --------------------------------------------------------------------------- subgroup metadata (DESIGN.md section 14)

UNKNOWN = "unknown"
"""The value of a subgroup column where the release gives none (blank, unrecognised, or no such column)."""
AGE_BINS = (40, 60, 80)
"""The edges of :func:`age_groups` in years **[ours]**: ``<40``, ``40-59``, ``60-79``, ``80+``."""
MAX_AGE = 120
"""An age above this many years is a data-entry error and its group is ``unknown`` **[ours]**."""
SEX_VALUES = {"male": "male", "m": "male", "female": "female", "f": "female"}
"""The spellings of sex in the releases (ISIC ``male``, CheXpert ``Male``, NIH ``M``), lower-cased."""


def age_group_names(bins=AGE_BINS) -> list[str]:
    """The names of the age groups of ``bins``, youngest first.

    >>> age_group_names()
    ['<40', '40-59', '60-79', '80+']
    """
    edges = list(bins)
    return [f"<{edges[0]}"] + [f"{lo}-{hi - 1}" for lo, hi in zip(edges[:-1], edges[1:])] + [f"{edges[-1]}+"]


def age_groups(age, *, bins=AGE_BINS) -> np.ndarray:
    """The age group of each age in years: ``<40``, ``40-59``, ``60-79``, ``80+`` with the default
    :data:`AGE_BINS` **[ours]**; NaN, negative or above :data:`MAX_AGE` is ``unknown``.

    >>> age_groups([5, 40, 59.5, 60, 85, float("nan")]).tolist()
    ['<40', '40-59', '40-59', '60-79', '80+', 'unknown']
    """
    age = np.asarray(pd.to_numeric(pd.Series(np.asarray(age, dtype=object)), errors="coerce"), float)
    edges, names = list(bins), age_group_names(bins)
    index = np.searchsorted(edges, age, side="right")
    known = np.isfinite(age) & (age >= 0) & (age <= MAX_AGE)
    return np.where(known, np.asarray(names, dtype=object)[np.clip(index, 0, len(names) - 1)], UNKNOWN).astype(object)


def subgroup_columns(raw: pd.DataFrame, path: Path, *, sex: str | None = None, age: str | None = None,
                     site: str | None = None, view: str | None = None) -> dict[str, np.ndarray]:
    """The subgroup columns of a release csv, one row per row of ``raw`` (beyond the paper, DESIGN.md section 14).

    Each keyword names the release's column for that attribute (e.g. ``sex="Sex", age="Age"`` for
    CheXpert). The result maps ``sex`` (``male`` / ``female``), ``age_group`` (:func:`age_groups` of
    the age in years), ``site`` and ``view`` (the release's values, stripped), for the attributes
    given, to one value per row of ``raw``. A blank or unrecognised value is ``unknown``; a release
    column that is absent (an older or partial csv) makes the whole attribute ``unknown``. Both are
    counted in the log, never an error: metadata is descriptive and no run depends on it.
    """
    out = {}
    for name, column in (("sex", sex), ("age_group", age), ("site", site), ("view", view)):
        if column is None:
            continue
        if column not in raw.columns:
            logger.info("%s: no column %r: %s is %s for all %d rows", path, column, name, UNKNOWN, len(raw))
            out[name] = np.full(len(raw), UNKNOWN, dtype=object)
            continue
        values = raw[column].astype(str).str.strip()
        if name == "sex":
            values = values.str.lower().map(SEX_VALUES).fillna(UNKNOWN)
        elif name == "age_group":
            values = pd.Series(age_groups(values), index=raw.index)
        else:
            values = values.where(values != "", UNKNOWN)
        out[name] = values.to_numpy(dtype=object)
        n_unknown = int(np.sum(out[name] == UNKNOWN))
        if n_unknown:
            logger.info("%s: column %r: %s is %s for %d of %d rows", path, column, name, UNKNOWN, n_unknown, len(raw))
    return out
