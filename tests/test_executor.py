"""DESIGN.md section 13: the grid's keyed tasks give the same table, row-set by row-set and feature by
feature, in this process (serial, the reference), on a 2-process pool and on a 2-worker Dask
LocalCluster (one torch/BLAS thread per task), each from a cold cache."""

import pytest

from crsrepro.run import executor, grid
from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import load_profile

pytestmark = pytest.mark.slow  # minutes of grids, processes or training: the full suite runs it, test-fast does not


@pytest.fixture(scope="module")
def reference(micro_world):
    micro_world.clear()
    grid.run_grid(micro_world.profile(), progress=False, executor="serial")
    return micro_world.state()


def test_the_local_pool_gives_the_serial_table(micro_world, reference):
    micro_world.clear()
    table = grid.run_grid(micro_world.profile(), progress=False, executor="local", workers=2)
    assert table["rowset"].nunique() == 2 * 2 * 2  # cells x seeds x probes (linear, knn)
    micro_world.assert_state(reference)


def test_a_dask_local_cluster_gives_the_serial_table(micro_world, reference):
    pytest.importorskip("distributed")
    micro_world.clear()
    grid.run_grid(micro_world.profile(), progress=False, executor="dask", workers=2)
    micro_world.assert_state(reference)


def test_probe_tasks_follow_their_extraction_task_and_gpu_tasks_hold_the_gpu(micro_world, reference):
    from crsrepro.run.results import ResultStore

    profile = micro_world.profile()
    store = ResultStore(profile.output_path)
    keys, tasks = grid.GridStage().plan(profile, store)
    assert len(keys) == 8 and tasks == []  # everything is done
    victim = keys[3]
    store.path(victim).unlink()
    _, tasks = grid.GridStage().plan(profile, store)
    extract, probe = tasks
    assert probe.after == extract.key and probe.args[0].key == victim and not extract.gpu and not probe.gpu
    on_gpu = load_profile(micro_world.profile_path, overrides={"features": {"device": "cuda"}})
    _, tasks = grid.GridStage().plan(on_gpu, store)
    assert [t.gpu for t in tasks] == [True, False]  # only extraction holds the GPU


def test_bad_executor_options_are_one_line_errors():
    task = executor.Task("t", print, ())
    with pytest.raises(CrsreproError, match="unknown executor 'ray'"):
        executor.execute([task], executor="ray")
    with pytest.raises(CrsreproError, match="--workers must be at least 1"):
        executor.execute([task], executor="local", workers=0)
    with pytest.raises(CrsreproError, match="--scheduler .* needs --executor dask"):
        executor.execute([task], executor="local", scheduler="tcp://x:8786")
