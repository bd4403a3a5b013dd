"""Grouped stratified splits, frozen manifests (hash + staleness) and nested label subsets (DESIGN.md section 3)."""

import numpy as np
import pandas as pd
import pytest

from crsrepro.data.manifests import label_subsets, load_or_create_manifest, make_splits, manifest_hash, seed_split_hash
from crsrepro.core.errors import DataError

LABELS = ["a", "b", "c", "rare"]


def multilabel_frame(n_groups=300, seed=0):
    rng = np.random.default_rng(seed)
    per_group = rng.integers(1, 5, n_groups)
    group = np.repeat([f"patient{g:05d}" for g in range(n_groups)], per_group)
    n = len(group)
    y = (rng.random((n, 4)) < [0.5, 0.2, 0.08, 0.015]).astype(float)
    y[rng.random((n, 4)) < 0.1] = np.nan   # masked (uncertain, u_policy=ignore)
    df = pd.DataFrame(y, columns=LABELS)
    df.insert(0, "group", group)
    df.insert(0, "image_id", [f"img{i:06d}" for i in range(n)])
    df.attrs.update(task="multilabel", label_names=LABELS)
    return df


def test_groups_never_cross_splits_and_every_label_reaches_every_split():
    df = multilabel_frame()
    split = make_splits(df, seed=3, task="multilabel", label_names=LABELS)
    assert split.index.equals(df.index)
    assert split.groupby(df["group"]).nunique().max() == 1
    shares = split.value_counts(normalize=True)
    assert abs(shares["train"] - 0.7) < 0.03 and abs(shares["val"] - 0.1) < 0.03 and abs(shares["test"] - 0.2) < 0.03
    positives = (df[LABELS] == 1).groupby(split).sum()
    assert (positives > 0).all().all(), positives
    # stratified: each label's share in test stays near 20 %
    test_share = positives.loc["test"] / positives.sum()
    assert ((test_share - 0.2).abs() < 0.08).all(), test_share


def test_split_is_a_function_of_groups_and_seed_not_of_row_order():
    df = multilabel_frame()
    a = make_splits(df, seed=1, task="multilabel", label_names=LABELS)
    shuffled = df.sample(frac=1.0, random_state=7)
    b = make_splits(shuffled, seed=1, task="multilabel", label_names=LABELS)
    assert (a == b.loc[a.index]).all()
    c = make_splits(df, seed=2, task="multilabel", label_names=LABELS)
    assert (a != c).any()


def test_multiclass_split_with_a_rare_class_of_three_groups():
    df = pd.DataFrame({"group": [f"g{i}" for i in range(60)], "label": [0] * 57 + [1] * 3})
    split = make_splits(df, seed=0, task="multiclass", label_names=["common", "rare"])
    assert sorted(split[df["label"] == 1]) == ["test", "train", "val"]


def test_bad_arguments():
    df = multilabel_frame(10)
    with pytest.raises(ValueError, match="3 positive shares"):
        make_splits(df, seed=0, fractions=(0.8, 0.3, 0.1), task="multilabel", label_names=LABELS)
    with pytest.raises(ValueError, match="task must be"):
        make_splits(df, seed=0, task="regression", label_names=LABELS)


# ---------------------------------------------------------------- manifests
def test_manifest_written_once_then_verified(tmp_path):
    df = multilabel_frame(50)
    first = load_or_create_manifest(df, dataset="chexpert", manifests_name="smoke", manifest_dir=tmp_path, seed=0)
    path = tmp_path / "chexpert_smoke.csv"
    sha = (tmp_path / "chexpert_smoke.csv.sha256").read_text()
    assert sha == f"{manifest_hash(path)}  chexpert_smoke.csv\n"
    assert list(first.columns) == ["image_id", "group", "split", "seed_0"] and first["image_id"].is_monotonic_increasing
    # a later call reads the frozen file, whatever seed it is given
    again = load_or_create_manifest(df, dataset="chexpert", manifests_name="smoke", manifest_dir=tmp_path, seed=99)
    pd.testing.assert_frame_equal(first, again)
    load_or_create_manifest(df, dataset="chexpert", manifests_name="", manifest_dir=tmp_path, seed=0)
    assert (tmp_path / "chexpert.csv").is_file() and (tmp_path / "chexpert.csv.sha256").is_file()


def test_tampered_manifest_is_detected(tmp_path):
    df = multilabel_frame(50)
    load_or_create_manifest(df, dataset="isic2019", manifests_name="demo", manifest_dir=tmp_path, seed=0)
    path = tmp_path / "isic2019_demo.csv"
    text = path.read_text()
    path.write_text(text.replace(",pool,", ",test,", 1))
    with pytest.raises(DataError, match=r"isic2019_demo.csv: SHA-256 .* does not match .*delete .* to rebuild"):
        load_or_create_manifest(df, dataset="isic2019", manifests_name="demo", manifest_dir=tmp_path, seed=0)
    path.write_text(text)
    (tmp_path / "isic2019_demo.csv.sha256").unlink()
    with pytest.raises(DataError, match=r"checksum file isic2019_demo.csv.sha256 is missing"):
        load_or_create_manifest(df, dataset="isic2019", manifests_name="demo", manifest_dir=tmp_path, seed=0)


