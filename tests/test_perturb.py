"""Perturbations: determinism, pairing by image id, monotone damage, shape and dtype kept (DESIGN.md section 6)."""

import numpy as np
import pytest
from PIL import Image

from crsrepro.core.vocab import PERTURBATIONS
import crsrepro.extract.perturb as perturb_module
from crsrepro.data.demo_world import sample_images
from crsrepro.extract.perturb import (BLUR_SIGMA_FRACTION, CONTRAST_FACTOR, EXTRA_PERTURBATIONS, FOV_KEEP, JPEG_QUALITY,
                                      RICIAN_SIGMA, apply_condition, parameter_table, perturb)

ALL = PERTURBATIONS + EXTRA_PERTURBATIONS
NOISY = ("rician_noise", "poisson_gaussian", "sensor_noise")


@pytest.fixture(scope="module")
def images():
    derm, _ = sample_images("isic2019", 1, seed=3, image_size=96)
    cxr, _ = sample_images("chexpert", 1, seed=3, image_size=96)
    return {"rgb": derm[0], "gray": cxr[0][..., 0], "gray1": cxr[0][..., :1]}


def test_the_extra_perturbations_are_beyond_the_paper_s():
    assert not set(EXTRA_PERTURBATIONS) & set(PERTURBATIONS)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind", ["rgb", "gray", "gray1"])
def test_shape_dtype_kept_and_deterministic(images, name, kind):
    image = images[kind]
    for severity in (1, 2, 3):
        out = perturb(image, name, severity, "ISIC_0000001")
        assert out.shape == image.shape and out.dtype == np.uint8
        assert np.array_equal(out, perturb(image.copy(), name, severity, "ISIC_0000001"))
    assert np.array_equal(image, images[kind])   # the input is never modified


@pytest.fixture(scope="module")
def large_images():
    """Images at 256 px: the damage grows with severity at a second size too."""
    derm, _ = sample_images("isic2019", 1, seed=4, image_size=256)
    cxr, _ = sample_images("chexpert", 1, seed=4, image_size=256)
    return {"rgb": derm[0], "gray": cxr[0][..., 0]}


def _mse(a, b):
    return float(np.mean((a.astype(float) - b.astype(float)) ** 2))


@pytest.mark.parametrize("name", [p for p in ALL if p != "fov_crop"])
@pytest.mark.parametrize("kind", ["rgb", "gray"])
def test_damage_grows_with_severity(images, large_images, name, kind):
    errors = [_mse(perturb(large_images[kind], name, s, "img7"), large_images[kind]) for s in (1, 2, 3)]
    assert 0 < errors[0] < errors[1] < errors[2], errors
    small = [_mse(perturb(images[kind], name, s, "img7"), images[kind]) for s in (1, 2, 3)]
    assert 0 < small[0] < small[1] < small[2], small


def test_fov_crop_damage_grows_and_keeps_the_centre(images):
    x, y = np.meshgrid(np.arange(96) - 47.5, np.arange(96) - 47.5)
    radial = np.clip(np.hypot(x, y) * 3, 0, 255).astype(np.uint8)     # a crop zooms: radii shrink
    outs = [perturb(radial, "fov_crop", s, "x") for s in (1, 2, 3)]
    errors = [_mse(o, radial) for o in outs]
    assert 0 < errors[0] < errors[1] < errors[2], errors
    assert outs[2][0, 48] == pytest.approx(0.6 * radial[0, 48], abs=6)
    out = perturb(images["gray"], "fov_crop", 3, "x")
    assert abs(int(out[48, 48]) - int(images["gray"][48, 48])) < 40


@pytest.mark.parametrize("name", NOISY)
def test_noise_depends_on_image_id_and_severity_seed(images, name):
    a = perturb(images["rgb"], name, 2, "id_a")
    b = perturb(images["rgb"], name, 2, "id_b")
    assert not np.array_equal(a, b)
    # the same id on a stack of identical images in another order gives identical damage
    assert np.array_equal(a, [perturb(images["rgb"], name, 2, i) for i in ("id_b", "id_a")][1])


@pytest.mark.parametrize("severity", [1, 2, 3])
def test_blur_sigma_is_a_fraction_of_the_image_s_own_short_side(severity, monkeypatch):
    used = []
    kernel = perturb_module.pixel_gaussian_kernel
    monkeypatch.setattr(perturb_module, "pixel_gaussian_kernel", lambda sigma: used.append(sigma) or kernel(sigma))
    for height, width in ((96, 128), (512, 700), (700, 512)):
        perturb(np.zeros((height, width), np.uint8), "gaussian_blur", severity, "x")
    fraction = BLUR_SIGMA_FRACTION[severity - 1]
    assert used == pytest.approx([fraction * 96, fraction * 512, fraction * 512])
    # the kernel is that Gaussian integrated over each pixel: variance sigma^2 + 1/12 (at 512 px, sigma > 2 px)
    k = kernel(fraction * 512)
    offsets = np.arange(len(k)) - len(k) // 2
    assert np.sum(k * offsets ** 2) == pytest.approx((fraction * 512) ** 2 + 1 / 12, rel=1e-3)


