"""Loaders on tiny fixtures written in each release's real layout (DESIGN.md section 3)."""

import gzip
import logging

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crsrepro.core.vocab import TASKS
from crsrepro.data import DATASETS, label_matrix, load_dataset, read_image
from crsrepro.data.common import CHEXPERT_LABELS, MIN_IMAGE_SIDE
from crsrepro.core.errors import DataError


def _image(path, mode="RGB", fmt=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (8, 8), 128).save(path, format=fmt)


# ---------------------------------------------------------------- fixture writers (the real layouts)
def write_isic(root, rows):
    """rows: (image, class or 'UNK', lesion_id) -> GroundTruth + Metadata csvs and jpgs."""
    names = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK"]
    gt = pd.DataFrame([[image] + [1.0 if n == cls else 0.0 for n in names] for image, cls, _ in rows],
                      columns=["image"] + names)
    gt.to_csv(root / "ISIC_2019_Training_GroundTruth.csv", index=False)
    meta = pd.DataFrame([[image, 55.0, "anterior torso", lesion, "male"] for image, _, lesion in rows],
                        columns=["image", "age_approx", "anatom_site_general", "lesion_id", "sex"])
    meta.to_csv(root / "ISIC_2019_Training_Metadata.csv", index=False)
    for image, _, _ in rows:
        _image(root / "ISIC_2019_Training_Input" / f"{image}.jpg")


def write_aptos(root, rows):
    pd.DataFrame(rows, columns=["id_code", "diagnosis"]).to_csv(root / "train.csv", index=False)
    for id_code, _ in rows:
        _image(root / "train_images" / f"{id_code}.png")


def write_chexpert(root, split_rows, release="CheXpert-v1.0-small"):
    """split_rows: {split: [(patient, study, view, frontal, {label: value})]}; value '' = blank."""
    for split, rows in split_rows.items():
        records = []
        for patient, study, view, frontal, labels in rows:
            rel = f"{release}/{split}/patient{patient:05d}/study{study}/view{view}_{'frontal' if frontal else 'lateral'}.jpg"
            records.append({"Path": rel, "Sex": "Female", "Age": 60, "Frontal/Lateral": "Frontal" if frontal else "Lateral",
                            "AP/PA": "AP" if frontal else "", **{n: labels.get(n, "") for n in CHEXPERT_LABELS}})
            _image(root / rel, mode="L")
        (root / release).mkdir(parents=True, exist_ok=True)
        pd.DataFrame(records).to_csv(root / release / f"{split}.csv", index=False)


def write_mimic(root, images, study_labels, splits):
    """images: (dicom, subject, study, view); study_labels: {(subject, study): {label: value}}."""
    meta = pd.DataFrame([{"dicom_id": d, "subject_id": s, "study_id": t, "PerformedProcedureStepDescription": "CHEST",
                          "ViewPosition": v, "Rows": 8, "Columns": 8} for d, s, t, v in images])
    split = pd.DataFrame([{"dicom_id": d, "study_id": t, "subject_id": s, "split": splits[d]} for d, s, t, _ in images])
    labels = pd.DataFrame([{"subject_id": s, "study_id": t, **{n: lab.get(n, "") for n in sorted(CHEXPERT_LABELS)}}
                           for (s, t), lab in study_labels.items()])
    assert list(labels.columns[2:]) == sorted(CHEXPERT_LABELS)  # the real file is alphabetical
    for frame, name in ((meta, "metadata"), (split, "split"), (labels, "chexpert")):
        with gzip.open(root / f"mimic-cxr-2.0.0-{name}.csv.gz", "wt") as f:
            frame.to_csv(f, index=False)
    for d, s, t, _ in images:
        _image(root / "files" / f"p{str(s)[:2]}" / f"p{s}" / f"s{t}" / f"{d}.jpg", mode="L")


ISIC_ROWS = [("ISIC_0000000", "NV", "HAM_0000001"), ("ISIC_0000001", "NV", "HAM_0000001"),
             ("ISIC_0000002_downsampled", "MEL", ""), ("ISIC_0000003", "SCC", "BCN_0000003")]


def test_specs():
    assert set(DATASETS) == {"isic2019", "aptos2019", "chexpert", "mimic_cxr", "isic2017", "nih_cxr14", "kermany_cxr"}
    assert {s.task for s in DATASETS.values()} <= set(TASKS)
    assert DATASETS["isic2019"].label_names == ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
    assert DATASETS["mimic_cxr"].label_names == DATASETS["chexpert"].label_names
    assert not DATASETS["mimic_cxr"].trainable
    assert DATASETS["kermany_cxr"].options == ("n_classes",)


