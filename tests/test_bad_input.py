"""Bad input (DESIGN.md section 13): each malformed input gives one clear line naming the file
and the row or key, as a :class:`~crsrepro.core.errors.CrsreproError`; nothing is silently dropped and no
half-written file is left behind.

The loader cases are built from a few rows of the real release files in ``../shared/realdata/metadata``
(copied into tmp_path, with placeholder images) and skip when that folder is absent; the image,
profile, weights and CLI cases need nothing.

Decisions documented here (and in :func:`crsrepro.data.read_image`): a 16-bit PNG loads as RGB,
scaled by its bit depth (value // 257); a CMYK JPEG loads as RGB through PIL. Kaggle's flattened
CheXpert copy is refused with the command that restores the release layout.
"""

import gzip
import importlib.util
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from crsrepro.cli import main
from crsrepro.data import load_dataset, prepare_dataset, read_image
from crsrepro.data.manifests import load_or_create_manifest
from crsrepro.encoders import create_encoder
from crsrepro.encoders.weights import load_state_dict
from crsrepro.core.errors import CrsreproError, DataError, MissingWeightsError, ProfileError, WrongWeightsError
from crsrepro.profiles import PROFILE_DIR, load_profile

REALDATA = Path(os.environ.get("CRSREPRO_REALDATA", Path(__file__).resolve().parents[1].parent / "shared" / "realdata"))
METADATA = REALDATA / "metadata"
needs_realdata = pytest.mark.skipif(not METADATA.is_dir(), reason=f"real metadata not found at {METADATA} "
                                    "(set CRSREPRO_REALDATA)")


