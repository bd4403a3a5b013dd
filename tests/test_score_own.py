"""Score your own encoder (issue 28; DESIGN.md sections 1, 4 and 9): a spec file and a Python entry point
scored against a smoke-derived frozen frame, the bad inputs refused in one line, and a panel member
described by a spec file scored exactly at its published score.

The frame is frozen once per module from a narrowed copy of the smoke profile (conftest's micro grid: one
dataset, one perturbation, here with three encoders; about 10 s on a 2-core CPU) in the micro world's
scratch CRSREPRO_HOME and manifest folder.
"""

import hashlib
import subprocess
import sys
import warnings

import pandas as pd
import pytest
import torch
import yaml

from crsrepro.encoders.registry import forget_newcomers
from crsrepro.encoders.user import UserEncoderError, load_entry_point, load_spec_file

PROFILE_YAML = """# the micro grid of conftest (smoke, narrowed to APTOS and one perturbation) with a committed-weights CNN
include: micro.yaml
name: scoreown
encoders: [demo.color_histogram, demo.med_cnn, demo.random_cnn]
output_dir: .crsrepro/scoreown/results
"""

NETWORK = '''
import torch
from torch import nn


class Net(nn.Module):
    """A small convolution, global-average-pooled: [B, 3, S, S] -> [B, 16]."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            self.conv = nn.Conv2d(3, 16, 5, stride=2)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean(dim=(2, 3))


class Unpooled(Net):
    def forward(self, x):
        return torch.relu(self.conv(x)).flatten(2)


class Broken(Net):
    def forward(self, x):
        return super().forward(x) * float("nan")


def build():
    return Net(), {"input_size": 64, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bilinear"}


def bare():
    return Net()


def unpooled():
    return Unpooled()


def broken():
    return Broken()
'''


def med_cnn_spec(**changes) -> dict:
    """The spec-file fields of the panel member demo.med_cnn, as a user would write them."""
    from crsrepro.encoders.demo import WEIGHTS_DIR

    return {"builder": "demo", "family": "medical", "architecture": "tiny_cnn",
            "weights": str(WEIGHTS_DIR / "med_cnn.safetensors"), "input_size": 96, "interpolation": "bilinear",
            "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "pooling": "gap", "licence": "CC0-1.0", **changes}


def write_spec(folder, name: str, fields: dict):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def crsrepro(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "crsrepro", "-q", *args], capture_output=True, text=True, cwd=cwd,
                          env=env)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crsrepro: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(autouse=True)
def _registry_as_filled():
    """Each test's newcomers leave the registry afterwards (other test files loop over it)."""
    from crsrepro.run.units import clear_encoder_cache

    yield
    forget_newcomers()
    clear_encoder_cache()


