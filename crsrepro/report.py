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
    datasets = list(profile.datasets) + [t for t in profile.transfer.values() if t not in profile.datasets]
    for name in datasets:
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
    datasets = list(profile.datasets) + list(profile.transfer.values())
    for name in datasets:
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


def primary_runs(results: pd.DataFrame, *, condition: str = "clean", label_fraction: float = 1.0) -> pd.DataFrame:
    """The wide per-run rows of the primary protocol: frozen linear probe, final layer, no recalibration."""
    from crsrepro.results import runs_table

    runs = runs_table(results)
    keep = ((runs["probe"] == "linear") & (runs["regime"] == "frozen") & (runs["layer"] == "final")
            & (runs["recalibrator"] == "none") & (runs["condition"] == condition)
            & np.isclose(runs["label_fraction"], label_fraction))
    return runs[keep]


def discrimination_table(results: pd.DataFrame) -> pd.DataFrame:
    """Clean full-label macro AUROC per encoder and dataset (mean ± sd over seeds), ranked by the mean
    over the encoder's available cells (paper section "Results": the AUROC ranking)."""
    runs = primary_runs(results)
    stats = runs.groupby(["encoder", "dataset"])["auroc"].agg(["mean", "std"])
    mean = stats["mean"].unstack("dataset")
    table = mean.map(lambda v: f"{v:.3f}" if pd.notna(v) else "-")
    sd = stats["std"].unstack("dataset")
    table = table.where(sd.isna(), table + " ± " + sd.map(lambda v: f"{v:.3f}"))
    family = runs.drop_duplicates("encoder").set_index("encoder")["family"]
    table.insert(0, "family", family)
    aggregate = mean.mean(axis=1)  # over available cells only; missing cells are never imputed
    table["mean AUROC"] = aggregate.map(lambda v: f"{v:.3f}")
    table["rank"] = aggregate.rank(ascending=False, method="min").astype(int)
    table.columns.name = None
    return table.sort_values("rank")
