"""Tables the book shows: inventories of the data and the encoders, and the per-dimension summaries.

Each function takes a profile or the tidy results table (:mod:`crsrepro.results`) and returns a
:class:`pandas.DataFrame` ready to display; the notebooks call one function per table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from crsrepro.profiles import Profile


def data_inventory(profile: Profile, *, manifest_dir=None) -> pd.DataFrame:
    """One row per dataset: task, classes, images, groups, and the size of each split."""
    from crsrepro.data import prepare_dataset

    rows = []
    for name in profile.all_datasets():
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        counts = table["split"].value_counts()
        rows.append({"dataset": name, "task": table.attrs["task"], "classes or labels": len(table.attrs["label_names"]),
                     "images": len(table), "groups": table["group"].nunique(),
                     **{split: int(counts.get(split, 0)) for split in ("train", "val", "test", "transfer")}})
    return pd.DataFrame(rows).set_index("dataset")


def label_prevalence(profile: Profile, *, manifest_dir=None) -> pd.DataFrame:
    """The share of positives per class or label in each dataset (the class imbalance a probe faces)."""
    from crsrepro.data import label_matrix, prepare_dataset

    columns = {}
    for name in profile.all_datasets():
        table = prepare_dataset(profile, name, manifest_dir=manifest_dir)
        y = label_matrix(table)
        names = table.attrs["label_names"]
        if table.attrs["task"] == "multiclass":
            prevalence = np.bincount(y, minlength=len(names)) / len(y)
        else:
            prevalence = np.nanmean(y, axis=0)
        columns[name] = pd.Series(prevalence, index=names)
    return pd.DataFrame(columns).round(3)


def encoder_inventory(profile: Profile) -> pd.DataFrame:
    """The frozen spec of every encoder in the panel (DESIGN.md section 4)."""
    from crsrepro.encoders import get_spec

    rows = []
    for encoder_id in profile.encoders:
        spec = get_spec(encoder_id)
        rows.append({"encoder": spec.id, "family": spec.family, "loader": spec.loader,
                     "architecture": spec.architecture, "input": spec.input_size,
                     "interpolation": spec.interpolation, "pooling": spec.pooling, "dim": spec.embed_dim,
                     "layer taps": ", ".join(spec.layer_taps), "licence": spec.licence,
                     "excluded from": ", ".join(spec.excluded_datasets) or "-"})
    return pd.DataFrame(rows).set_index("encoder")


def primary_runs(results: pd.DataFrame, *, condition: str | None = "clean",
                 label_fraction: float | None = 1.0) -> pd.DataFrame:
    """The wide per-run rows of the primary protocol: frozen linear probe, final layer, no recalibration.

    ``condition`` and ``label_fraction`` select runs; None keeps every condition or fraction.
    """
    from crsrepro.results import runs_table

    runs = runs_table(results)
    keep = ((runs["probe"] == "linear") & (runs["regime"] == "frozen") & (runs["layer"] == "final")
            & (runs["recalibrator"] == "none"))
    if condition is not None:
        keep &= runs["condition"] == condition
    if label_fraction is not None:
        keep &= np.isclose(runs["label_fraction"], label_fraction)
    return runs[keep]


#: Metrics where lower is better; every other metric ranks higher-is-better.
LOWER_IS_BETTER = {"ece", "classwise_ece"}


def metric_table(results: pd.DataFrame, metric: str = "auroc") -> pd.DataFrame:
    """A metric of the primary protocol per encoder and dataset (mean ± sd over seeds), ranked by
    its mean over the encoder's available cells; missing cells are never imputed.

    ``metric="auroc"`` is the paper's discrimination ranking, ``metric="ece"`` its calibration one.
    """
    runs = primary_runs(results)
    stats = runs.groupby(["encoder", "dataset"])[metric].agg(["mean", "std"])
    mean = stats["mean"].unstack("dataset")
    table = mean.map(lambda v: f"{v:.3f}" if pd.notna(v) else "-")
    sd = stats["std"].unstack("dataset")
    table = table.where(sd.isna(), table + " ± " + sd.map(lambda v: f"{v:.3f}"))
    table.insert(0, "family", runs.drop_duplicates("encoder").set_index("encoder")["family"])
    aggregate = mean.mean(axis=1)
    table[f"mean {metric.upper()}"] = aggregate.map(lambda v: f"{v:.3f}")
    table["rank"] = aggregate.rank(ascending=metric in LOWER_IS_BETTER, method="min").astype(int)
    table.columns.name = None
    return table.sort_values("rank")


def scalars(result, **extra) -> pd.DataFrame:
    """The scalar fields of an analysis result (a dataclass from :mod:`crsrepro.stats`) as a table.

    >>> from crsrepro.stats import rank_agreement
    >>> scalars(rank_agreement({"a": 3, "b": 2, "c": 1}, {"a": 1, "b": 2, "c": 3})).loc["kendall_tau", "value"]
    -1.0
    """
    values = {name: value for name, value in vars(result).items()
              if isinstance(value, (int, float, np.integer, np.floating, str, bool))}
    values.update(extra)
    return pd.DataFrame({"value": pd.Series(values, dtype=object)})