def test_stale_manifest_is_detected(tmp_path):
    df = multilabel_frame(50)
    load_or_create_manifest(df, dataset="aptos2019", manifests_name="demo", manifest_dir=tmp_path, seed=0)
    grown = pd.concat([df, df.iloc[[0]].assign(image_id="img999999")], ignore_index=True)
    grown.attrs = df.attrs
    with pytest.raises(DataError, match=r"stale manifest: 1 images of the data are not in it \(e.g. \['img999999'\]\)"):
        load_or_create_manifest(grown, dataset="aptos2019", manifests_name="demo", manifest_dir=tmp_path, seed=0)
    regrouped = df.assign(group=np.where(df["image_id"] == "img000000", "patientXX", df["group"]))
    with pytest.raises(DataError, match=r"stale manifest: line 2: image img000000 is in group patient00000"):
        load_or_create_manifest(regrouped, dataset="aptos2019", manifests_name="demo", manifest_dir=tmp_path, seed=0)


# ---------------------------------------------------------------- label subsets
def test_label_subsets_nested_stratified_with_positives_multilabel():
    y = multilabel_frame(400)[LABELS].to_numpy()
    fractions = [0.01, 0.05, 0.10, 0.25, 1.0]
    subsets = label_subsets(y, fractions=fractions, seed=0, task="multilabel")
    assert list(subsets) == fractions
    np.testing.assert_array_equal(subsets[1.0], np.arange(len(y)))
    for small, large in zip(fractions, fractions[1:]):
        assert np.isin(subsets[small], subsets[large]).all()
    for f, idx in subsets.items():
        assert len(idx) == len(set(idx)) >= np.ceil(f * len(y))
        assert ((y[idx] == 1).sum(axis=0) >= 1).all(), f
    again = label_subsets(y, fractions=fractions, seed=0, task="multilabel")
    assert all(np.array_equal(again[f], subsets[f]) for f in fractions)
    other = label_subsets(y, fractions=fractions, seed=1, task="multilabel")
    assert not np.array_equal(other[0.10], subsets[0.10])


def test_label_subsets_multiclass_keep_proportions():
    rng = np.random.default_rng(0)
    y = rng.choice(5, size=3000, p=[0.5, 0.1, 0.27, 0.05, 0.08])
    subsets = label_subsets(y, fractions=[0.01, 0.1, 0.25, 1.0], seed=4, task="multiclass")
    assert set(y[subsets[0.01]]) == {0, 1, 2, 3, 4}
    full = np.bincount(y) / len(y)
    for f in (0.1, 0.25):
        share = np.bincount(y[subsets[f]], minlength=5) / len(subsets[f])
        assert np.abs(share - full).max() < 0.01, (f, share, full)


def test_label_subsets_need_a_positive_per_label():
    y = np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, np.nan]])
    with pytest.raises(DataError, match="no positive example of label index 1"):
        label_subsets(y, fractions=[0.5, 1.0], seed=0, task="multilabel")
    with pytest.raises(ValueError, match=r"fractions must lie in \(0, 1\]"):
        label_subsets(np.array([0, 1]), fractions=[0.0], seed=0, task="multiclass")


def test_each_run_seed_has_its_own_train_val_over_one_fixed_test_split(tmp_path):
    """DESIGN.md section 10: the test split is fixed; each run seed draws its own grouped train / val partition."""
    df = multilabel_frame(200)
    manifest = load_or_create_manifest(df, dataset="chexpert", manifests_name="smoke", manifest_dir=tmp_path, seed=0,
                                       run_seeds=(0, 1, 2))
    test = manifest["split"] == "test"
    for s in (0, 1, 2):
        assert (manifest.loc[test, f"seed_{s}"] == "test").all()
        assert set(manifest.loc[~test, f"seed_{s}"]) == {"train", "val"}
        assert manifest.groupby("group")[f"seed_{s}"].nunique().eq(1).all()  # grouped
    assert (manifest["seed_0"] != manifest["seed_1"]).any() and (manifest["seed_1"] != manifest["seed_2"]).any()
    assert seed_split_hash(manifest, 0) != seed_split_hash(manifest, 1)
    share = (manifest.loc[~test, "seed_0"] == "val").mean()
    assert 0.08 < share < 0.2
    with pytest.raises(DataError, match="seed_3"):  # a run seed the frozen manifest lacks
        load_or_create_manifest(df, dataset="chexpert", manifests_name="smoke", manifest_dir=tmp_path, seed=0,
                                run_seeds=(0, 3))
