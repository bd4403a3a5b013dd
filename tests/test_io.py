

def test_computed_once_computes_under_a_lock_and_then_reads(tmp_path):
    """The second caller reads the first one's file; a new path (a new content key) computes again."""
    from crsrepro.core.io import computed_once

    calls = []
    compute = lambda: calls.append(1) or {"value": len(calls)}  # noqa: E731
    assert computed_once(tmp_path / "a.pkl", compute) == {"value": 1}
    assert computed_once(tmp_path / "a.pkl", compute) == {"value": 1} and len(calls) == 1
    assert computed_once(tmp_path / "b.pkl", compute) == {"value": 2}
    assert (tmp_path / "a.lock").is_file()
