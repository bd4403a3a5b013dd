"""Tests for ``crsrepro recalibrate`` (crsrepro.tools.recalibrate): the recipe, the saved map, and bad input."""

import json

import numpy as np
import pandas as pd
import pytest

from crsrepro.cli import main
from crsrepro.tools.deployment import GRADES, example_cohort
from crsrepro.tools.recalibrate import cases_for_ece_precision, read_cohort, split_cohort


@pytest.fixture(scope="module")
def cohort_csv(tmp_path_factory):
    return example_cohort(tmp_path_factory.mktemp("cohort"), n=400, seed=1)


def run_cli(*args):
    return main(["recalibrate", *map(str, args)])


def one_line_error(capsys, *fragments):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("crsrepro: error:"), err
    for fragment in fragments:
        assert fragment in err[0]
    return err[0]


def test_fit_then_apply_gives_the_same_probabilities(cohort_csv, tmp_path, capsys):
    out = tmp_path / "calibrated.csv"
    assert run_cli("--scores", cohort_csv, "--labels", "label", "--id-column", "case_id", "--method", "temperature",
                   "--out", out) == 0
    printed = capsys.readouterr().out
    assert "method: temperature (as asked)" in printed and "ECE   before" in printed
    ece_before, ece_after = (float(printed.split(word)[1].split()[0]) for word in ("ECE   before", "after"))
    assert ece_after < ece_before / 2  # the simulated classifier is over-confident
    assert (tmp_path / "calibrated.reliability.png").stat().st_size > 0
    saved = json.loads((tmp_path / "calibrated.map.json").read_text())
    assert saved["classes"] == GRADES and saved["recalibrator"]["method"] == "temperature"
    fitted = pd.read_csv(out, dtype=str)
    parts = fitted["calibration_split"].value_counts()
    assert set(parts.index) == {"calibration", "evaluation"} and abs(parts["calibration"] - 200) <= 3
    again = tmp_path / "again.csv"
    assert run_cli("--scores", cohort_csv, "--apply", tmp_path / "calibrated.map.json", "--out", again) == 0
    reloaded = pd.read_csv(again, dtype=str)
    pd.testing.assert_frame_equal(reloaded[GRADES], fitted[GRADES])  # the same digits, bit for bit
    assert (reloaded["case_id"] == fitted["case_id"]).all()
    probs = fitted[GRADES].astype(float).to_numpy()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    original = pd.read_csv(cohort_csv)[GRADES].to_numpy()
    assert not np.allclose(probs, original, atol=1e-3)


def test_auto_picks_the_lowest_cross_validated_ece(cohort_csv, tmp_path, capsys):
    assert run_cli("--scores", cohort_csv, "--labels", "label", "--id-column", "case_id", "--out",
                   tmp_path / "c.csv") == 0
    printed = capsys.readouterr().out
    scores = dict(item.split() for item in printed.split("calibration part: ")[1].splitlines()[0].split(", "))
    candidates = {m: float(v) for m, v in scores.items() if m != "none"}
    assert "dirichlet" not in candidates  # 200 cases are too few for its 30 parameters (10 per parameter)
    assert f"method: {min(candidates, key=candidates.get)} (lowest cross-validated ECE)" in printed


def test_logits_are_detected_and_a_split_column_is_used(tmp_path, capsys):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 2
    y = (rng.uniform(size=(300, 1)) > np.exp(z).cumsum(1) / np.exp(z).sum(1, keepdims=True)).sum(1)
    table = pd.DataFrame(3 * z, columns=["a", "b", "c"])
    table["truth"] = np.array(["a", "b", "c"])[np.minimum(y, 2)]
    table["part"] = np.where(np.arange(300) < 150, "calibration", "evaluation")
    table.to_csv(tmp_path / "logits.csv", index=False)
    assert run_cli("--scores", tmp_path / "logits.csv", "--labels", "truth", "--calibration-split", "part",
                   "--method", "vector", "--out", tmp_path / "out.csv") == 0
    printed = capsys.readouterr().out
    assert "scores read as logits" in printed and "calibration part 150 cases, evaluation part 150 cases" in printed


def test_stratified_split_keeps_the_class_balance(cohort_csv):
    cohort = read_cohort(cohort_csv, label_column="label", exclude=["case_id"])
    is_calibration = split_cohort(cohort, 0.25, seed=3)
    for k in np.unique(cohort.labels):
        members = cohort.labels == k
        assert abs(is_calibration[members].sum() - 0.25 * members.sum()) <= 0.5
    assert not np.array_equal(is_calibration, split_cohort(cohort, 0.25, seed=4))


