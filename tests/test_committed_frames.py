"""Committed frames match the committed code (issue 26, item 10; DESIGN.md section 9).

A frozen CRS reference frame records the hash of the results it was frozen from
(:func:`crsrepro.run.results.results_hash`: the hash of the grid's row-set keys). Every row-set key is
a function of the code's inputs alone, so the hash the current code would give is known from the
planned keys, with no fitting (:meth:`crsrepro.run.grid.GridStage.plan` on an empty store). For each
committed ``data_manifests/crs_reference_<profile>.yaml`` this test derives it and fails when it
differs from the frame's: a change that alters keys must re-freeze the frame in the same commit
(``crsrepro run --profile P`` then ``crsrepro freeze-frame --profile P --overwrite``), or ``crsrepro
score --profile P`` refuses the stale frame.

A real-data profile is checked where its images are (``../shared/realdata/images``, or
``$CRSREPRO_REALDATA/images``) and skipped elsewhere. Slow: planning builds the panel's encoders and,
for a demo-world profile, writes the demo world (about a minute).
"""

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FRAMES = sorted((REPO / "data_manifests").glob("crs_reference_*.yaml"))
REALDATA = Path(os.environ.get("CRSREPRO_REALDATA", REPO.parent / "shared" / "realdata"))


def test_the_checkout_commits_frames():
    assert {p.name for p in FRAMES} >= {"crs_reference_demo.yaml", "crs_reference_real-mini.yaml"}


@pytest.mark.slow
@pytest.mark.parametrize("frame_file", FRAMES, ids=[p.stem.removeprefix("crs_reference_") for p in FRAMES])
def test_a_committed_frame_was_frozen_from_the_results_the_code_plans(frame_file, tmp_path, monkeypatch):
    from crsrepro.profiles import load_profile
    from crsrepro.run.grid import GridStage
    from crsrepro.run.results import ResultStore, keys_hash
    from crsrepro.score.crs import ReferenceFrame

    name = frame_file.stem.removeprefix("crs_reference_")
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / ".crsrepro"))
    manifests = shutil.copytree(REPO / "data_manifests", tmp_path / "data_manifests")  # the checkout stays as it is
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(manifests))
    profile = load_profile(name)
    if profile.data.source != "demo_world":
        if not (REALDATA / "images").is_dir():
            pytest.skip(f"profile {name!r} reads real images; none at {REALDATA / 'images'}")
        monkeypatch.setenv("CRSREPRO_DATA", str(REALDATA / "images"))
        profile = load_profile(name)
    frame = ReferenceFrame.load(frame_file)
    keys, _ = GridStage(manifest_dir=manifests).plan(profile, ResultStore(tmp_path / "no_results"))
    planned = keys_hash(keys)
    assert frame.results_hash == planned, (
        f"{frame_file.name} was frozen from results {frame.results_hash[:12]}, but this code's {name} grid hashes to "
        f"{planned[:12]} ({len(keys)} row-sets): re-freeze it in this commit (`crsrepro run --profile {name}`, then "
        f"`crsrepro freeze-frame --profile {name} --overwrite`)")
    assert sorted(p.name for p in manifests.iterdir()) == sorted(p.name for p in (REPO / "data_manifests").iterdir())