def test_severity_3_blur_does_the_same_relative_damage_at_96_and_512_px():
    """Blurring at 512 px then shrinking to 96 px gives what shrinking then blurring at 96 px gives, and
    that damage is no rounding error: the blur bites at the demo's size (the review of version 1)."""
    def shrink(image):
        return np.asarray(Image.fromarray(image).resize((96, 96), Image.BOX))
    big = sample_images("isic2019", 1, seed=5, image_size=512)[0][0]
    small = shrink(big)
    blurred_big, blurred_small = shrink(perturb(big, "gaussian_blur", 3, "x")), perturb(small, "gaussian_blur", 3, "x")
    damage_big, damage_small = _mse(blurred_big, small), _mse(blurred_small, small)
    assert damage_small > 100, damage_small    # MSE in 8-bit levels: 191 (version 1, sigma 4 px at 512: 51)
    assert damage_big == pytest.approx(damage_small, rel=0.2)
    assert _mse(blurred_big, blurred_small) < 0.1 * damage_small


def test_a_new_perturbation_version_changes_the_perturbed_keys_not_the_clean_ones(monkeypatch):
    from types import SimpleNamespace

    import pandas as pd

    from crsrepro.encoders import get_encoder_spec
    from crsrepro.extract import features

    encoder = SimpleNamespace(spec=get_encoder_spec("demo.random_cnn"), weights_hash="w")
    images = pd.DataFrame({"image_id": ["a", "b"]})
    args = dict(dataset="isic2019", images_key="k", conditions=("clean", "gaussian_blur@3"), layers=("final",),
                canonical_size=96)

    def keys():
        degraded = {c: features.degraded_image_key(dataset="isic2019", images_key="k", ids_hash="h", canonical_size=96,
                                                   condition=c) for c in args["conditions"]}
        return features.feature_keys(encoder, images, **args), degraded

    before = keys()
    monkeypatch.setattr(perturb_module, "PERTURBATION_VERSION", perturb_module.PERTURBATION_VERSION + 1)
    after = keys()
    assert after[0][("gaussian_blur@3", "final")] != before[0][("gaussian_blur@3", "final")]
    assert after[0][("clean", "final")] == before[0][("clean", "final")]
    assert after[1]["gaussian_blur@3"] != before[1]["gaussian_blur@3"]


def test_the_parameter_table_is_the_constants_and_the_docstring_shows_them():
    table = parameter_table(512)
    assert list(table["perturbation"].unique()) == list(ALL)
    blur = table[table["perturbation"] == "gaussian_blur"].iloc[0]
    assert [float(blur[f"severity {s}"]) for s in (1, 2, 3)] == pytest.approx(BLUR_SIGMA_FRACTION, rel=1e-2)
    assert blur["px at 512"] == " / ".join(f"{f * 512:.2f}" for f in BLUR_SIGMA_FRACTION)
    doc = {line.split()[0]: line for line in perturb_module.__doc__.splitlines() if line.split()[:1] in [[p] for p in ALL]}
    for name, values in (("jpeg", JPEG_QUALITY), ("contrast", CONTRAST_FACTOR), ("rician_noise", RICIAN_SIGMA),
                         ("fov_crop", FOV_KEEP)):
        assert ", ".join(f"{v:g}" for v in values) in doc[name], name
    assert "1/224, 3/224, 6/224" in doc["gaussian_blur"] and BLUR_SIGMA_FRACTION == (1 / 224, 3 / 224, 6 / 224)


def test_rician_noise_follows_its_formula():
    flat = np.zeros((200, 200), np.uint8)
    out = perturb(flat, "rician_noise", 3, "zero") / 255.0
    # on a zero image y = sqrt(n1^2 + n2^2): a Rayleigh variable with mean sigma sqrt(pi/2)
    assert abs(out.mean() - 0.10 * np.sqrt(np.pi / 2)) < 0.005


def test_conditions():
    image = np.full((8, 8, 3), 100, np.uint8)
    assert apply_condition(image, "clean", "x") is image
    assert np.array_equal(apply_condition(image, "contrast@1", "x"), perturb(image, "contrast", 1, "x"))
    assert np.array_equal(apply_condition(image, "sensor_noise@3", "x"), perturb(image, "sensor_noise", 3, "x"))
    for bad in ("jpeg", "jpeg@4", "blur@1", "jpeg@", "", "mimic_cxr"):  # mimic_cxr: a transfer set, not an image's
        with pytest.raises(ValueError, match=r"bad condition .*expected 'clean' or '<perturbation>@<1\|2\|3>' "
                                             r"with a perturbation among gaussian_blur, .*, sensor_noise"):
            apply_condition(image, bad, "x")


def test_bad_inputs():
    with pytest.raises(ValueError, match="uint8"):
        perturb(np.zeros((8, 8), np.float32), "jpeg", 1, "x")
    with pytest.raises(ValueError, match="unknown perturbation"):
        perturb(np.zeros((8, 8), np.uint8), "motion_blur", 1, "x")
    with pytest.raises(ValueError, match="severity"):
        perturb(np.zeros((8, 8), np.uint8), "jpeg", 0, "x")



