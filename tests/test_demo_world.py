"""The demo world: real layouts, determinism, idempotence, speed, non-trivial difficulty (DESIGN.md section 3), and
patient metadata with a planted subgroup effect (DESIGN.md section 14)."""

import hashlib
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.ndimage import gaussian_filter
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from crsrepro.data import label_matrix, load_dataset, prepare_dataset
from crsrepro.data.demo_world import MARKER, OLDER_FROM, generate_demo_world, sample_images
from crsrepro.profiles import load_profile

SMOKE = load_profile("smoke")
WORLD = dict(n_images=SMOKE.demo_world.n_images, image_size=SMOKE.demo_world.image_size, seed=0, progress=False)


def _digest(root):
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MARKER)
    return hashlib.sha256(b"".join(p.relative_to(root).as_posix().encode() + p.read_bytes() for p in files)).hexdigest()


@pytest.fixture(scope="module")
def smoke_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    start = time.process_time()
    generate_demo_world(root, **WORLD)
    return root, time.process_time() - start


def test_smoke_world_is_fast_and_read_by_the_real_loaders(smoke_world):
    root, seconds = smoke_world
    assert seconds < 15, f"smoke world took {seconds:.1f} s of CPU"
    assert (root / "chexpert/CheXpert-v1.0-small/valid.csv").is_file()
    assert (root / "mimic_cxr/mimic-cxr-2.0.0-chexpert.csv.gz").is_file()
    for name, n in WORLD["n_images"].items():
        df = load_dataset(name, root / name)
        assert len(df) == n, name
        y = label_matrix(df)
        if y.ndim == 1:
            assert np.bincount(y).argmax() == (1 if name == "isic2019" else 0)   # NV / grade 0 dominate
            assert len(np.unique(y)) == len(df.attrs["label_names"])
        else:
            assert np.isnan(y).any() and ((y == 1).sum(axis=0) > 0).all()      # uncertain labels, every label
    isic = load_dataset("isic2019", root / "isic2019")
    assert (isic["group"] == isic["image_id"]).any() and (isic["group"] != isic["image_id"]).any()
    assert Image.open(isic["path"].iloc[0]).size == (64, 64)


def test_same_seed_same_bytes_and_idempotent(smoke_world, tmp_path):
    root, _ = smoke_world
    before = (root / MARKER).stat().st_mtime_ns
    generate_demo_world(root, **WORLD)                # same parameters: skipped
    assert (root / MARKER).stat().st_mtime_ns == before
    generate_demo_world(tmp_path / "again", **WORLD)   # every csv, csv.gz, jpg and png: the same bytes
    assert _digest(tmp_path / "again") == _digest(root)
    small = dict(WORLD, n_images={"aptos2019": 30, "mimic_cxr": 20})
    generate_demo_world(tmp_path / "a", **small)
    digest = _digest(tmp_path / "a")
    generate_demo_world(tmp_path / "a", **dict(small, seed=1))    # new parameters: rewritten
    assert _digest(tmp_path / "a") != digest
    assert not (tmp_path / "a" / "isic2019").exists()


def test_prepare_dataset_splits_and_transfer_set(smoke_world, tmp_path, monkeypatch):
    root, _ = smoke_world
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    profile = load_profile("smoke", overrides={"data": {"root": str(root)}})
    chex = prepare_dataset(profile, "chexpert", manifest_dir=tmp_path / "m", progress=False)
    assert chex["image_id"].is_monotonic_increasing and set(chex["split"]) == {"pool", "test"}
    assert set(chex["seed_0"]) == {"train", "val", "test"} and set(chex["seed_1"]) == {"train", "val", "test"}
    assert chex.groupby("group")["seed_0"].nunique().max() == 1
    positives = (chex[chex.attrs["label_names"]] == 1).groupby(chex["seed_0"]).sum()
    assert (positives > 0).all().all()
    assert (tmp_path / "m" / "chexpert_smoke.csv.sha256").is_file()
    mimic = prepare_dataset(profile, "mimic_cxr", manifest_dir=tmp_path / "m", progress=False)
    assert set(mimic["split"]) == {"transfer"} and (mimic["source_split"] == "test").all()
    assert not (tmp_path / "m" / "mimic_cxr_smoke.csv").exists()


def _pixels(images, side):
    return np.stack([np.asarray(Image.fromarray(im).resize((side, side), Image.BILINEAR), np.float32).ravel() / 255
                     for im in images])


def _cv_macro_auroc(X, y):
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=0.05, max_iter=300))
    if y.ndim == 1:
        proba = cross_val_predict(probe, X, y, cv=3, method="predict_proba")
        return roc_auc_score(y, proba, multi_class="ovr", average="macro")
    return np.mean([roc_auc_score(y[:, j], cross_val_predict(probe, X, y[:, j], cv=3, method="predict_proba")[:, 1])
                    for j in range(y.shape[1])])


