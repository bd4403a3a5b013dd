"""``crsrepro dry-run``: the paper's architectures at real size, random weights, on real images (issue 25).

The fast tests check the real-size table against the specs on the meta device (no memory, no time) and the
choice of images; the slow tests run a reduced dry run (extraction of every tap at native size, one LoRA step and
the protocol's tail) on BioViL at 480 px and a ViT-B/16, and, opt-in (``make test-real-size``), on the three
largest architectures (MedSigLIP at 448 px, MedGemma at 896 px, LLaVA-Med's ViT-L/14-336), whose real-size CPU
runs take many minutes. Real images come from ../shared/realdata/images; tests that need them skip when it is
absent.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from crsrepro.encoders import get_encoder_spec, paper
from crsrepro.profiles import load_profile
from crsrepro.tools import dry_run as dr

IMAGES = Path(__file__).resolve().parents[2] / "shared" / "realdata" / "images"
needs_images = pytest.mark.skipif(not IMAGES.is_dir(), reason=f"{IMAGES} is absent (real images for the dry run)")
PAPER_IDS = [spec.id for spec, _ in paper.PAPER_ENCODERS]


def test_every_paper_encoder_has_a_real_size_and_every_paper_dataset_a_stand_in_or_a_reason():
    assert set(dr.REAL_SIZE) == set(PAPER_IDS)
    assert set(dr.STAND_INS) == {"isic2019", "aptos2019", "chexpert", "mimic_cxr"}
    assert dr.STAND_INS["aptos2019"] is None  # no fundus images in the shared copy: skipped, and said so


@pytest.mark.parametrize("encoder_id", PAPER_IDS)
def test_the_real_size_of_every_architecture_has_the_spec_parameter_count(encoder_id):
    with torch.device("meta"):  # nothing allocated
        model = dr.real_size_model(get_encoder_spec(encoder_id))
    assert sum(p.numel() for p in model.parameters()) == get_encoder_spec(encoder_id).n_params


@pytest.mark.parametrize("encoder_id", ["general.resnet50", "specialist.biovil"])
def test_the_random_checkpoint_in_the_release_layout_builds_at_real_size_through_the_builder(encoder_id, tmp_path):
    """The two smallest (the others take the slow test and the full dry run); BioViL's MD5 check is skipped."""
    spec = get_encoder_spec(encoder_id)
    encoder = dr.build_at_real_size(spec, tmp_path)
    assert sum(p.numel() for p in encoder.model.parameters()) == spec.n_params
    # every parameter jittered: timm's zero-initialised last BatchNorm of each block would block LoRA gradients
    assert all(float(m.weight.detach().abs().min()) > 0 for m in encoder.model.modules()
               if isinstance(m, torch.nn.BatchNorm2d))
    if encoder_id == "specialist.biovil":
        assert spec.weight_md5 is not None and (tmp_path / encoder_id / spec.weight_files[0]).is_file()


@needs_images
def test_one_image_per_class_and_nih_labels_that_differ():
    domains, notes = dr.load_domains(IMAGES, ["isic2019", "aptos2019", "chexpert", "mimic_cxr"])
    assert notes == [f"aptos2019: no stand-in in {IMAGES}; skipped"]
    by = {d.paper_dataset: d for d in domains}
    assert sorted(by["isic2019"].labels.tolist()) == [0, 1, 2] and sorted(by["mimic_cxr"].labels.tolist()) == [0, 1]
    nih = by["chexpert"].labels
    assert nih.shape[0] == 2 and nih[0].sum() == 0 and np.all(nih[0] != nih[1])


def _reduced_dry_run(encoders, scratch):
    """The text of the dry run's report on ``encoders``, on one domain, the CheXpert stand-in (2 NIH images),
    without the grid."""
    lines = []
    reduced = load_profile("paper", overrides={"datasets": ["chexpert"], "transfer": {}})
    table = dr.dry_run(reduced, images_root=IMAGES, encoders=encoders, scratch=scratch, grid=False, threads=1,
                       out=lines.append)
    assert list(table["encoder"]) == sorted(encoders, key=lambda e: get_encoder_spec(e).n_params
                                            * get_encoder_spec(e).input_size ** 2)
    assert (table["peak_gb"] > 0).all() and (table["extract_img_s"] > 0).all() and table["crs"].notna().all()
    return "\n".join(lines)


LARGEST = sorted(PAPER_IDS, key=lambda e: get_encoder_spec(e).n_params, reverse=True)[:3]


def test_the_three_largest_architectures_are_medsiglip_medgemma_and_llava_med():
    assert set(LARGEST) == {"medical.medsiglip", "medical.medgemma", "medical.llava_med"}


@pytest.mark.slow
@needs_images
def test_a_reduced_dry_run_of_biovil_at_480_px_and_a_vit_b16(tmp_path):
    """BioViL's ResNet-50 at its native 480 px and the ViT-B/16 (86M parameters), each built at real size through
    its builder from a random checkpoint in its release layout, every tap extracted, one LoRA step; two encoders,
    since the CRS of the protocol's tail needs a peer on each dataset. The three largest take the opt-in test below
    (LLaVA-Med's tower beside ResNet-50 alone took 201 s of `make test`'s 10 minutes)."""
    text = _reduced_dry_run(["specialist.biovil", "general.vit_b16"], tmp_path)
    assert "images at 480 px" in text and "images at 224 px" in text and "(= spec)" in text
    assert text.count("frozen base unchanged bit for bit") == 2


@pytest.mark.slow
@pytest.mark.real_size
@needs_images
def test_a_reduced_dry_run_of_the_three_largest_architectures(tmp_path):
    """MedSigLIP (429M parameters at 448 px), MedGemma's Gemma3 vision tower at 896 px (4,096 tokens; its CPU
    forward is about 35 s an image and its LoRA step about two minutes) and LLaVA-Med's ViT-L/14-336 tower. `make
    test` leaves them out: they took 19 of its 24 minutes beside the other slow tests on 2 cores (486 s alone).
    Run them with `make test-real-size`; `crsrepro dry-run` runs them with the other 12."""
    text = _reduced_dry_run(LARGEST, tmp_path)
    assert "images at 448 px" in text and "images at 896 px" in text and "images at 336 px" in text
    assert "(= spec)" in text
    assert text.count("frozen base unchanged bit for bit") + text.count("LoRA: skipped") == 3


@pytest.mark.slow
@needs_images
def test_the_grid_on_two_real_size_encoders_freezes_a_frame_and_executes_a_chapter(tmp_path):
    """Step 5: the run grid reads the random checkpoints through the paper builders, and chapter 01 executes."""
    import nbformat

    lines = []
    fewer = {"isic2017": 40, "kermany_cxr": 40, "nih_cxr14": 100}  # 180 images, not the command's 450
    assert set(fewer) == set(dr.GRID_SUBSAMPLE)                      # every step the same
    results = dr.grid_and_chapter(IMAGES, tmp_path, book_root=Path(__file__).resolve().parents[1], subsample=fewer,
                                  out=lines.append)
    assert set(results["encoder"]) == set(dr.GRID_ENCODERS)
    assert set(results["dataset"]) == set(fewer)
    assert (tmp_path / "manifests" / "crs_reference_paper-dryrun.yaml").is_file()
    executed = nbformat.read(tmp_path / f"{dr.CHAPTER}.ipynb", as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors and "executed by papermill" in lines[-1]
