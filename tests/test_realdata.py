"""The loaders on real release files (DESIGN.md section 3): the counts of ``../shared/realdata/README.md``.

The three image datasets are read as they are; the paper's four from their real label files, with
placeholder images (symbolic links to one tiny image; hard links would hit ext4's 65,000-link limit
on CheXpert's 191,229 images) built in tmp_path at the listed paths. Skipped when the folder is
absent (set ``CRSREPRO_REALDATA`` to point elsewhere).
"""

import gzip
import logging
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crsrepro.data import label_matrix, load_dataset
from crsrepro.data.common import CHEXPERT_LABELS
from crsrepro.data.isic2017 import SPLITS as ISIC2017_SPLITS
from crsrepro.data.label_maps import CHEXPERT_TO_NIH
from crsrepro.core.errors import DataError

REALDATA = Path(os.environ.get("CRSREPRO_REALDATA", Path(__file__).resolve().parents[1].parent / "shared" / "realdata"))
IMAGES, METADATA = REALDATA / "images", REALDATA / "metadata"
pytestmark = pytest.mark.skipif(not REALDATA.is_dir(), reason=f"real data not found at {REALDATA} (set CRSREPRO_REALDATA)")


def _placeholders(root: Path, relative_paths) -> None:
    """A tiny image at each path under ``root`` (symbolic links to one file)."""
    source = root / "placeholder.png"
    Image.new("L", (4, 4), 128).save(source)
    paths = sorted({str(p) for p in relative_paths})
    for folder in {os.path.dirname(p) for p in paths}:
        os.makedirs(root / folder, exist_ok=True)
    for p in paths:
        os.symlink(source, root / p)


def _counts_before_dedup(df: pd.DataFrame) -> dict:
    """(source_split, label) -> images, counting the dropped byte-identical copies with their kept twin."""
    kept = df.set_index("image_id")
    rows = [(s, lab) for s, lab in zip(df["source_split"], df["label"])]
    rows += [(split, kept.loc[twin, "label"]) for split, twin in
             ((_split_of_dropped(df, dropped), twin) for dropped, twin in df.attrs["duplicates"].items())]
    return dict(Counter((s, int(lab)) for s, lab in rows))


def _split_of_dropped(df: pd.DataFrame, image_id: str) -> str:
    if df.attrs["dataset"] == "kermany_cxr":
        return image_id.split("/")[0]
    return next(s for s, prefix in ISIC2017_SPLITS.items() if (Path(df.attrs["root"]) / f"{prefix}_Data" / f"{image_id}.jpg").exists())


# ---------------------------------------------------------------- ISIC 2017
def test_isic2017_counts_per_split_and_class_and_duplicates(caplog):
    with caplog.at_level(logging.INFO):
        df = load_dataset("isic2017", IMAGES / "isic2017")
    assert df.attrs["label_names"] == ["melanoma", "seborrheic_keratosis", "nevus"] and df.attrs["task"] == "multiclass"
    # the README's counts are the release's, before the six copies are dropped
    assert _counts_before_dedup(df) == {("train", 0): 374, ("train", 1): 254, ("train", 2): 1372,
                                        ("validation", 0): 30, ("validation", 1): 42, ("validation", 2): 78,
                                        ("test", 0): 117, ("test", 1): 90, ("test", 2): 393}
    duplicates = df.attrs["duplicates"]
    assert len(duplicates) == 6 and len(df) == 2750 - 6 and df["image_id"].is_unique
    kept_split = df.set_index("image_id")["source_split"]
    assert sum(_split_of_dropped(df, d) != kept_split[k] for d, k in duplicates.items()) == 4  # four across splits
    assert duplicates["ISIC_0012127"] == "ISIC_0012970"  # validation copy of a training image: the training one is kept
    assert "left out 6 of 2750 images: byte-identical copies" in caplog.text
    assert (df["group"] == df["image_id"]).all()
    assert df.loc[df["source_split"] == "train", "sex"].isin(["female", "male", "unknown"]).all()
    assert df.loc[df["source_split"] == "test", "age_approx"].isna().all()  # no test metadata csv in this copy
    assert all(os.path.isfile(p) for p in df["path"])