def _sibling(name):
    """A helper module among the tests (the suite runs with --import-mode=importlib)."""
    spec = importlib.util.spec_from_file_location(f"_bad_input_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_placeholders = _sibling("test_realdata")._placeholders


def one_line(exc_info, *fragments):
    """The error is a CrsreproError of one line that contains every fragment (a str, or a compiled regex)."""
    message = str(exc_info.value)
    assert isinstance(exc_info.value, CrsreproError), type(exc_info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert (fragment.search(message) if isinstance(fragment, re.Pattern) else fragment in message), message
    return message


# ---------------------------------------------------------------- real release rows, copied into tmp_path
def isic(tmp_path, n=6):
    """The first ``n`` rows of ISIC 2019's ground truth and metadata (CRLF, as released), with images."""
    read = lambda name: pd.read_csv(METADATA / "isic2019" / name, dtype=str, keep_default_na=False).head(n)  # noqa: E731
    gt, meta = read("ISIC_2019_Training_GroundTruth.csv"), read("ISIC_2019_Training_Metadata.csv")
    gt.to_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", index=False, lineterminator="\r\n")
    meta.to_csv(tmp_path / "ISIC_2019_Training_Metadata.csv", index=False, lineterminator="\r\n")
    _placeholders(tmp_path, [f"ISIC_2019_Training_Input/{i}.jpg" for i in gt["image"]])
    return gt, meta


def aptos(tmp_path, n=6):
    train = pd.read_csv(METADATA / "aptos2019" / "train.csv", dtype=str).head(n)
    train.to_csv(tmp_path / "train.csv", index=False)
    _placeholders(tmp_path, [f"train_images/{i}.png" for i in train["id_code"]])
    return train


def chexpert(tmp_path, n=8, release="CheXpert-v1.0-small"):
    """The first ``n`` rows of the real train.csv and the real valid.csv, with images at their Path."""
    folder = tmp_path / release
    folder.mkdir()
    with gzip.open(METADATA / "chexpert" / "train.csv.gz", "rt") as f:
        train = pd.read_csv(f, dtype=str, keep_default_na=False, nrows=n)
    valid = pd.read_csv(METADATA / "chexpert" / "valid.csv", dtype=str, keep_default_na=False)
    train.to_csv(folder / "train.csv", index=False)
    valid.to_csv(folder / "valid.csv", index=False)
    _placeholders(tmp_path, pd.concat([train, valid])["Path"])
    return train, valid


def mimic(tmp_path):
    for name in ("metadata", "split", "chexpert"):
        shutil.copy(METADATA / "mimic_cxr_excerpt" / f"mimic-cxr-2.0.0-{name}.csv.gz", tmp_path)
    meta = pd.read_csv(tmp_path / "mimic-cxr-2.0.0-metadata.csv.gz", dtype=str)
    _placeholders(tmp_path, [f"files/p{s[:2]}/p{s}/s{t}/{d}.jpg"
                             for d, s, t in zip(meta["dicom_id"], meta["subject_id"], meta["study_id"])])


def rewrite_gz(path, edit):
    frame = edit(pd.read_csv(path, dtype=str, keep_default_na=False))
    with gzip.open(path, "wt") as f:
        frame.to_csv(f, index=False)


# ---------------------------------------------------------------- images
@pytest.fixture
def jpeg_bytes(tmp_path):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "good.jpg", quality=90)
    return (tmp_path / "good.jpg").read_bytes()


def test_truncated_jpeg(tmp_path, jpeg_bytes):
    (tmp_path / "cut.jpg").write_bytes(jpeg_bytes[: len(jpeg_bytes) // 2])
    with pytest.raises(DataError) as err:
        read_image(tmp_path / "cut.jpg")
    one_line(err, "cut.jpg: corrupt or unreadable image", "truncated")


def test_jpeg_with_corrupt_bytes(tmp_path, jpeg_bytes):
    (tmp_path / "garbled.jpg").write_bytes(jpeg_bytes[:20] + bytes(range(256)) * 4)
    with pytest.raises(DataError) as err:
        read_image(tmp_path / "garbled.jpg")
    one_line(err, "garbled.jpg: corrupt or unreadable image")


def test_truncated_png(tmp_path):
    Image.new("L", (64, 64), 7).save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as err:
        read_image(tmp_path / "cut.png")
    one_line(err, "cut.png: corrupt or unreadable image")


def test_zero_byte_file(tmp_path):
    (tmp_path / "empty.png").touch()
    with pytest.raises(DataError) as err:
        read_image(tmp_path / "empty.png")
    one_line(err, "empty.png: corrupt or unreadable image")


def test_a_folder_where_an_image_should_be(tmp_path):
    (tmp_path / "folder.jpg").mkdir()
    with pytest.raises(DataError) as err:
        read_image(tmp_path / "folder.jpg")
    one_line(err, "folder.jpg: corrupt or unreadable image")


def test_16_bit_png_loads_as_rgb_scaled_by_its_bit_depth(tmp_path):
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "xray16.png")
    assert Image.open(tmp_path / "xray16.png").mode.startswith("I")
    image = read_image(tmp_path / "xray16.png")
    pixels = np.asarray(image)
    assert image.mode == "RGB" and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels[..., 0], ramp // 257)  # not clipped to white
    assert (pixels[..., 0] == pixels[..., 2]).all()


def test_cmyk_jpeg_loads_as_rgb(tmp_path):
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[...] = (200, 50, 20)
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=95)
    assert Image.open(tmp_path / "cmyk.jpg").mode == "CMYK"
    image = read_image(tmp_path / "cmyk.jpg")
    assert image.mode == "RGB"
    np.testing.assert_allclose(np.asarray(image)[8, 8], (200, 50, 20), atol=6)


# ---------------------------------------------------------------- ISIC 2019
@needs_realdata
def test_isic_renamed_column_gender_instead_of_sex(tmp_path, caplog):
    """Metadata is descriptive (DESIGN.md section 14): a csv without ``sex`` loads, with sex unknown and a log line."""
    _, meta = isic(tmp_path)
    meta.rename(columns={"sex": "gender"}).to_csv(tmp_path / "ISIC_2019_Training_Metadata.csv", index=False)
    with caplog.at_level(logging.INFO):
        df = load_dataset("isic2019", tmp_path)
    assert (df["sex"] == "unknown").all() and "no column 'sex': sex is unknown for all" in caplog.text


@needs_realdata
def test_isic_missing_class_column(tmp_path):
    gt, _ = isic(tmp_path)
    gt.drop(columns="SCC").to_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, "ISIC_2019_Training_GroundTruth.csv: missing column(s) ['SCC']")