def _runs(cells):
    """A runs table of the primary linear probe at 100 % labels: (encoder, dataset, seed, condition, auroc, ece)."""
    import pandas as pd

    return pd.DataFrame([dict(encoder=e, dataset=d, seed=s, label_fraction=1.0, condition=c, probe="linear",
                              layer="final", regime="frozen", recalibrator="none", auroc=a, ece=x)
                         for e, d, s, c, a, x in cells])


def test_the_modality_noise_table_sets_each_dataset_s_model_beside_rician():
    from crsrepro.analyse.robustness import modality_noise_table

    cells = []
    for encoder, hit in (("a", 0.0), ("b", 0.1)):
        for seed in (0, 1):
            cells += [(encoder, "chexpert", seed, "clean", 0.9, 0.05), (encoder, "chexpert", seed, "rician_noise@1", 0.8, 0.10),
                      (encoder, "chexpert", seed, "poisson_gaussian@1", 0.9 - hit - 0.02 * seed, 0.05 + hit),
                      (encoder, "chexpert", seed, "poisson_gaussian@2", 0.5, 0.3),      # no Rician at 2: no row
                      (encoder, "isic2019", seed, "clean", 0.9, 0.05), (encoder, "isic2019", seed, "rician_noise@1", 0.7, 0.1)]
    cells.append(("c", "chexpert", 0, "clean", 0.9, 0.05))      # an encoder without the conditions is not averaged
    table = modality_noise_table(_runs(cells), {"chexpert": "poisson_gaussian", "isic2019": "sensor_noise"})
    assert table[["dataset", "noise_model", "severity", "n_cells"]].values.tolist() == [["chexpert", "poisson_gaussian", 1, 2]]
    row = table.iloc[0]
    assert row["auroc_drop_rician"] == pytest.approx(0.1) and row["ece_rise_rician"] == pytest.approx(0.05)
    # seeds then encoders: encoder a drops 0.01 (mean of 0 and 0.02), b 0.11; ECE rises 0 and 0.1
    assert row["auroc_drop_model"] == pytest.approx(0.06) and row["ece_rise_model"] == pytest.approx(0.05)
    assert modality_noise_table(_runs(cells), {}).empty
    with pytest.raises(ValueError, match="unknown noise model"):
        modality_noise_table(_runs(cells), {"chexpert": "gaussian_noise"})


def test_perturbation_strength_lists_the_profile_s_perturbations_at_its_canonical_size():
    from types import SimpleNamespace

    from crsrepro.analyse.robustness import perturbation_strength
    from crsrepro.profiles import load_profile

    profile = load_profile("demo", overrides={"noise_model": {"chexpert": "poisson_gaussian", "isic2019": "sensor_noise"}})
    table = perturbation_strength(SimpleNamespace(profile=profile))
    assert list(table["perturbation"].unique()) == [*profile.perturbations, "poisson_gaussian", "sensor_noise"]
    assert table.loc[table["perturbation"] == "gaussian_blur", "px at 96"].item() == "0.43 / 1.29 / 2.57"
    paper_only = load_profile("smoke", overrides={"noise_model": {}})
    smoke = perturbation_strength(SimpleNamespace(profile=paper_only))   # its demo world stores 64-px images
    assert set(smoke["perturbation"]) == set(PERTURBATIONS) and smoke["px at 64"].iloc[0] == "0.29 / 0.86 / 1.71"


def test_the_grid_scores_each_dataset_s_noise_model_and_the_crs_leaves_it_out():
    """Issue 27.3: a profile's ``noise_model`` reaches the grid (the dataset's test features and its probes'
    conditions), and the paper-faithful runs (:func:`crsrepro.score.frame.scored_runs`) leave it out."""
    from crsrepro.profiles import load_profile
    from crsrepro.run.views import conditions_for
    from crsrepro.score.frame import scored_runs

    profile = load_profile("smoke", overrides={"noise_model": {"chexpert": "poisson_gaussian"}})
    assert conditions_for(profile, "chexpert")[-3:] == ["poisson_gaussian@1", "poisson_gaussian@3", "mimic_cxr"]
    assert not any(c.startswith("poisson_gaussian") for c in conditions_for(profile, "isic2019"))
    assert load_profile("demo").noise_model == {"isic2019": "sensor_noise", "aptos2019": "sensor_noise",
                                                "chexpert": "poisson_gaussian"}
    rows = [dict(encoder="e", family="f", dataset="chexpert", seed=0, label_fraction=1.0, probe="linear", layer="final",
                 regime="frozen", recalibrator="none", condition=c, metric="auroc", value=0.8)
            for c in ("clean", "rician_noise@1", "poisson_gaussian@1", "mimic_cxr")]
    import pandas as pd

    kept = scored_runs(profile, pd.DataFrame(rows))["condition"].tolist()
    assert sorted(kept) == ["clean", "mimic_cxr", "rician_noise@1"]
