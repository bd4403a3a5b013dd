"""Safe on shared machines (issue 26): explicit acts stay explicit, a profile owns its outputs, bad profiles
are refused before any work, permission and disk errors are one line, files get the umask's mode, and
``CRSREPRO_HOME=X`` puts everything under ``X``."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crsrepro.cli import ACTS, main, os_error_line
from crsrepro.core.errors import ProfileError
from crsrepro.core.io import atomic_write
from crsrepro.profiles import PROFILE_DIR, check_devices, list_profiles, load_profile
from crsrepro.score.frame import frame_path

# A narrowing of smoke that runs in seconds: one dataset, one encoder, one perturbation.
TINY = {"include": "smoke", "datasets": ["aptos2019"], "transfer": {}, "encoders": ["demo.color_histogram"],
        "seeds": [0], "label_fractions": [0.5, 1.0], "perturbations": ["jpeg"], "severities": [3],
        "control_probes": {"probes": []}}


def crsrepro(*args, cwd, home, umask=None):
    env = {**os.environ, "CRSREPRO_HOME": str(home), "CRSREPRO_MANIFESTS": str(cwd / "manifests")}
    return subprocess.run([sys.executable, "-m", "crsrepro", "-q", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def one_line_error(result, *fragments):
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crsrepro: error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def write_profile(folder: Path, name: str, data: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------ 1. explicit acts stay explicit

def cli_error(capsys, *argv) -> str:
    """``crsrepro ARGV`` in this process: status 2 and one error line, which is returned."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("crsrepro: error:"), err
    return err[0]


def test_freeze_frame_on_an_empty_run_refuses_and_names_the_cells(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("CRSREPRO_HOME", str(home))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(tmp_path / "manifests"))
    line = cli_error(capsys, "-q", "freeze-frame", "--profile", str(write_profile(tmp_path, "tiny", TINY)))
    for fragment in ("no grid results", "never runs the grid", "4 runs missing, in 1 cell:",  # 2 fractions x 2 conditions
                     "demo.color_histogram on aptos2019 (seed 0)", f"crsrepro run --profile {tmp_path / 'tiny.yaml'}"):
        assert fragment in line, line
    assert not home.exists() and not (tmp_path / "manifests").exists()  # it computed nothing and wrote nothing


def test_every_command_says_in_its_help_what_it_may_do(capsys):
    for command, acts in ACTS.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert " ".join(acts.split()) in text, command


def test_list_notebooks_outside_a_checkout_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert f"{tmp_path} is not a crsrepro checkout" in cli_error(capsys, "list", "notebooks")
    assert main(["list", "notebooks", "--book-root", str(Path(__file__).parents[1])]) == 0
    assert capsys.readouterr().out.split()[0] == "00_setup"


# ------------------------------------------------------------------ 2. profiles own their outputs

def test_an_including_profile_has_its_own_name_outputs_manifests_and_frame(tmp_path, monkeypatch):
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / "home"))
    smoke = load_profile("smoke")
    narrow = load_profile(write_profile(tmp_path, "narrow", {"include": "smoke", "seeds": [0]}))
    assert (narrow.name, narrow.manifests.name) == ("narrow", "narrow")
    assert narrow.output_path == tmp_path / "home" / "narrow" / "results" != smoke.output_path
    assert frame_path(narrow) != frame_path(smoke) and narrow.fingerprint() != smoke.fingerprint()
    # two levels, a relative include, and an explicit output_dir that is not passed on
    write_profile(tmp_path, "mid", {"include": "smoke", "output_dir": "elsewhere"})
    leaf = load_profile(write_profile(tmp_path, "leaf", {"include": "mid.yaml"}))
    assert leaf.name == "leaf" and leaf.output_path == tmp_path / "home" / "leaf" / "results"
    assert load_profile(tmp_path / "mid.yaml").output_path == tmp_path / "elsewhere"
    assert leaf.data.root == smoke.data.root  # its inputs are inherited: the same demo world is read


def test_a_profile_file_may_not_take_a_shipped_profiles_name(tmp_path):
    with pytest.raises(ProfileError, match="its name 'smoke' .* is a shipped profile's"):
        load_profile(write_profile(tmp_path, "mine", {"include": "demo", "name": "smoke"}))
    with pytest.raises(ProfileError, match="its name 'demo'"):
        load_profile(write_profile(tmp_path, "demo", {"include": "smoke"}))  # the file's name counts too
    assert load_profile("smoke", overrides={"seeds": [0]}).name == "smoke"  # the shipped file itself may