@needs_realdata
def test_isic_label_value_out_of_range(tmp_path):
    gt, _ = isic(tmp_path)
    gt.loc[3, "NV"] = "2.0"
    gt.to_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, "GroundTruth.csv: line 5: column 'NV' has value '2.0' (expected 0 or 1)")


@needs_realdata
def test_isic_duplicate_image_id(tmp_path):
    gt, _ = isic(tmp_path)
    pd.concat([gt, gt.iloc[[1]]]).to_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, f"GroundTruth.csv: line 8: image {gt['image'][1]} is listed twice")


@needs_realdata
def test_isic_duplicate_metadata_row_is_not_silently_dropped(tmp_path):
    _, meta = isic(tmp_path)
    twin = meta.iloc[[2]].assign(lesion_id="IL_9999999")  # which lesion is it? no rule can choose
    pd.concat([meta, twin]).to_csv(tmp_path / "ISIC_2019_Training_Metadata.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, f"Metadata.csv: line 8: image {meta['image'][2]} is listed twice")


@needs_realdata
def test_isic_header_without_rows(tmp_path):
    gt, _ = isic(tmp_path)
    gt.head(0).to_csv(tmp_path / "ISIC_2019_Training_GroundTruth.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, "GroundTruth.csv: has a header but no rows")


@needs_realdata
def test_isic_missing_image_names_the_line_and_the_count(tmp_path):
    gt, _ = isic(tmp_path)
    (tmp_path / "ISIC_2019_Training_Input" / f"{gt['image'][4]}.jpg").unlink()
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, "GroundTruth.csv: line 6: image file", "(1 of 6 listed images are missing)")


# ---------------------------------------------------------------- APTOS 2019
@needs_realdata
def test_aptos_grade_out_of_range(tmp_path):
    train = aptos(tmp_path)
    train.loc[2, "diagnosis"] = "5"
    train.to_csv(tmp_path / "train.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("aptos2019", tmp_path)
    one_line(err, f"train.csv: line 4: diagnosis '5' of {train['id_code'][2]} is not a grade 0..4")


@needs_realdata
def test_aptos_fractional_grade(tmp_path):
    train = aptos(tmp_path)
    train.loc[0, "diagnosis"] = "2.5"
    train.to_csv(tmp_path / "train.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("aptos2019", tmp_path)
    one_line(err, "train.csv: line 2: diagnosis '2.5'")


@needs_realdata
def test_aptos_duplicate_id(tmp_path):
    train = aptos(tmp_path)
    pd.concat([train, train.iloc[[0]]]).to_csv(tmp_path / "train.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("aptos2019", tmp_path)
    one_line(err, f"train.csv: line 8: id_code {train['id_code'][0]} is listed twice")


@needs_realdata
def test_aptos_zero_byte_csv(tmp_path):
    aptos(tmp_path)
    (tmp_path / "train.csv").write_bytes(b"")
    with pytest.raises(DataError) as err:
        load_dataset("aptos2019", tmp_path)
    one_line(err, "train.csv: cannot be read as a csv")


# ---------------------------------------------------------------- CheXpert
@needs_realdata
def test_chexpert_label_value_out_of_range(tmp_path):
    train, _ = chexpert(tmp_path)
    train.loc[1, "Edema"] = "2.0"
    train.to_csv(tmp_path / "CheXpert-v1.0-small" / "train.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("chexpert", tmp_path)
    one_line(err, re.compile(r"CheXpert-v1.0-small/train.csv: line \d+: column 'Edema' has value '2.0'"))


@needs_realdata
def test_chexpert_renamed_view_column(tmp_path):
    train, _ = chexpert(tmp_path)
    train.rename(columns={"Frontal/Lateral": "View"}).to_csv(tmp_path / "CheXpert-v1.0-small" / "train.csv", index=False)
    with pytest.raises(DataError) as err:
        load_dataset("chexpert", tmp_path)
    one_line(err, "train.csv: missing column(s) ['Frontal/Lateral']")


@needs_realdata
def test_chexpert_missing_valid_csv(tmp_path):
    chexpert(tmp_path)
    (tmp_path / "CheXpert-v1.0-small" / "valid.csv").unlink()
    with pytest.raises(DataError) as err:
        load_dataset("chexpert", tmp_path)
    one_line(err, "CheXpert-v1.0-small/valid.csv: file not found (expected the CheXpert valid csv)")


@needs_realdata
def test_chexpert_kaggle_flattened_copy_says_what_to_do(tmp_path):
    chexpert(tmp_path)
    release = tmp_path / "CheXpert-v1.0-small"
    for name in ("train.csv", "valid.csv", "train", "valid"):  # Kaggle's download folder: no release folder
        shutil.move(release / name, tmp_path / name)
    release.rmdir()
    with pytest.raises(DataError) as err:
        load_dataset("chexpert", tmp_path)
    one_line(err, f"{tmp_path / 'train.csv'}: Kaggle's flattened CheXpert copy",
             f"cd {tmp_path} && mkdir CheXpert-v1.0-small && mv train.csv valid.csv train valid CheXpert-v1.0-small/")


# ---------------------------------------------------------------- MIMIC-CXR
@needs_realdata
def test_mimic_truncated_gzip(tmp_path):
    mimic(tmp_path)
    path = tmp_path / "mimic-cxr-2.0.0-chexpert.csv.gz"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError) as err:
        load_dataset("mimic_cxr", tmp_path)
    one_line(err, "mimic-cxr-2.0.0-chexpert.csv.gz: cannot be read as a csv")


@needs_realdata
def test_mimic_unknown_split_value(tmp_path):
    mimic(tmp_path)
    rewrite_gz(tmp_path / "mimic-cxr-2.0.0-split.csv.gz", lambda f: f.assign(split=["train"] * (len(f) - 1) + ["holdout"]))
    with pytest.raises(DataError) as err:
        load_dataset("mimic_cxr", tmp_path)
    one_line(err, "split.csv.gz: line 6: split 'holdout' is not one of train, validate, test")


@needs_realdata
def test_mimic_empty_transfer_split(tmp_path):
    mimic(tmp_path)
    rewrite_gz(tmp_path / "mimic-cxr-2.0.0-split.csv.gz", lambda f: f.assign(split="train"))
    profile = load_profile("paper", overrides={"data": {"root": str(tmp_path.parent), "folders": {"mimic_cxr": tmp_path.name}}})
    with pytest.raises(DataError) as err:
        prepare_dataset(profile, "mimic_cxr", manifest_dir=tmp_path / "manifests", progress=False)
    one_line(err, f"{tmp_path}: no image in the official test split (the transfer set)")


@needs_realdata
def test_mimic_label_value_out_of_range(tmp_path):
    mimic(tmp_path)
    rewrite_gz(tmp_path / "mimic-cxr-2.0.0-chexpert.csv.gz", lambda f: f.assign(Edema="yes"))
    with pytest.raises(DataError) as err:
        load_dataset("mimic_cxr", tmp_path)
    one_line(err, "chexpert.csv.gz: line 2: column 'Edema' has value 'yes'")


# ---------------------------------------------------------------- dataset roots
@needs_realdata
def test_root_that_holds_another_dataset(tmp_path):
    aptos(tmp_path)
    with pytest.raises(DataError) as err:
        load_dataset("isic2019", tmp_path)
    one_line(err, "ISIC_2019_Training_GroundTruth.csv: file not found (expected the ISIC 2019 one-hot ground truth csv)")
    with pytest.raises(DataError) as err:  # APTOS's train.csv is not mistaken for a flattened CheXpert copy
        load_dataset("chexpert", tmp_path)
    one_line(err, "no CheXpert release found")


def test_root_that_is_a_file(tmp_path):
    (tmp_path / "aptos.zip").write_bytes(b"PK")
    with pytest.raises(DataError) as err:
        load_dataset("aptos2019", tmp_path / "aptos.zip")
    one_line(err, "aptos.zip: folder not found (expected the aptos2019 release here)")


# ---------------------------------------------------------------- manifests
@pytest.fixture
def isic_table(tmp_path):
    if not METADATA.is_dir():
        pytest.skip(f"real metadata not found at {METADATA}")
    root = tmp_path / "isic2019"
    root.mkdir()
    isic(root, n=40)
    return load_dataset("isic2019", root)


def test_manifest_whose_hash_does_not_match(tmp_path, isic_table):
    load_or_create_manifest(isic_table, dataset="isic2019", manifests_name="t", manifest_dir=tmp_path, seed=0)
    path = tmp_path / "isic2019_t.csv"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace(",test,", ",pool,") if ",test," in lines[3] else lines[3].replace(",pool,", ",test,")
    path.write_text("".join(lines))
    with pytest.raises(DataError) as err:
        load_or_create_manifest(isic_table, dataset="isic2019", manifests_name="t", manifest_dir=tmp_path, seed=0)
    one_line(err, "isic2019_t.csv: SHA-256", "does not match isic2019_t.csv.sha256")


def test_manifest_of_another_release(tmp_path, isic_table):
    other = isic_table.iloc[:30].copy()  # an earlier release: fewer images, the same ids
    other.attrs = isic_table.attrs
    load_or_create_manifest(other, dataset="isic2019", manifests_name="t", manifest_dir=tmp_path, seed=0)
    with pytest.raises(DataError) as err:
        load_or_create_manifest(isic_table, dataset="isic2019", manifests_name="t", manifest_dir=tmp_path, seed=0)
    one_line(err, "isic2019_t.csv: stale manifest: 10 images of the data are not in it")


def test_a_failed_load_writes_no_manifest(tmp_path):
    if not METADATA.is_dir():
        pytest.skip(f"real metadata not found at {METADATA}")
    root = tmp_path / "isic2019"
    root.mkdir()
    gt, _ = isic(root)
    gt.loc[0, "MEL"] = "x"
    gt.to_csv(root / "ISIC_2019_Training_GroundTruth.csv", index=False)
    profile = load_profile("paper", overrides={"data": {"root": str(tmp_path)}})
    with pytest.raises(DataError, match="line 2: column 'MEL' has value 'x'"):
        prepare_dataset(profile, "isic2019", manifest_dir=tmp_path / "manifests", progress=False)
    assert not (tmp_path / "manifests").exists() or not any((tmp_path / "manifests").iterdir())


# ---------------------------------------------------------------- weights
def _tiny_resnet(folder, edit=None):
    """A timm hub folder of a 1-block-per-stage ResNet-50 (the layout general.resnet50's weights ship in)."""
    import json

    import timm
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    model_args = {"layers": [1, 1, 1, 1]}
    model = timm.create_model("resnet50", pretrained=False, num_classes=0, **model_args)
    (folder / "config.json").write_text(json.dumps({"architecture": "resnet50", "num_classes": 0, "model_args": model_args}))
    state_dict = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(edit(state_dict) if edit else state_dict, folder / "model.safetensors")
    return folder


def test_weights_folder_missing(tmp_path):
    with pytest.raises(MissingWeightsError) as err:
        create_encoder("general.resnet50", weights=tmp_path / "absent")
    one_line(err, "absent", "does not exist")


def test_weights_folder_without_the_weight_file(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "README.md").write_text("weights go here")
    with pytest.raises(MissingWeightsError) as err:
        create_encoder("general.resnet50", weights=tmp_path / "w")
    one_line(err, "general.resnet50: none of model.safetensors", str(tmp_path / "w"))


def test_weights_of_the_wrong_shape(tmp_path):
    folder = _tiny_resnet(tmp_path / "w", edit=lambda sd: {**sd, "conv1.weight": torch.zeros(64, 3, 5, 5)})
    with pytest.raises(WrongWeightsError) as err:
        create_encoder("general.resnet50", weights=folder)
    one_line(err, "general.resnet50:", "1 tensors of the wrong shape", "conv1.weight: (64, 3, 5, 5) in the file, "
             "(64, 3, 7, 7) in the network")


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_checkpoint_that_asks_to_unpickle_code(tmp_path):
    folder = tmp_path / "retfound"
    folder.mkdir()
    marker = tmp_path / "code_ran"
    torch.save({"model": {"w": torch.zeros(1)}, "hook": _RunsCode(marker)}, folder / "RETFound_cfp_weights.pth")
    with pytest.raises(WrongWeightsError) as err:
        create_encoder("specialist.retfound", weights=folder)
    one_line(err, "RETFound_cfp_weights.pth: not a readable weights-only checkpoint",
             "it asks for the Python object")
    assert not marker.exists()
    with pytest.raises(WrongWeightsError):
        load_state_dict(folder / "RETFound_cfp_weights.pth")
    assert not marker.exists()


# ---------------------------------------------------------------- profiles
def _profile_file(tmp_path, text):
    path = tmp_path / "mine.yaml"
    path.write_text(f"include: smoke\nname: mine\n{text}")
    return path


def test_profile_unknown_top_level_key(tmp_path):
    with pytest.raises(ProfileError) as err:
        load_profile(_profile_file(tmp_path, "seed: [0]\n"))
    one_line(err, f"'mine' ({tmp_path / 'mine.yaml'}): unknown key seed")


def test_profile_unknown_nested_key(tmp_path):
    with pytest.raises(ProfileError) as err:
        load_profile(_profile_file(tmp_path, "probe:\n  learning_rate: 0.1\n"))
    one_line(err, "mine.yaml", "unknown key probe.learning_rate")


def test_profile_bad_type(tmp_path):
    with pytest.raises(ProfileError) as err:
        load_profile(_profile_file(tmp_path, "seeds: '0, 1'\n"))
    one_line(err, "mine.yaml", "key seeds must be a non-empty list of non-negative integers, got '0, 1'")


def test_profile_bad_value_in_a_section(tmp_path):
    with pytest.raises(ProfileError) as err:
        load_profile(_profile_file(tmp_path, "features:\n  batch_size: 0\n"))
    one_line(err, "mine.yaml", "key features.batch_size must be a positive integer, got 0")


def test_profile_not_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    message = str(err.value)
    assert isinstance(err.value, CrsreproError) and "broken.yaml is not valid YAML" in message.splitlines()[0]


def test_profile_path_variable_not_set(monkeypatch):
    monkeypatch.delenv("CRSREPRO_DATA", raising=False)
    profile = load_profile("paper")
    with pytest.raises(ProfileError) as err:
        profile.dataset_root("isic2019")
    one_line(err, f"({PROFILE_DIR / 'paper.yaml'}): key data.root uses ${{CRSREPRO_DATA}}", "export CRSREPRO_DATA=")


# ---------------------------------------------------------------- the command line
def _cli(capsys, *argv):
    status = main(list(argv))
    err = capsys.readouterr().err
    return status, err


def test_cli_unknown_profile(capsys):
    status, err = _cli(capsys, "plan", "--profile", "no_such_profile")
    assert status == 2 and err.count("\n") == 1 and "no profile 'no_such_profile'" in err


def test_cli_profile_with_an_unknown_key(tmp_path, capsys):
    path = _profile_file(tmp_path, "probes: {}\n")
    status, err = _cli(capsys, "plan", "--profile", str(path))
    assert status == 2 and err.count("\n") == 1 and "mine.yaml" in err and "unknown key probes" in err


def test_cli_unknown_encoder(capsys):
    status, err = _cli(capsys, "score", "--profile", "smoke", "--encoder", "general.vit_b17")
    assert status == 2 and err.count("\n") == 1 and "general.vit_b17" in err