def test_unknown_option_and_images_policy(tmp_path):
    write_aptos(tmp_path, [("a1", 2)])
    with pytest.raises(ValueError, match=r"dataset aptos2019 has no option n_classes \(its options: none\)"):
        load_dataset("aptos2019", tmp_path, n_classes=2)
    with pytest.raises(ValueError, match=r"images must be one of"):
        load_dataset("aptos2019", tmp_path, images="some")


# ---------------------------------------------------------------- ISIC 2019
def test_isic_reads_onehot_lesion_groups_and_downsampled_ids(tmp_path):
    write_isic(tmp_path, ISIC_ROWS)
    df = load_dataset("isic2019", tmp_path)
    assert df.attrs["task"] == "multiclass" and df.attrs["label_names"][0] == "MEL"
    assert df["image_id"].tolist() == [r[0] for r in ISIC_ROWS]
    assert df["label"].tolist() == [1, 1, 0, 7]
    assert df["group"].tolist() == ["HAM_0000001", "HAM_0000001", "ISIC_0000002_downsampled", "BCN_0000003"]
    assert all(p.startswith(str(tmp_path)) and p.endswith(".jpg") for p in df["path"])
    assert label_matrix(df).dtype.kind == "i"


def test_isic_unk_and_not_onehot_are_errors(tmp_path):
    write_isic(tmp_path, ISIC_ROWS[:2] + [("ISIC_0000009", "UNK", "")])
    with pytest.raises(DataError, match=r"GroundTruth.csv: line 4: image ISIC_0000009 is labelled UNK"):
        load_dataset("isic2019", tmp_path)
    gt = pd.read_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv")
    gt.loc[2, ["UNK", "MEL", "NV"]] = [0.0, 1.0, 1.0]
    gt.to_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", index=False)
    with pytest.raises(DataError, match=r"line 4: .* has 2 positive classes"):
        load_dataset("isic2019", tmp_path)


def test_isic_missing_metadata_row_and_missing_column(tmp_path):
    write_isic(tmp_path, ISIC_ROWS)
    meta_path = tmp_path / "ISIC_2019_Training_Metadata.csv"
    meta = pd.read_csv(meta_path)
    meta.iloc[:3].to_csv(meta_path, index=False)
    with pytest.raises(DataError, match=r"line 5: image ISIC_0000003 has no row in .*Metadata.csv"):
        load_dataset("isic2019", tmp_path)
    meta.drop(columns="lesion_id").to_csv(meta_path, index=False)
    with pytest.raises(DataError, match=r"Metadata.csv: missing column\(s\) \['lesion_id'\]"):
        load_dataset("isic2019", tmp_path)


def test_missing_image_names_file_and_line_unless_present_only(tmp_path, caplog):
    write_isic(tmp_path, ISIC_ROWS)
    (tmp_path / "ISIC_2019_Training_Input" / "ISIC_0000001.jpg").unlink()
    with pytest.raises(DataError, match=r"GroundTruth.csv: line 3: image file .*ISIC_0000001.jpg does not exist "
                                        r"\(1 of 4 listed images are missing\)"):
        load_dataset("isic2019", tmp_path)
    with caplog.at_level(logging.INFO):
        df = load_dataset("isic2019", tmp_path, images="present-only")
    assert df["image_id"].tolist() == ["ISIC_0000000", "ISIC_0000002_downsampled", "ISIC_0000003"]
    assert "left out 1 of 4 rows: listed images whose file is absent" in caplog.text
    for path in (tmp_path / "ISIC_2019_Training_Input").iterdir():
        path.unlink()
    with pytest.raises(DataError, match=r"GroundTruth.csv: none of its 4 listed image files exists"):
        load_dataset("isic2019", tmp_path, images="present-only")


# ---------------------------------------------------------------- APTOS 2019
def test_aptos_reads_grades(tmp_path):
    write_aptos(tmp_path, [("000c1434d8d7", 2), ("001639a390f0", 4), ("0024cdab0c1e", 0)])
    df = load_dataset("aptos2019", tmp_path)
    assert df["label"].tolist() == [2, 4, 0]
    assert (df["group"] == df["image_id"]).all()
    assert df.attrs["label_names"] == ["No DR", "Mild", "Moderate", "Severe", "Proliferative DR"]