# ---------------------------------------------------------------- Kermany
def test_kermany_counts_per_split_and_class_and_duplicate_groups(caplog):
    with caplog.at_level(logging.INFO):
        df = load_dataset("kermany_cxr", IMAGES / "kermany")
    assert df.attrs["label_names"] == ["NORMAL", "BACTERIA", "VIRUS"]
    assert _counts_before_dedup(df) == {("train", 0): 1341, ("train", 1): 2530, ("train", 2): 1345,
                                        ("test", 0): 234, ("test", 1): 242, ("test", 2): 148}
    duplicates = df.attrs["duplicates"]
    assert len(set(duplicates.values())) == 30 and len(duplicates) == 32 and len(df) == 5840 - 32
    # every copy is in its twin's split and class folder
    assert all(d.rsplit("/", 1)[0] == k.rsplit("/", 1)[0] for d, k in duplicates.items())
    assert "left out 32 of 5840 images: byte-identical copies of an earlier image (30 distinct" in caplog.text
    groups = df.set_index("image_id")["group"]
    assert groups["train/NORMAL/NORMAL2-IM-0587-0001-0001"] == "NORMAL2-IM-0587"
    assert groups["train/PNEUMONIA/person1000_virus_1681"] == groups["train/PNEUMONIA/person1000_bacteria_2931"] == "person1000"
    two = load_dataset("kermany_cxr", IMAGES / "kermany", n_classes=2)
    assert two.attrs["label_names"] == ["NORMAL", "PNEUMONIA"]
    np.testing.assert_array_equal(two["label"], np.minimum(df["label"], 1))


def test_kermany_conflicting_copies_hidden_files_bad_name_and_missing_split(tmp_path, caplog):
    names = [f"chest_xray/{split}/{name}" for split in ("train", "test")
             for name in ("NORMAL/IM-0001-0001.jpeg", "PNEUMONIA/person1_virus_1.jpeg", "NORMAL/.DS_Store")]
    _placeholders(tmp_path, names)  # one file under every name: copies with different labels
    with pytest.raises(DataError, match=r"train/PNEUMONIA/person1_virus_1.jpeg: byte-identical to the image "
                                        r"train/NORMAL/IM-0001-0001 but labelled 2 instead of 0"):
        load_dataset("kermany_cxr", tmp_path)
    for value, name in enumerate(names):
        (tmp_path / name).unlink()
        Image.new("L", (4, 4), value).save(tmp_path / name, format="JPEG")
    with caplog.at_level(logging.INFO):
        df = load_dataset("kermany_cxr", tmp_path)
    assert df["image_id"].tolist() == ["train/NORMAL/IM-0001-0001", "train/PNEUMONIA/person1_virus_1",
                                       "test/NORMAL/IM-0001-0001", "test/PNEUMONIA/person1_virus_1"]
    assert df["label"].tolist() == [0, 2, 0, 2] and df["group"].tolist() == ["IM-0001", "person1"] * 2
    assert "chest_xray/test: left out 1 of 3 rows: hidden files" in caplog.text
    (tmp_path / "chest_xray/test/PNEUMONIA/person2_fungus_1.jpeg").touch()
    with pytest.raises(DataError, match=r"PNEUMONIA/person2_fungus_1.jpeg: file name does not follow"):
        load_dataset("kermany_cxr", tmp_path)
    shutil.rmtree(tmp_path / "chest_xray/test")
    with pytest.raises(DataError, match=r"chest_xray/test: folder not found"):
        load_dataset("kermany_cxr", tmp_path)


# ---------------------------------------------------------------- NIH ChestX-ray14
@pytest.fixture(scope="module")
def nih():
    return load_dataset("nih_cxr14", IMAGES / "nih_cxr14", images="present-only")


def test_nih_present_only_counts_and_strict_error(nih, caplog):
    df = nih
    assert len(df) == 1051 and df["group"].nunique() == 286
    assert df.attrs["task"] == "multilabel" and len(df.attrs["label_names"]) == 14
    counts = df[[*df.attrs["label_names"], "No Finding"]].sum().astype(int).to_dict()
    assert counts == {"No Finding": 536, "Effusion": 173, "Infiltration": 166, "Atelectasis": 96, "Cardiomegaly": 83,
                      "Nodule": 43, "Pneumothorax": 43, "Consolidation": 42, "Emphysema": 37, "Mass": 37,
                      "Fibrosis": 32, "Pleural_Thickening": 31, "Edema": 31, "Pneumonia": 11, "Hernia": 9}
    assert set(df["view"]) == {"PA", "AP"} and label_matrix(df).shape == (1051, 14)
    with pytest.raises(DataError, match=r"Data_Entry_2017_v2020.csv: line 867: image file .*00000211_019.png does not "
                                        r"exist \(111069 of 112120 listed images are missing\)"):
        load_dataset("nih_cxr14", IMAGES / "nih_cxr14")
    with caplog.at_level(logging.INFO):
        load_dataset("nih_cxr14", IMAGES / "nih_cxr14", images="present-only")
    assert "left out 111069 of 112120 rows: listed images whose file is absent" in caplog.text


