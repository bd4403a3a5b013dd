"""Safe on shared machines (issue 26, Deliver 3): one run writes an output folder at a time, and a
second one waits, saying so, then finds the work done; runs of several profiles share the feature
cache without removing each other's files; the demo world is generated once, by one process, and a
killed generation leaves no world that looks complete."""

import json
import logging
import re
import subprocess
import sys
import threading
import time

import pytest

from crsrepro.data import demo_world
from crsrepro.run.stages import CACHE_LOCK, RUN_LOCK, output_lock, sharing_feature_cache

TINY_WORLD = {"n_images": {"aptos2019": 12}, "image_size": 16, "seed": 0}


def test_a_second_run_on_a_folder_waits_for_the_first_and_says_so(tmp_path, caplog):
    entered, release, order = threading.Event(), threading.Event(), []

    def first_run():
        with output_lock(tmp_path):
            entered.set()
            release.wait(30)
            order.append("first leaves")

    first = threading.Thread(target=first_run)
    first.start()
    assert entered.wait(30)
    assert re.match(r"pid \d+ on .+, since ", (tmp_path / RUN_LOCK).read_text())  # the holder says who it is
    threading.Timer(0.5, release.set).start()
    with caplog.at_level(logging.WARNING, logger="crsrepro.run.stages"):
        with output_lock(tmp_path):
            order.append("second enters")
    first.join()
    assert order == ["first leaves", "second enters"]
    assert re.search(rf"another crsrepro run is writing {re.escape(str(tmp_path))} \(pid \d+ on .+\); waiting",
                     caplog.text)


def test_a_run_alone_takes_the_folder_without_a_message(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="crsrepro.run.stages"):
        with output_lock(tmp_path):
            pass
        with output_lock(tmp_path):  # a lock released is free again (no stale lock file to remove)
            pass
    assert "waiting" not in caplog.text


def test_a_run_never_removes_a_temporary_file_that_another_run_is_writing(tmp_path):
    in_flight = tmp_path / ".0a1b.npy.x1y2.tmp"
    with sharing_feature_cache(tmp_path):  # a run of another profile, writing the cache
        in_flight.write_bytes(b"half an array")
        with sharing_feature_cache(tmp_path):
            assert in_flight.is_file()
        assert in_flight.is_file()
    with sharing_feature_cache(tmp_path):  # alone: what a killed writer left is removed
        assert not in_flight.exists()
    assert (tmp_path / CACHE_LOCK).is_file()


def test_two_demo_world_generations_at_once_write_it_once(tmp_path, caplog):
    errors = []

    def generate():
        try:
            demo_world.generate_demo_world(tmp_path / "data", progress=False, **TINY_WORLD)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="crsrepro.data.demo_world"):
        threads = [threading.Thread(target=generate) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert caplog.text.count("wrote the demo world") == 1
    assert caplog.text.count("is up to date") == 1
    root = tmp_path / "data"
    assert json.loads((root / demo_world.MARKER).read_text())["n_images"] == TINY_WORLD["n_images"]
    assert sorted(p.name for p in root.iterdir()) == sorted([demo_world.MARKER, demo_world.LOCK, "aptos2019"])


def test_a_killed_generation_leaves_no_world_that_looks_complete(tmp_path, monkeypatch):
    root = tmp_path / "data"
    demo_world.generate_demo_world(root, progress=False, **TINY_WORLD)
    before = sorted(p.relative_to(root) for p in (root / "aptos2019").rglob("*"))

    def killed(folder, *args):
        (folder / "half.png").write_bytes(b"half an image")
        raise KeyboardInterrupt

    monkeypatch.setitem(demo_world._WRITERS, "aptos2019", killed)
    other = {**TINY_WORLD, "seed": 1}
    with pytest.raises(KeyboardInterrupt):
        demo_world.generate_demo_world(root, progress=False, **other)
    # the old world is untouched and still the one its marker names
    assert json.loads((root / demo_world.MARKER).read_text())["seed"] == 0
    assert sorted(p.relative_to(root) for p in (root / "aptos2019").rglob("*")) == before
    monkeypatch.undo()
    demo_world.generate_demo_world(root, progress=False, **other)
    assert json.loads((root / demo_world.MARKER).read_text())["seed"] == 1
    assert not (root / demo_world.PARTIAL).exists()


@pytest.mark.slow
def test_two_cold_runs_started_together_both_succeed_and_do_the_work_once(micro_world):
    micro_world.clear()
    command = [sys.executable, "-m", "crsrepro", "-v", "-q", "run", "--profile", str(micro_world.profile_path),
               "--executor", "serial"]
    runs = [subprocess.Popen(command, cwd=micro_world.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-2000:]
        assert "result rows in" in out
    logs = [err for _, err in outputs]
    planned = sorted(int(m.group(1)) for err in logs
                     for m in re.finditer(r"grid of profile micro: \d+ row-sets, (\d+) tasks to run", err))
    assert len(planned) == 2 and planned[0] == 0 and planned[1] > 0  # the second found everything done
    assert sum("another crsrepro run is writing" in err for err in logs) == 1
    assert sum(err.count("wrote the demo world") for err in logs) == 1