@pytest.fixture()
def network(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(NETWORK)
    return path


@pytest.fixture(scope="module")
def frozen(micro_world):
    """The micro grid with three encoders, run and frozen once, in the micro world's scratch home."""
    from crsrepro.profiles import load_profile
    from crsrepro.run.grid import run_grid
    from crsrepro.score.frame import freeze_frame

    root = micro_world.root
    (root / "scoreown.yaml").write_text(PROFILE_YAML)
    profile = load_profile(root / "scoreown.yaml")
    freeze_frame(profile, run_grid(profile, progress=False))
    env = {"CRSREPRO_HOME": str(root / ".crsrepro"), "CRSREPRO_MANIFESTS": str(root / "manifests")}
    return root, profile, env


# ------------------------------------------------------------------ bad inputs (no grid)

@pytest.mark.parametrize("change, field", [
    ({"builder": "keras"}, "'builder'"),
    ({"family": "veterinary"}, "'family'"),
    ({"weights": "nowhere/med_cnn.safetensors"}, "'weights'"),
    ({"std": [0.5, 0.0, 0.5]}, "'std'"),
    ({"interpolation": "lanczos"}, "'interpolation'"),
    ({"input_size": -3}, "'input_size'"),
    ({"pooling": None}, "'pooling'"),
    ({"colour": "red"}, "'colour'"),
    ({"embed_dim": 64}, "'embed_dim'"),
    ({"architecture": "resnet9000"}, "'architecture'"),
])
def test_a_bad_spec_field_is_named(tmp_path, change, field):
    with pytest.raises(UserEncoderError, match=field):
        load_spec_file(write_spec(tmp_path, "bad", med_cnn_spec(**change)))


@pytest.mark.parametrize("function, message", [("unpooled", r"to \[2, 16, \d+\], expected \[2, D\]"),
                                               ("broken", "NaN")])
def test_an_embedding_that_is_not_a_finite_vector_is_refused(network, function, message):
    with pytest.raises(UserEncoderError, match=message):
        load_entry_point(f"{network}:{function}")


def test_a_bare_module_gets_the_documented_defaults(network):
    newcomer = load_entry_point(f"{network}:bare")
    assert newcomer.spec.input_size == 224 and newcomer.spec.mean == (0.485, 0.456, 0.406)
    assert newcomer.spec.resize_mode == "crop" and newcomer.spec.embed_dim == 16
    assert set(newcomer.defaults_used) == {"input_size", "mean", "std", "interpolation", "resize_mode"}
    assert load_entry_point(f"{network}:build").defaults_used == ("resize_mode",)


def test_the_cli_refuses_a_missing_frame_in_one_line_naming_the_profile(tmp_path, network, cli):
    env = {"CRSREPRO_HOME": tmp_path / ".crsrepro", "CRSREPRO_MANIFESTS": tmp_path / "manifests"}
    (tmp_path / "manifests").mkdir()
    assert_one_line_error(cli("score", "--profile", "smoke", "--encoder", "mine:build", cwd=tmp_path, env=env),
                          "profile 'smoke'", "no CRS reference frame", "crs_reference_smoke.yaml")
    assert_one_line_error(cli("score", "--profile", "smoke", "--spec", str(tmp_path / "none.yaml"),
                              cwd=tmp_path, env=env), "profile 'smoke'", "no CRS reference frame")


# ------------------------------------------------------------------ scored against the frozen frame

@pytest.mark.slow
def test_a_spec_file_is_scored_through_the_panels_cache_under_its_own_key(frozen, tmp_path, network, monkeypatch):
    from crsrepro.analyse.new_encoder import score_newcomer
    from crsrepro.extract.features import feature_keys
    from crsrepro.present.score_report import score_text, write_report

    _, profile, _ = frozen
    module = {}
    exec(compile(NETWORK, str(network), "exec"), module)
    with warnings.catch_warnings():  # the user's side: torch deprecates TorchScript
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(module["Net"]()).save(str(tmp_path / "net.pt"))
    spec = write_spec(tmp_path, "scripted", {"builder": "torchscript", "architecture": "Net", "weights": "net.pt",
                                             "input_size": 64, "interpolation": "bilinear", "mean": [0.5] * 3,
                                             "std": [0.5] * 3, "pooling": "image_embed", "licence": "MIT"})
    newcomer = load_spec_file(spec, panel=profile.encoders)
    assert newcomer.id == "user.scripted" and newcomer.twin_of is None and newcomer.spec.embed_dim == 16
    assert newcomer.weights_hash == hashlib.sha256((tmp_path / "net.pt").read_bytes()).hexdigest()
    score = score_newcomer(profile, newcomer, progress=False)
    cell = score.cells.set_index("dataset").loc["aptos2019"]
    assert 0 <= cell["crs_ci_low"] <= cell["crs"] <= cell["crs_ci_high"] <= 1
    a = score.aggregate
    published = score.panel["crs"]
    assert a["rank"] == 1 + int((published > a["crs"]).sum()) and a["n_published"] == 3
    assert a["ci_low"] <= a["crs"] <= a["ci_high"] and 0 <= a["p_rank1"] <= a["p_top3"] <= 1
    assert a["n_resamples"] > 0 and score.panel[["ci_low", "ci_high"]].notna().all().all()
    # scored again (chapter 10 executed again after an edit): the bootstrap is read, not resampled
    from crsrepro.score import stats
    monkeypatch.setattr(stats, "crs_bootstrap", lambda *args, **kwargs: pytest.fail("bootstrapped a second time"))
    again = score_newcomer(profile, newcomer, progress=False)
    assert again.aggregate == a
    pd.testing.assert_frame_equal(again.cells, score.cells)
    monkeypatch.undo()
    # its features sit in the panel's cache, under keys of its weights' bytes and its spec
    from crsrepro.encoders import create_encoder
    from crsrepro.run.views import view
    encoder = create_encoder("user.scripted")
    prepared = view(profile, "aptos2019")
    keys = feature_keys(encoder, prepared.pool.images, dataset="aptos2019", images_key=prepared.images_key,
                        conditions=("clean",), layers=("final",), canonical_size=None)
    assert all(next(profile.feature_cache_path.rglob(f"{key}.npy"), None) for key in keys.values())
    # the terminal and the report say the same
    text = score_text(score)
    page = write_report(score, tmp_path / "report")
    html = page.read_text()
    for needle in (score.frame_hash, score.version, f"{a['crs']:.3f}", f"{a['ci_low']:.3f}"):
        assert needle in html and needle[:16] in text
    cells = pd.read_csv(page.parent / "cells.csv")
    assert cells["crs"].iloc[0] == pytest.approx(cell["crs"], abs=1e-12)
    assert (page.parent / "profile.png").stat().st_size > 1000
    assert {e for names in cells["dominates"].dropna() for e in str(names).split(", ")} - {""} <= set(profile.encoders)


@pytest.mark.slow
def test_an_entry_point_is_scored_by_the_command_with_its_report(frozen, network):
    root, _, env = frozen
    folder = network.parent
    result = crsrepro("score", "--profile", str(root / "scoreown.yaml"), "--encoder", "mine:bare", "--report",
                      str(folder / "report"), cwd=folder, env={**__import__("os").environ, **env})
    assert result.returncode == 0, result.stderr
    assert "user.mine_bare on profile scoreown" in result.stdout
    assert "documented defaults were used: input_size 224" in result.stdout
    panel = pd.read_csv(folder / "report" / "panel.csv")
    row = panel[panel["encoder"] == "user.mine_bare (scored)"].iloc[0]
    assert f"aggregate CRS {row['crs']:.3f}" in result.stdout and len(panel) == 4
    assert "user.mine_bare" in (folder / "report" / "index.html").read_text()
    refused = crsrepro("score", "--profile", str(root / "scoreown.yaml"), "--encoder", "mine:unpooled", cwd=folder,
                       env={**__import__("os").environ, **env})
    assert_one_line_error(refused, "user.mine_unpooled", "expected [2, D]")


@pytest.mark.slow
def test_a_panel_member_through_a_spec_file_gets_its_published_score_exactly(frozen, tmp_path):
    from crsrepro.analyse.new_encoder import score_newcomer
    from crsrepro.score.crs import aggregate_crs
    from crsrepro.score.frame import reference_frame

    _, profile, _ = frozen
    newcomer = load_spec_file(write_spec(tmp_path, "my_med_cnn", med_cnn_spec()), panel=profile.encoders)
    assert newcomer.twin_of == "demo.med_cnn" and newcomer.id == "demo.med_cnn"
    score = score_newcomer(profile, newcomer, progress=False)
    published = reference_frame(profile).published_scores().set_index(["encoder", "dataset"])
    for row in score.cells.itertuples():
        assert row.crs == published.loc[("demo.med_cnn", row.dataset), "crs"]
    assert score.aggregate["crs"] == aggregate_crs(reference_frame(profile).published_scores()).loc["demo.med_cnn", "crs"]
    assert "describes panel member demo.med_cnn" in " ".join(score.notes)
    # other weights in the same spec are a newcomer, not the member
    from crsrepro.encoders.demo import WEIGHTS_DIR
    other = load_spec_file(write_spec(tmp_path, "derm", med_cnn_spec(weights=str(WEIGHTS_DIR / "derm_cnn.safetensors"))),
                           panel=profile.encoders)
    assert other.twin_of is None and other.id == "user.derm"
    assert other.weights_hash != newcomer.weights_hash


@pytest.mark.slow
def test_a_stale_frame_is_refused_naming_the_profile(frozen, tmp_path):
    from crsrepro.analyse.new_encoder import NewcomerError, checked_frame
    from crsrepro.score.crs import ReferenceFrame
    from crsrepro.score.frame import frame_path

    _, profile, _ = frozen
    frame = ReferenceFrame.load(frame_path(profile))
    assert checked_frame(profile).content_hash() == frame.content_hash()
    ReferenceFrame(reference=frame.reference, anchors=frame.anchors, weights=frame.weights,
                   description=frame.description, results_hash="0" * 64).save(frame_path(profile, tmp_path))
    with pytest.raises(NewcomerError, match="profile 'scoreown'.*the frame is stale"):
        checked_frame(profile, tmp_path)