def test_aptos_unknown_grade_duplicate_and_empty(tmp_path):
    write_aptos(tmp_path, [("a1", 2), ("a2", 7)])
    with pytest.raises(DataError, match=r"train.csv: line 3: diagnosis '7' of a2 is not a grade 0..4"):
        load_dataset("aptos2019", tmp_path)
    write_aptos(tmp_path, [("a1", 2), ("a1", 3)])
    with pytest.raises(DataError, match=r"line 3: id_code a1 is listed twice"):
        load_dataset("aptos2019", tmp_path)
    write_aptos(tmp_path, [])
    with pytest.raises(DataError, match=r"train.csv: has a header but no rows"):
        load_dataset("aptos2019", tmp_path)


def test_missing_csv_and_missing_root(tmp_path):
    with pytest.raises(DataError, match=r"train.csv: file not found"):
        load_dataset("aptos2019", tmp_path)
    with pytest.raises(DataError, match=r"folder not found"):
        load_dataset("aptos2019", tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"unknown dataset 'isic'"):
        load_dataset("isic", tmp_path)


# ---------------------------------------------------------------- CheXpert
CHEX = {
    "train": [(1, 1, 1, True, {"No Finding": "1.0"}),
              (1, 1, 2, False, {"Edema": "1.0"}),
              (2, 1, 1, True, {"Edema": "-1.0", "Cardiomegaly": "0.0", "Support Devices": "1.0"}),
              (2, 2, 1, True, {"Pleural Effusion": "1.0", "Edema": "1.0"})],
    "valid": [(64541, 1, 1, True, {n: "0.0" for n in CHEXPERT_LABELS} | {"Atelectasis": "1.0"})],
}


@pytest.mark.parametrize("policy,expected", [("ignore", np.nan), ("ones", 1.0), ("zeros", 0.0)])
def test_chexpert_u_policy_blank_frontal_and_patient(tmp_path, caplog, policy, expected):
    write_chexpert(tmp_path, CHEX)
    with caplog.at_level(logging.INFO):
        df = load_dataset("chexpert", tmp_path, u_policy=policy)
    assert "left out 1 of 4 rows: lateral views" in caplog.text
    assert df.attrs["task"] == "multilabel" and df.attrs["label_names"] == CHEXPERT_LABELS
    assert df["image_id"].tolist() == ["train/patient00001/study1/view1_frontal", "train/patient00002/study1/view1_frontal",
                                       "train/patient00002/study2/view1_frontal", "valid/patient64541/study1/view1_frontal"]
    assert df["group"].tolist() == ["patient00001", "patient00002", "patient00002", "patient64541"]
    assert df["source_split"].tolist() == ["train", "train", "train", "valid"]
    np.testing.assert_equal(df["Edema"].to_numpy(), [0.0, expected, 1.0, 0.0])   # blank -> 0
    assert df["Cardiomegaly"].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert df["Atelectasis"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert label_matrix(df).shape == (4, 14)


def test_chexpert_full_release_and_bad_label_value(tmp_path):
    rows = {"train": [(1, 1, 1, True, {"Fracture": "2.0"})], "valid": CHEX["valid"]}
    write_chexpert(tmp_path, rows, release="CheXpert-v1.0")
    with pytest.raises(DataError, match=r"CheXpert-v1.0/train.csv: line 2: column 'Fracture' has value '2.0'"):
        load_dataset("chexpert", tmp_path)
    write_chexpert(tmp_path, {"train": CHEX["train"]}, release="CheXpert-v1.0")
    assert len(load_dataset("chexpert", tmp_path)) == 4


def test_chexpert_errors(tmp_path):
    with pytest.raises(DataError, match=r"no CheXpert release found"):
        load_dataset("chexpert", tmp_path)
    write_chexpert(tmp_path, {"train": [(1, 1, 2, False, {})], "valid": CHEX["valid"]})
    with pytest.raises(DataError, match=r"train.csv: no frontal views among its 1 rows"):
        load_dataset("chexpert", tmp_path)
    # the error line counts the lateral row that was filtered out before it
    write_chexpert(tmp_path, {"train": CHEX["train"], "valid": CHEX["valid"]})
    (tmp_path / "CheXpert-v1.0-small/train/patient00002/study2/view1_frontal.jpg").unlink()
    with pytest.raises(DataError, match=r"train.csv: line 5: image file .*study2/view1_frontal.jpg does not exist"):
        load_dataset("chexpert", tmp_path)


# ---------------------------------------------------------------- MIMIC-CXR
def test_mimic_reorders_labels_joins_studies_and_filters_views(tmp_path, caplog):
    images = [("aa-1", 10000032, 50414267, "PA"), ("aa-2", 10000032, 50414267, "LATERAL"),
              ("bb-1", 10000764, 57375967, "AP"), ("cc-1", 11000011, 51111111, "PA")]
    labels = {(10000032, 50414267): {"Atelectasis": "1.0", "Support Devices": "-1.0"},
              (10000764, 57375967): {"No Finding": "1.0", "Pneumothorax": "0.0"}}
    write_mimic(tmp_path, images, labels, {"aa-1": "test", "aa-2": "test", "bb-1": "train", "cc-1": "validate"})
    with caplog.at_level(logging.INFO):
        df = load_dataset("mimic_cxr", tmp_path)
    assert "left out 1 of 4 rows: views other than PA/AP" in caplog.text
    assert "left out 1 of 3 rows: frontal images whose study has no row" in caplog.text
    assert df["image_id"].tolist() == ["aa-1", "bb-1"]
    assert df["source_split"].tolist() == ["test", "train"]
    assert df["group"].tolist() == ["10000032", "10000764"]
    assert df.attrs["label_names"] == CHEXPERT_LABELS
    # CheXpert's column order, whatever order the MIMIC csv used
    assert label_matrix(df)[0].tolist()[:9] == [0, 0, 0, 0, 0, 0, 0, 0, 1]
    assert np.isnan(df["Support Devices"].iloc[0]) and df["No Finding"].tolist() == [0.0, 1.0]
    assert df["path"].iloc[0].endswith("files/p10/p10000032/s50414267/aa-1.jpg")


def test_mimic_missing_split_row_and_bad_split(tmp_path):
    images = [("aa-1", 10000032, 50414267, "PA")]
    labels = {(10000032, 50414267): {}}
    write_mimic(tmp_path, images, labels, {"aa-1": "holdout"})
    with pytest.raises(DataError, match=r"split.csv.gz: line 2: split 'holdout' is not one of train, validate, test"):
        load_dataset("mimic_cxr", tmp_path)
    write_mimic(tmp_path, images, {(10000099, 1): {}}, {"aa-1": "test"})
    with pytest.raises(DataError, match=r"no frontal image with a label row"):
        load_dataset("mimic_cxr", tmp_path)


# ---------------------------------------------------------------- images
def test_read_image_rgb_and_corrupt(tmp_path):
    _image(tmp_path / "gray.jpg", mode="L")
    assert read_image(tmp_path / "gray.jpg").mode == "RGB"
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"bad.jpg: corrupt or unreadable image"):
        read_image(tmp_path / "bad.jpg")
    data = (tmp_path / "gray.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut.jpg: corrupt"):
        read_image(tmp_path / "cut.jpg")
    with pytest.raises(DataError, match=r"missing.jpg: image file not found"):
        read_image(tmp_path / "missing.jpg")