@pytest.mark.slow
def test_a_narrowed_profile_never_overwrites_the_one_it_includes(tmp_path):
    """``include`` plus a narrowing runs into its own folder; the included profile's table, frame and split
    manifests are untouched; everything lands under CRSREPRO_HOME with the umask's mode."""
    home = tmp_path / "home"
    write_profile(tmp_path, "tiny", TINY)
    write_profile(tmp_path, "narrower", {"include": "tiny.yaml", "seeds": [1]})
    for name in ("tiny", "narrower"):
        run = crsrepro("run", "--profile", f"{name}.yaml", "--executor", "serial", cwd=tmp_path, home=home, umask=0o022)
        assert run.returncode == 0, run.stderr
        if name == "tiny":
            tiny_table = (home / "tiny" / "results" / "results.parquet").read_bytes()
            assert crsrepro("freeze-frame", "--profile", "tiny.yaml", cwd=tmp_path, home=home).returncode == 0
            tiny_frame = (tmp_path / "manifests" / "crs_reference_tiny.yaml").read_bytes()
    assert (home / "tiny" / "results" / "results.parquet").read_bytes() == tiny_table
    assert (tmp_path / "manifests" / "crs_reference_tiny.yaml").read_bytes() == tiny_frame
    narrower = pd.read_parquet(home / "narrower" / "results" / "results.parquet")
    assert set(narrower["seed"]) == {1} and narrower.attrs["profile"] == "narrower"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "manifests", "narrower.yaml", "tiny.yaml"]
    assert sorted(p.name for p in home.iterdir()) == ["cache", "narrower", "smoke", "tiny"]
    unreadable = [p for p in home.rglob("*") if p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o044 != 0o044]
    assert not unreadable, unreadable[:3]
    assert stat.S_IMODE((home / "tiny" / "results" / "results.parquet").stat().st_mode) == 0o644


@pytest.mark.parametrize("override, fragment", [
    ({"seeds": [0, 0]}, "key seeds lists 0 more than once"),
    ({"encoders": ["demo.texture", "demo.texture"]}, "key encoders lists demo.texture more than once"),
    ({"datasets": ["aptos2019", "aptos2019"]}, "key datasets lists aptos2019 more than once"),
    ({"seeds": [2**32]}, "key seeds holds 4294967296, above 4294967295"),
    ({"seeds": [99999999999999999999]}, "above 4294967295"),
])
def test_plan_and_run_refuse_what_run_could_not_do(tmp_path, monkeypatch, capsys, override, fragment):
    """One validation (load_profile) for both: plan refuses what run would crash on, before any work."""
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / "home"))
    path = write_profile(tmp_path, "bad", {**TINY, **override})
    for command in ("plan", "run"):
        line = cli_error(capsys, command, "--profile", str(path))
        assert fragment in line and "bad.yaml" in line
    assert not (tmp_path / "home").exists()
    assert load_profile(write_profile(tmp_path, "good", {**TINY, "seeds": [0, 2**32 - 1]})).seeds == (0, 2**32 - 1)


def test_a_cuda_profile_without_a_gpu_is_refused_by_run_and_reported_by_plan(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CRSREPRO_HOME", str(tmp_path / "home"))
    path = write_profile(tmp_path, "gpu", {**TINY, "probe": {"device": "cuda"}})
    with pytest.raises(ProfileError, match=r"key probe\.device is 'cuda' but this machine has no CUDA GPU; to run "
                                           r"on the CPU, .*include: .*gpu\.yaml.*probe: \{device: cpu\}"):
        check_devices(load_profile(path))
    assert "probe: {device: cpu}" in cli_error(capsys, "run", "--profile", str(path))
    assert not (tmp_path / "home").exists()
    assert main(["plan", "--profile", str(path)]) == 0  # a plan needs no device, and says run would refuse
    assert "run would refuse here" in capsys.readouterr().err
    check_devices(load_profile(path, overrides={"probe": {"device": "cpu"}}))  # the CPU route it names works
    with pytest.raises(ProfileError, match="must be a torch device"):
        check_devices(load_profile(path, overrides={"probe": {"device": "cpu"}, "features": {"device": "gpu"}}))


# ------------------------------------------------------------------ 5. permission and disk errors are one line

@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs Linux's /sys, where nobody may create a folder")
def test_an_unwritable_folder_is_one_line_naming_it_and_v_adds_the_traceback(tmp_path):
    path = write_profile(tmp_path, "ro", {"include": "smoke", "data": {"root": "/sys/crsrepro-test/data"}})
    one_line_error(crsrepro("demo-world", "--profile", str(path), cwd=tmp_path, home=tmp_path / "home"),
                   "/sys: ", "/sys/crsrepro-test", "permissions and free space")
    verbose = crsrepro("-v", "demo-world", "--profile", str(path), cwd=tmp_path, home=tmp_path / "home")
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1].startswith("crsrepro: error: /sys: ")


def test_a_full_disk_names_the_file_and_its_folder(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "results" / "results.parquet"
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as caught:
        atomic_write(target, b"rows")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert not list(target.parent.iterdir())  # no temporary file is left
    assert os_error_line(caught.value).startswith(f"{target.parent}: No space left on device")


# ------------------------------------------------------------------ 6. shared folders

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_files_get_the_mode_of_the_process_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        written = atomic_write(tmp_path / "f.bin", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == mode


def test_crsrepro_home_holds_everything_a_shipped_profile_writes(tmp_path, monkeypatch):
    home = tmp_path / "X"
    monkeypatch.setenv("CRSREPRO_HOME", str(home))
    monkeypatch.setenv("CRSREPRO_DATA", str(tmp_path / "data"))
    for name in list_profiles():
        profile = load_profile(name)
        written = [profile.output_path, profile.feature_cache_path]
        if profile.data.source == "demo_world":  # generated data is written too; real data is only read
            written.append(profile.dataset_root(profile.datasets[0]))
        for path in written:
            assert path.is_relative_to(home), (name, path)
        raw = (PROFILE_DIR / f"{name}.yaml").read_text()
        assert ".crsrepro/" not in raw and "output_dir" not in raw, name  # no relative path, no inherited output
