"""The CLI: user errors are one line on stderr with exit status 2, never a traceback.

The error cases run the CLI in the worker (the ``cli`` fixture of conftest.py);
``test_both_entry_points_list_profiles`` runs the two real entry points as subprocesses.
"""

import subprocess
import sys

import pytest
import yaml


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crsrepro: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_profile(cli, tmp_path):
    assert_one_line_error(cli("run", "--profile", "nope", cwd=tmp_path), "no profile 'nope'", "nope.yaml")


def test_unknown_encoder(cli, tmp_path):
    assert_one_line_error(cli("score", "--encoder", "demo.effnet_lite", "--profile", "smoke", cwd=tmp_path),
                          "demo.effnet_lite")


def test_dataset_root_that_does_not_exist(cli, tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text(yaml.safe_dump({"include": "smoke", "name": "mine",
                                       "data": {"source": "local", "root": str(tmp_path / "missing")}}))
    assert_one_line_error(cli("run", "--profile", str(profile), cwd=tmp_path), str(tmp_path / "missing"))


def test_notebook_outside_a_checkout(cli, tmp_path):
    assert_one_line_error(cli("notebook", "01_discrimination", "--profile", "smoke", cwd=tmp_path),
                          "_config.yml")


@pytest.mark.parametrize("entry", [["crsrepro"], [sys.executable, "-m", "crsrepro"]])
def test_both_entry_points_list_profiles(entry, tmp_path):
    from pathlib import Path
    exe = entry if entry[0] != "crsrepro" else [str(Path(sys.executable).parent / "crsrepro")]
    result = subprocess.run([*exe, "list", "profiles"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.split() == ["demo", "demo-seeds20", "paper", "real-mini", "smoke"]


def test_score_without_a_frozen_frame_says_so(cli, tmp_path):
    result = cli("score", "--encoder", "demo.texture", "--profile", "smoke", cwd=tmp_path)
    assert_one_line_error(result, "no CRS reference frame", "crs_reference_smoke.yaml")


def test_freeze_frame_without_results_names_the_command(cli, tmp_path):
    result = cli("freeze-frame", "--profile", "smoke", cwd=tmp_path, env={"CRSREPRO_HOME": tmp_path / ".crsrepro"})
    assert_one_line_error(result, "no grid results", "crsrepro run --profile smoke")