def test_mimic_missing_image_and_missing_split_row_name_the_metadata_line(tmp_path):
    images = [("aa-2", 10000032, 50414267, "LATERAL"), ("aa-1", 10000032, 50414267, "PA")]
    write_mimic(tmp_path, images, {(10000032, 50414267): {}}, {"aa-1": "test", "aa-2": "test"})
    (tmp_path / "files/p10/p10000032/s50414267/aa-1.jpg").unlink()
    with pytest.raises(DataError, match=r"metadata.csv.gz: line 3: image file .*aa-1.jpg does not exist"):
        load_dataset("mimic_cxr", tmp_path)
    write_mimic(tmp_path, images, {(10000032, 50414267): {}}, {"aa-1": "test", "aa-2": "test"})
    split_path = tmp_path / "mimic-cxr-2.0.0-split.csv.gz"
    split = pd.read_csv(split_path)
    split[split["dicom_id"] != "aa-1"].to_csv(split_path, index=False)
    with pytest.raises(DataError, match=r"metadata.csv.gz: line 3: dicom_id aa-1 has no row in .*split.csv.gz"):
        load_dataset("mimic_cxr", tmp_path)


# ---------------------------------------------------------------- ISIC 2017 and NIH ChestX-ray14 (DESIGN.md section 3)
def write_isic2017(root, splits, metadata_inside=False):
    """splits: {prefix: [(image_id, melanoma, seborrheic_keratosis)]}; each image gets its own pixels."""
    for k, (prefix, rows) in enumerate(splits.items()):
        pd.DataFrame(rows, columns=["image_id", "melanoma", "seborrheic_keratosis"]).to_csv(
            root / f"{prefix}_Part3_GroundTruth.csv", index=False)
        (root / f"{prefix}_Data").mkdir(exist_ok=True)
        meta_dir = root / f"{prefix}_Data" if metadata_inside else root
        pd.DataFrame([(i, "unknown", "male") for i, *_ in rows], columns=["image_id", "age_approximate", "sex"]).to_csv(
            meta_dir / f"{prefix}_Data_metadata.csv", index=False)
        for j, (image_id, *_) in enumerate(rows):
            path = root / f"{prefix}_Data" / f"{image_id}.jpg"
            Image.new("RGB", (8, 8), (10 * k, 10 * j, 0)).save(path)