def test_the_chexpert_to_nih_map_names_columns_of_the_real_release(nih):
    # keys: CheXpert labels in CheXpert's column order; values: columns of the loaded NIH table
    assert list(CHEXPERT_TO_NIH) == [n for n in CHEXPERT_LABELS if n in CHEXPERT_TO_NIH]
    assert CHEXPERT_TO_NIH["Pleural Effusion"] == "Effusion"
    counts = nih[list(CHEXPERT_TO_NIH.values())].sum().astype(int).tolist()
    assert counts == [536, 83, 31, 42, 11, 96, 43, 173]  # Effusion under Pleural Effusion


# ---------------------------------------------------------------- the paper's four, real label files
def test_isic2019_real_metadata(tmp_path):
    for name in ("ISIC_2019_Training_GroundTruth.csv", "ISIC_2019_Training_Metadata.csv"):
        shutil.copy(METADATA / "isic2019" / name, tmp_path / name)
    ids = pd.read_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", usecols=["image"])["image"]
    _placeholders(tmp_path, [f"ISIC_2019_Training_Input/{i}.jpg" for i in ids])
    df = load_dataset("isic2019", tmp_path)
    assert len(df) == 25331 and df["group"].nunique() == 13931
    assert (df["group"] == df["image_id"]).sum() == 2084  # images without a lesion id
    counts = df["label"].map(dict(enumerate(df.attrs["label_names"]))).value_counts().to_dict()
    assert counts == {"MEL": 4522, "NV": 12875, "BCC": 3323, "AK": 867, "BKL": 2624, "DF": 239, "VASC": 253, "SCC": 628}


def test_aptos2019_real_metadata(tmp_path):
    shutil.copy(METADATA / "aptos2019" / "train.csv", tmp_path / "train.csv")
    ids = pd.read_csv(tmp_path / "train.csv")["id_code"]
    _placeholders(tmp_path, [f"train_images/{i}.png" for i in ids])
    df = load_dataset("aptos2019", tmp_path)
    assert len(df) == 3662 and np.bincount(df["label"]).tolist() == [1805, 370, 999, 193, 295]


@pytest.fixture
def in_memory_tmp(tmp_path):
    """A scratch folder in memory (``/dev/shm``) where there is one, else ``tmp_path``: CheXpert's 191,229
    placeholders in 64,734 patient folders took 26 s to create and 59 s to delete on the disk of a shared 2-core
    VM during the suite (idle, a tree of that shape: 15.8 s on disk, 2.9 s in memory)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="crsrepro-test-") as folder:
        yield Path(folder)


@pytest.mark.slow  # seconds in memory; about 25 s of file-system work for the placeholders on a disk
def test_chexpert_real_metadata(in_memory_tmp, caplog):
    tmp_path = in_memory_tmp
    release = tmp_path / "CheXpert-v1.0-small"
    release.mkdir()
    with gzip.open(METADATA / "chexpert" / "train.csv.gz", "rb") as src, open(release / "train.csv", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copy(METADATA / "chexpert" / "valid.csv", release / "valid.csv")
    paths = pd.concat([pd.read_csv(release / f, usecols=["Path", "Frontal/Lateral"]) for f in ("train.csv", "valid.csv")])
    _placeholders(tmp_path, paths.loc[paths["Frontal/Lateral"] == "Frontal", "Path"])
    with caplog.at_level(logging.INFO):
        df = load_dataset("chexpert", tmp_path)
    assert len(df) == 191229 and df["group"].nunique() == 64734
    assert df["source_split"].value_counts().to_dict() == {"train": 191027, "valid": 202}
    assert "train.csv: left out 32387 of 223414 rows: lateral views" in caplog.text
    assert "valid.csv: left out 32 of 234 rows: lateral views" in caplog.text
    assert int(np.isnan(label_matrix(df)).sum()) == 120087  # uncertain labels masked (u_policy=ignore)


def test_mimic_excerpt_real_metadata(tmp_path):
    for name in ("metadata", "split", "chexpert"):
        shutil.copy(METADATA / "mimic_cxr_excerpt" / f"mimic-cxr-2.0.0-{name}.csv.gz", tmp_path)
    meta = pd.read_csv(tmp_path / "mimic-cxr-2.0.0-metadata.csv.gz", dtype=str)
    _placeholders(tmp_path, [f"files/p{s[:2]}/p{s}/s{t}/{d}.jpg"
                             for d, s, t in zip(meta["dicom_id"], meta["subject_id"], meta["study_id"])])
    df = load_dataset("mimic_cxr", tmp_path)
    assert len(df) == 3 and df["view"].tolist() == ["PA", "PA", "AP"] and df["group"].unique().tolist() == ["10000032"]
    assert (df["No Finding"] == 1.0).all()