def test_cases_needed_scale_with_the_inverse_square_of_the_tolerance(cohort_csv):
    cohort = read_cohort(cohort_csv, label_column="label", exclude=["case_id"])
    loose = cases_for_ece_precision(cohort.labels, cohort.probs, tolerance=0.04, n_resamples=200)
    tight = cases_for_ece_precision(cohort.labels, cohort.probs, tolerance=0.02, n_resamples=200)
    assert sorted(loose.half_widths) == [100, 200, 400]
    assert loose.half_widths[100] > loose.half_widths[400]
    assert tight.n_needed == pytest.approx(4 * loose.n_needed, rel=0.01)


def _write(tmp_path, rows, name="bad.csv"):
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("rows, args, fragments", [
    (["a,b,y", "0.5,0.5,a"], ["--labels", "label"], ["bad.csv", "no column 'label'", "columns: a, b, y"]),
    (["a,b,y", "0.5,0.5,a", "0.5,0.4,b"], ["--labels", "y"], ["bad.csv", "row 3", "sum to 0.9", "--input logits"]),
    (["a,b,y", "0.5,0.5,a", "0.5,0.4,b"], ["--labels", "y", "--input", "probabilities"], ["row 3", "sum to 0.9"]),
    (["a,b,y", "0.5,0.5,a", "0.5,0.5,c"], ["--labels", "y"], ["row 3", "column 'y'", "label 'c'", "a, b"]),
    (["a,b,y", "0.5,0.5,a", "0.5,x,b"], ["--labels", "y"], ["row 3", "column 'b'", "'x' is not a finite number"]),
    (["a,b,y", "1.5,-0.5,a"], ["--labels", "y", "--input", "probabilities"], ["row 2", "column 'a'", "[0, 1]"]),
    (["a,b,y"] + ["0.5,0.5,a", "0.5,0.5,b"] * 10, ["--labels", "y", "--method", "vector"],
     ["bad.csv", "10 calibration cases for 2 classes", "vector 40"]),
    (["a,b,y"] + ["0.5,0.5,a", "0.5,0.5,b"] * 10, ["--labels", "y"], ["bad.csv", "cross-validation needs at least"]),
    (["a,b,y"] + ["0.5,0.5,a", "0.5,0.5,b"] * 10, ["--labels", "y", "--calibration-split", "y"],
     ["row 2", "column 'y'", "neither 'calibration'"]),
    (["a,b,y"] + ["0.5,0.5,a"] * 3, [], ["needs --labels"]),
])
def test_bad_input_is_one_line_naming_the_file_and_the_row(rows, args, fragments, tmp_path, capsys):
    path = _write(tmp_path, rows)
    assert run_cli("--scores", path, "--out", tmp_path / "o.csv", *args) == 2
    one_line_error(capsys, *fragments)


def test_applying_a_map_to_a_csv_without_its_columns(cohort_csv, tmp_path, capsys):
    assert run_cli("--scores", cohort_csv, "--labels", "label", "--id-column", "case_id", "--method", "temperature",
                   "--out", tmp_path / "c.csv") == 0
    other = _write(tmp_path, ["grade_0,grade_1,label", "0.5,0.5,grade_0"], name="other.csv")
    assert run_cli("--scores", other, "--apply", tmp_path / "c.map.json", "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "other.csv", "no column 'grade_2'")
    (tmp_path / "broken.json").write_text("{}")
    assert run_cli("--scores", other, "--apply", tmp_path / "broken.json", "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "broken.json", "not a map saved by crsrepro recalibrate")


def test_the_cli_defaults_are_the_module_constants():
    from crsrepro.cli import build_parser
    from crsrepro.tools.quality import Z_THRESHOLD
    from crsrepro.tools.recalibrate import CALIBRATION_FRACTION, ECE_TOLERANCE

    recalibrate = build_parser().parse_args(["recalibrate", "--scores", "s.csv", "--out", "o.csv"])
    assert recalibrate.tolerance == ECE_TOLERANCE and float(recalibrate.calibration_split) == CALIBRATION_FRACTION
    assert not hasattr(recalibrate, "profile")
    assert build_parser().parse_args(["quality-check", "--images", "d"]).threshold == Z_THRESHOLD