ISIC17 = {"ISIC-2017_Training": [("ISIC_0000000", 1.0, 0.0), ("ISIC_0000001", 0.0, 1.0)],
          "ISIC-2017_Validation": [("ISIC_0001769", 0.0, 0.0)],
          "ISIC-2017_Test_v2": [("ISIC_0012086", 0.0, 0.0)]}


def test_isic2017_classes_splits_and_a_copy_across_splits(tmp_path, caplog):
    write_isic2017(tmp_path, ISIC17, metadata_inside=True)
    copy = tmp_path / "ISIC-2017_Test_v2_Data" / "ISIC_0012086.jpg"
    copy.write_bytes((tmp_path / "ISIC-2017_Validation_Data" / "ISIC_0001769.jpg").read_bytes())
    with caplog.at_level(logging.INFO):
        df = load_dataset("isic2017", tmp_path)
    assert df["label"].tolist() == [0, 1, 2] and df["source_split"].tolist() == ["train", "train", "validation"]
    assert df.attrs["duplicates"] == {"ISIC_0012086": "ISIC_0001769"}
    assert "left out 1 of 4 images: byte-identical copies" in caplog.text
    assert df["age_approx"].isna().all() and (df["sex"] == "male").all()


def test_isic2017_errors_name_file_and_line(tmp_path):
    rows = dict(ISIC17, **{"ISIC-2017_Test_v2": [("ISIC_0012086", 0.0, 0.0), ("ISIC_0012087", 1.0, 1.0)]})
    write_isic2017(tmp_path, rows)
    with pytest.raises(DataError, match=r"Test_v2_Part3_GroundTruth.csv: line 3: image ISIC_0012087 is both melanoma"):
        load_dataset("isic2017", tmp_path)
    write_isic2017(tmp_path, dict(ISIC17, **{"ISIC-2017_Test_v2": [("ISIC_0000001", 0.0, 0.0)]}))
    with pytest.raises(DataError, match=r"image ISIC_0000001 is listed in the ground truth of more than one split \(train, test\)"):
        load_dataset("isic2017", tmp_path)
    write_isic2017(tmp_path, ISIC17)
    pd.DataFrame(columns=["image_id", "age_approximate", "sex"]).to_csv(tmp_path / "ISIC-2017_Validation_Data_metadata.csv")
    with pytest.raises(DataError, match=r"Validation_Data_metadata.csv: has a header but no rows"):
        load_dataset("isic2017", tmp_path)


def write_nih(root, rows, present):
    """rows: (image, finding labels, patient, view); only the images in ``present`` get a file."""
    pd.DataFrame([{"Image Index": i, "Finding Labels": f, "Follow-up #": 0, "Patient ID": p, "Patient Age": 50,
                   "Patient Gender": "F", "View Position": v} for i, f, p, v in rows]).to_csv(
        root / "Data_Entry_2017_v2020.csv", index=False)
    for image in present:
        _image(root / "images" / image, mode="L", fmt="PNG")


NIH = [("00000001_000.png", "Cardiomegaly|Effusion", 1, "PA"), ("00000002_000.png", "No Finding", 2, "AP"),
       ("00000003_000.png", "Pleural_Thickening", 3, "PA")]