@pytest.mark.slow
@pytest.mark.parametrize("dataset,n,size,side", [("isic2019", 400, 48, 10), ("aptos2019", 600, 64, 12),
                                                ("chexpert", 400, 48, 8)])
def test_pixel_probe_is_informative_but_not_perfect(dataset, n, size, side):
    """A logistic regression on downsampled pixels: clearly better than chance, clearly short of perfect."""
    images, y = sample_images(dataset, n, seed=0, image_size=size)
    auroc = _cv_macro_auroc(_pixels(images, side), y)
    assert 0.6 < auroc < 0.98, auroc


def test_second_hospital_differs_and_costs_auroc():
    train, y_train = sample_images("chexpert", 300, seed=0, image_size=48)
    same, y_same = sample_images("chexpert", 300, seed=1, image_size=48)
    other, y_other = sample_images("mimic_cxr", 300, seed=1, image_size=48)
    assert abs(np.mean(other) - np.mean(same)) > 3            # another intensity curve and borders
    X, X_same, X_other = _pixels(train, 8), _pixels(same, 8), _pixels(other, 8)
    labels = [j for j in range(14) if 0 < y_train[:, j].mean() < 1]
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=0.05, max_iter=300))
    drop = []
    for j in labels:
        probe.fit(X, y_train[:, j])
        drop.append(roc_auc_score(y_same[:, j], probe.predict_proba(X_same)[:, 1])
                    - roc_auc_score(y_other[:, j], probe.predict_proba(X_other)[:, 1]))
    assert np.mean(drop) > 0.03, np.mean(drop)


def test_sample_images_contract():
    images, y = sample_images("mimic_cxr", 3, seed=5, image_size=32)
    assert len(images) == 3 and images[0].shape == (32, 32, 3) and images[0].dtype == np.uint8
    assert y.shape == (3, 14) and set(np.unique(y)) <= {0.0, 1.0}
    again, _ = sample_images("mimic_cxr", 3, seed=5, image_size=32)
    assert all(np.array_equal(a, b) for a, b in zip(images, again))
    with pytest.raises(ValueError, match="unknown dataset"):
        sample_images("imagenet", 1, seed=0, image_size=32)


REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "metadata"


def _vocabulary(path, columns):
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    return {c: set(frame[c]) for c in columns}


def test_metadata_in_the_release_columns_and_vocabulary(smoke_world):
    root, _ = smoke_world
    isic = pd.read_csv(root / "isic2019/ISIC_2019_Training_Metadata.csv", dtype=str, keep_default_na=False)
    assert list(isic.columns) == ["image", "age_approx", "anatom_site_general", "lesion_id", "sex"]
    assert isic.groupby(isic["lesion_id"].replace("", np.nan))[["age_approx", "sex", "anatom_site_general"]].nunique().max().max() == 1
    chex = pd.read_csv(root / "chexpert/CheXpert-v1.0-small/train.csv")
    assert set(chex["Sex"]) == {"Male", "Female"} and chex["Age"].between(18, 90).all()
    assert chex.groupby(chex["Path"].str.extract(r"(patient\d+)")[0])["Age"].nunique().max() == 1
    real = REALDATA / "isic2019" / "ISIC_2019_Training_Metadata.csv"
    if not real.is_file():
        pytest.skip(f"{real} is absent: the vocabulary is checked against the real file only")
    columns = ["age_approx", "anatom_site_general", "sex"]
    vocabulary = _vocabulary(real, columns)
    for c in columns:
        assert set(isic[c]) <= vocabulary[c], (c, set(isic[c]) - vocabulary[c])
    assert list(pd.read_csv(REALDATA / "chexpert" / "valid.csv", nrows=1).columns[:3]) == ["Path", "Sex", "Age"]


def test_older_patients_images_are_noisier_and_flatter(smoke_world):
    """The planted subgroup effect (DESIGN.md section 14): patients aged >= OLDER_FROM are imaged worse."""
    root, _ = smoke_world
    chex = pd.read_csv(root / "chexpert/CheXpert-v1.0-small/train.csv")
    chex = chex[chex["Frontal/Lateral"] == "Frontal"]
    stats = []
    for path in chex["Path"]:
        a = np.asarray(Image.open(root / "chexpert" / path), np.float32) / 255
        stats.append((a.std(), (a - gaussian_filter(a, 1)).std()))
    contrast, noise = np.array(stats).T
    older = (chex["Age"] >= OLDER_FROM).to_numpy()
    assert 0 < older.mean() < 1
    assert contrast[older].mean() < 0.8 * contrast[~older].mean()
    assert noise[older].mean() > 1.2 * noise[~older].mean()
