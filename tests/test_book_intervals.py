"""Every interval in every book table contains its point estimate (issue 23): checked on the smoke book's run."""

import numpy as np
import pandas as pd
import pytest

#: The estimate column of an interval ``<prefix>ci_low`` / ``<prefix>ci_high`` whose prefix is not a column itself.
ESTIMATE_OF = {"": ("estimate", "gain_points", "mean_absolute_drop"), "seed_": ("seed_estimate",),
               "tau_": ("kendall_tau", "tau")}


def intervals(table: pd.DataFrame) -> list[tuple[str, str, str]]:
    """``(estimate, low, high)`` column names of every interval in ``table``."""
    found = []
    for low in (c for c in table.columns if isinstance(c, str) and c.endswith("ci_low")):
        prefix = low[: -len("ci_low")]
        high = prefix + "ci_high"
        candidates = (prefix.rstrip("_"),) if prefix.rstrip("_") in table.columns else ESTIMATE_OF.get(prefix, ())
        estimate = next((c for c in candidates if c in table.columns), None)
        assert estimate is not None and high in table.columns, f"interval {low} has no estimate column"
        found.append((estimate, low, high))
    return found


def assert_brackets(table: pd.DataFrame, what: str) -> int:
    """Assert every finite interval of ``table`` holds its estimate; return how many intervals were checked."""
    checked = 0
    for estimate, low, high in intervals(table):
        e, lo, hi = (pd.to_numeric(table[c], errors="coerce").to_numpy(float) for c in (estimate, low, high))
        finite = np.isfinite(e) & np.isfinite(lo) & np.isfinite(hi)
        bad = finite & ~((lo <= e + 1e-12) & (e <= hi + 1e-12))
        assert not bad.any(), f"{what}: {estimate} outside [{low}, {high}] in {int(bad.sum())} rows"
        checked += int(finite.sum())
    return checked


def test_the_checker_finds_an_interval_that_misses_its_estimate():
    good = pd.DataFrame({"auroc": [0.7], "auroc_ci_low": [0.6], "auroc_ci_high": [0.8],
                         "estimate": [0.1], "ci_low": [0.0], "ci_high": [0.2]})
    assert assert_brackets(good, "good") == 2
    with pytest.raises(AssertionError, match="auroc outside"):
        assert_brackets(good.assign(auroc_ci_low=0.75), "bad")


@pytest.mark.slow
def test_every_interval_of_the_smoke_book_holds_its_estimate(smoke_book, monkeypatch):
    from crsrepro.analyse import depth, operating_points, subgroups
    from crsrepro.analyse.run_analysis import RunAnalysis
    from crsrepro.present.report import tables

    monkeypatch.setenv("CRSREPRO_HOME", str(smoke_book.home))
    monkeypatch.setenv("CRSREPRO_MANIFESTS", str(smoke_book.checkout / "data_manifests"))
    monkeypatch.chdir(smoke_book.checkout)
    analysis = RunAnalysis.load("smoke")
    points = operating_points.operating_point_table(analysis)
    checked = {
        "crs bootstrap": tables.crs_bootstrap_table(analysis),
        "dimension intervals": tables.two_level_intervals(analysis),
        "seed bootstrap": analysis.bootstrap.interval(),
        # the smoke world's subgroups hold 3-19 test cases, below the default minimum of 30: score them anyway
        "subgroups": subgroups.subgroup_table(analysis, n_resamples=100, min_cases=10),
        "operating points": points.table,
        "severity summary": operating_points.severity_summary(points),
        "leave one dataset out": analysis.leave_one_dataset_out,
        "recalibration": analysis.recalibration.summary,
        "depth tests": depth.paired_test(analysis.depth),
        "lora taus": analysis.lora.per_domain,
    }
    counts = {what: assert_brackets(table, what) for what, table in checked.items()}
    assert all(counts.values()), counts  # every table has intervals to check