def test_nih_labels_present_only_and_errors(tmp_path):
    write_nih(tmp_path, NIH, present=[r[0] for r in NIH])
    df = load_dataset("nih_cxr14", tmp_path)
    assert df["image_id"].tolist() == ["00000001_000", "00000002_000", "00000003_000"]
    assert df["Cardiomegaly"].tolist() == [1, 0, 0] and df["Effusion"].tolist() == [1, 0, 0]
    assert df["No Finding"].tolist() == [0, 1, 0] and df["Pleural_Thickening"].tolist() == [0, 0, 1]
    assert df["group"].tolist() == ["1", "2", "3"] and df["view"].tolist() == ["PA", "AP", "PA"]
    write_nih(tmp_path, NIH + [("00000004_000.png", "Effusion|Fracture", 4, "PA")], present=[])
    with pytest.raises(DataError, match=r"line 5: Finding Labels 'Effusion\|Fracture' has the unknown finding 'Fracture'"):
        load_dataset("nih_cxr14", tmp_path)
    write_nih(tmp_path, NIH + [("00000004_000.png", "No Finding|Mass", 4, "PA")], present=[])
    with pytest.raises(DataError, match=r"line 5: .* must list findings or be 'No Finding' alone"):
        load_dataset("nih_cxr14", tmp_path)
    write_nih(tmp_path, NIH + [("00000004_000.png", "Mass", 4, "LL")], present=[])
    with pytest.raises(DataError, match=r"line 5: View Position 'LL' is not one of PA, AP"):
        load_dataset("nih_cxr14", tmp_path)
    write_nih(tmp_path, NIH + [("00000004_000.png", "Mass", 4, "PA")], present=[])
    with pytest.raises(DataError, match=r"line 5: image file .*00000004_000.png does not exist \(1 of 4"):
        load_dataset("nih_cxr14", tmp_path)
    assert len(load_dataset("nih_cxr14", tmp_path, images="present-only")) == 3


# ---------------------------------------------------------------- issue 26: image sizes and the content key
def test_loaders_warn_about_images_below_the_minimum_side(tmp_path, caplog):
    write_aptos(tmp_path, [("big1", 2), ("big2", 4), ("tiny", 0)])
    for name in ("big1", "big2"):
        Image.new("RGB", (MIN_IMAGE_SIDE, 3 * MIN_IMAGE_SIDE), 128).save(tmp_path / "train_images" / f"{name}.png")
    Image.new("RGB", (1, 1), 128).save(tmp_path / "train_images" / "tiny.png")
    with caplog.at_level(logging.WARNING, logger="crsrepro.data.common"):
        df = load_dataset("aptos2019", tmp_path)
    assert len(df) == 3  # a warning, not an error
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 of 3 images have a side shorter than" in warnings[0]
    assert "tiny.png (1 px)" in warnings[0] and "big1" not in warnings[0]
    caplog.clear()
    Image.new("RGB", (MIN_IMAGE_SIDE, MIN_IMAGE_SIDE), 128).save(tmp_path / "train_images" / "tiny.png")
    with caplog.at_level(logging.WARNING, logger="crsrepro.data.common"):
        load_dataset("aptos2019", tmp_path)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def _release(root, files):
    """Write ``files`` ({relative path: bytes}) under ``root/isic2017``; the images table of them."""
    for rel, data in files.items():
        path = root / "isic2017" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return pd.DataFrame({"image_id": [f"id{i}" for i in range(len(files))],
                         "path": [str(root / "isic2017" / rel) for rel in files]})


def test_the_content_key_follows_the_bytes_and_relative_paths_not_mtimes(tmp_path, monkeypatch):
    import os

    from crsrepro.data import content
    from crsrepro.profiles import load_profile

    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / "home" / ".crsrepro"))
    files = {"a/view1_frontal.jpg": b"first image", "b/view1_frontal.jpg": b"second image"}

    def key(root, table):
        monkeypatch.setenv("CRSREPRO_DATA", str(root))
        return content.dataset_content_key(load_profile("real-mini"), "isic2017", table)

    here = _release(tmp_path / "here", files)
    first = key(tmp_path / "here", here)
    copy = _release(tmp_path / "copy", files)  # the same files elsewhere, with other mtimes
    for path in copy["path"]:
        os.utime(path, ns=(1, 1))
    assert key(tmp_path / "copy", copy) == first
    swapped = _release(tmp_path / "swapped", dict(zip(files, reversed(list(files.values())))))
    assert key(tmp_path / "swapped", swapped) != first  # same basenames and sizes, contents swapped
    target = here["path"].iloc[0]
    stat = os.stat(target)
    with open(target, "r+b") as f:
        f.write(b"F")  # same size
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    changed = key(tmp_path / "here", here)
    assert changed != first
    read = []  # an unchanged file is hashed once (the digests are cached by path, size and mtime)
    monkeypatch.setattr(content, "sha256_file", lambda path: read.append(path) or "x")
    assert key(tmp_path / "here", here) == changed and read == []
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2))
    key(tmp_path / "here", here)
    assert read == [os.path.abspath(target)]
