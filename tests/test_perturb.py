"""Perturbations: determinism, pairing by image id, monotone damage, shape and dtype kept (DESIGN.md section 6)."""

import numpy as np
import pytest

from crsrepro.core.vocab import PERTURBATIONS
from crsrepro.data.demo_world import sample_images
from crsrepro.extract.perturb import EXTRA_PERTURBATIONS, apply_condition, perturb

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
    """Images at 256 px, where the 512-px parameters are not lost below quantisation."""
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
    # at the demo's 96 px a 512-px blur of sigma 1 may round away; damage still never shrinks
    small = [_mse(perturb(images[kind], name, s, "img7"), images[kind]) for s in (1, 2, 3)]
    assert small[0] <= small[1] < small[2], small


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


@pytest.mark.parametrize("severity,sigma_at_512", [(1, 1.0), (2, 2.0), (3, 4.0)])
def test_blur_sigma_is_relative_to_a_512_px_short_side(severity, sigma_at_512):
    spreads = {}
    for side in (512, 1024):
        line = np.zeros((side // 2, side), np.uint8)        # the short side is the height
        line[:, side // 2] = 255
        profile = perturb(line, "gaussian_blur", severity, "x")[side // 4].astype(float)
        offsets = np.arange(side) - side // 2
        spreads[side] = np.sum(profile * offsets ** 2) / profile.sum()
    # pixel integration adds 1/12 px^2; the short side 256 -> sigma halves, 512 -> as given
    expected_256 = (sigma_at_512 * 256 / 512) ** 2 + 1 / 12
    expected_512 = sigma_at_512 ** 2 + 1 / 12
    assert spreads[512] == pytest.approx(expected_256, rel=0.1)
    assert spreads[1024] == pytest.approx(expected_512, rel=0.1)


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

