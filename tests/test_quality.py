"""Tests for ``crsrepro quality-check`` (crsrepro.tools.quality): each statistic tracks its perturbation."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crsrepro.cli import main
from crsrepro.data.common import MIN_IMAGE_SIDE
from crsrepro.data.demo_world import sample_images
from crsrepro.tools.deployment import example_images
from crsrepro.core.vocab import SEVERITIES
from crsrepro.extract.perturb import perturb
from crsrepro.tools.quality import (SMALL, STATISTICS, TRACKS, folder_statistics, image_statistics, quality_check,
                                    robust_z)


FOV_SATURATED = 0.995


@pytest.mark.parametrize("dataset", ["aptos2019", "isic2019", "chexpert"])
@pytest.mark.parametrize("statistic", STATISTICS)
def test_each_statistic_moves_with_its_perturbation(statistic, dataset):
    perturbation, direction = TRACKS[statistic]
    images, _ = sample_images(dataset, 3, seed=0, image_size=128)
    means = [np.mean([image_statistics(im)[statistic] for im in images])]
    means += [np.mean([image_statistics(perturb(im, perturbation, s, f"img{i}"))[statistic]
                       for i, im in enumerate(images)]) for s in SEVERITIES]
    if statistic == "field_of_view":  # once a crop has removed the dark corners, the share saturates at
        means = np.minimum(means, FOV_SATURATED)  # ~1 and what is left is resampling noise (demo world v3)
    steps = np.diff(means) * (1 if direction == "up" else -1)
    assert np.all(steps >= 0) and steps.sum() > 0, means
    if dataset == "aptos2019":  # fundus images have a black surround, so even the field of view never saturates
        assert np.all(steps > 0), means


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    return {"reference": example_images(root / "reference", n=16, seed=0),
            "clean": example_images(root / "clean", n=6, seed=1),
            "blurred": example_images(root / "blurred", n=6, seed=1, condition="gaussian_blur@2")}


def test_a_blurred_folder_is_flagged_against_a_clean_reference(folders, tmp_path, capsys):
    report = quality_check(folders["blurred"], reference=folders["reference"], out=tmp_path / "report.csv")
    assert report.flag_counts()["laplacian_var"] == 6
    assert report.flag_counts()[["blockiness", "rms_contrast", "field_of_view"]].sum() == 0
    assert (report.table["z_laplacian_var"] < -3.5).all()
    written = pd.read_csv(tmp_path / "report.csv")
    assert list(written["file"]) == [f"fundus_{i:03d}.png" for i in range(6)]
    assert written["flagged"].str.contains("laplacian_var").all()
    clean = quality_check(folders["clean"], reference=folders["reference"])
    assert clean.flag_counts().sum() == 0
    assert main(["quality-check", "--images", str(folders["blurred"]), "--reference", str(folders["reference"])]) == 0
    printed = capsys.readouterr().out
    assert "6 of 6 images flagged" in printed and "gaussian_blur (down)" in printed


def test_robust_z_is_zero_at_the_reference_median():
    reference = pd.DataFrame({"laplacian_var": [1e-3, 2e-3, 4e-3], "rms_contrast": [0.1, 0.2, 0.3]})
    z = robust_z(pd.DataFrame({"laplacian_var": [2e-3, 8e-3], "rms_contrast": [0.2, 0.4]}), reference)
    assert z.iloc[0].tolist() == [0.0, 0.0]
    assert z["laplacian_var"].iloc[1] == pytest.approx(0.6745 * 2)  # two doublings, on the log scale
    assert z["rms_contrast"].iloc[1] == pytest.approx(0.6745 * 2)


def test_an_unreadable_image_is_named_or_counted(folders, tmp_path, capsys):
    folder = example_images(tmp_path / "mixed", n=3, seed=2)
    (folder / "broken.png").write_bytes(b"not a png")
    assert main(["quality-check", "--images", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.png: not a readable image" in err[0]
    report = quality_check(folder, skip_unreadable=True)
    assert len(report.table) == 3 and [p.name for p in report.unreadable] == ["broken.png"]
    assert any("skipped 1 unreadable" in line for line in report.lines())
    assert main(["quality-check", "--images", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: not a folder" in capsys.readouterr().err


def test_16_bit_images_are_scaled_as_the_loaders_scale_them_not_clipped(tmp_path):
    ramp = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0 .. 65520
    folder = tmp_path / "sixteen"
    folder.mkdir()
    Image.fromarray(ramp).save(folder / "ramp16.png")
    assert Image.open(folder / "ramp16.png").mode.startswith("I")
    table, _ = folder_statistics(folder)
    eight_bit = image_statistics((ramp // 257).astype(np.uint8))
    assert table.loc[0, "rms_contrast"] == pytest.approx(eight_bit["rms_contrast"])
    assert table.loc[0, "rms_contrast"] > 0.25  # PIL's clipping would leave almost every pixel white (about 0.04)


def test_images_smaller_than_the_minimum_side_are_flagged(folders, tmp_path, capsys):
    folder = example_images(tmp_path / "with_tiny", n=6, seed=4)
    Image.new("RGB", (1, 1), (90, 40, 20)).save(folder / "tiny.png")
    Image.new("RGB", (MIN_IMAGE_SIDE, 200), (90, 40, 20)).save(folder / "narrow_but_enough.png")
    report = quality_check(folder, reference=folders["reference"])
    flagged = dict(zip(report.table["file"], report.table["flagged"]))
    assert SMALL in flagged["tiny.png"].split(";")
    assert SMALL not in flagged["narrow_but_enough.png"].split(";")
    assert report.flag_counts()[SMALL] == 1
    assert main(["quality-check", "--images", str(folder), "--reference", str(folders["reference"])]) == 0
    printed = capsys.readouterr().out
    assert f"a side < {MIN_IMAGE_SIDE} px" in printed and "tiny.png: " in printed
