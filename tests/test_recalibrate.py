"""Tests for ``crsrepro recalibrate`` (crsrepro.tools.recalibrate): the recipe, the saved map, and bad input."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from crsrepro.cli import main
from crsrepro.tools.deployment import GRADES, example_cohort
from crsrepro.core.metrics import expected_calibration_error
from crsrepro.tools.recalibrate import (CohortError, cases_for_ece_precision, read_cohort, recalibrate_cohort,
                                        split_cohort)


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
    (["a,b,y", "1.5,-0.5,a", "0.5,0.5,b"], ["--labels", "y", "--input", "probabilities"],
     ["row 2", "column 'a'", "[0, 1]"]),
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


# ---------------------------------------------------------------- issue 26: safe reading and writing


def _cohort_table(cohort_csv):
    return pd.read_csv(cohort_csv, dtype=str, keep_default_na=False)


@pytest.mark.parametrize("row, column, value", [(4, "grade_1", "1.3"), (7, "grade_0", "-0.2")])
def test_one_value_outside_0_1_is_an_error_not_a_switch_to_logits(cohort_csv, tmp_path, capsys, row, column, value):
    table = _cohort_table(cohort_csv)
    table.loc[row, column] = value
    table.to_csv(tmp_path / "one_bad.csv", index=False)
    assert run_cli("--scores", tmp_path / "one_bad.csv", "--labels", "label", "--method", "temperature",
                   "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "one_bad.csv", f"row {row + 2}", f"column {column!r}", "outside [0, 1]", "--input logits")
    assert not (tmp_path / "o.csv").exists()


def test_a_logits_file_with_a_row_inside_0_1_is_an_error_unless_input_logits(tmp_path, capsys):
    rng = np.random.default_rng(1)
    table = pd.DataFrame(rng.normal(scale=4, size=(120, 2)) + [[3, -3]], columns=["a", "b"])
    table["y"] = np.where(np.arange(120) % 2, "a", "b")
    table.loc[table.index[(table[["a", "b"]].abs() < 1).all(axis=1)], ["a", "b"]] = 5.0  # no chance rows
    table.loc[9, ["a", "b"]] = [0.2, 0.7]  # one row of logits that happens to lie in [0, 1]
    table.to_csv(tmp_path / "logits.csv", index=False)
    args = ["--scores", tmp_path / "logits.csv", "--labels", "y", "--method", "temperature"]
    assert run_cli(*args, "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "row 11", "every score lies in [0, 1]", "119 of 120 rows", "--input logits")
    assert run_cli(*args, "--input", "logits", "--out", tmp_path / "o.csv") == 0
    assert "scores read as logits" in capsys.readouterr().out


def test_a_single_class_cohort_or_part_is_refused_naming_the_rows(cohort_csv, tmp_path, capsys):
    table = _cohort_table(cohort_csv)
    table.assign(label="grade_0").to_csv(tmp_path / "one_class.csv", index=False)
    assert run_cli("--scores", tmp_path / "one_class.csv", "--labels", "label", "--classes", ",".join(GRADES),
                   "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "one_class.csv", "every one of the 400 cases of the cohort", "rows 2, 3, 4, 5, 6 ...",
                   "label 'grade_0'", "at least two classes")
    part = np.where(table["label"] == "grade_0", "evaluation", "calibration")
    table.assign(part=part).to_csv(tmp_path / "one_class_part.csv", index=False)
    assert run_cli("--scores", tmp_path / "one_class_part.csv", "--labels", "label", "--calibration-split", "part",
                   "--method", "temperature", "--out", tmp_path / "o.csv") == 2
    first = int(np.flatnonzero(part == "evaluation")[0]) + 2
    one_line_error(capsys, "of the evaluation part", f"rows {first},", "label 'grade_0'")
    assert not (tmp_path / "o.csv").exists()


def test_duplicate_ids_are_refused_naming_the_rows(cohort_csv, tmp_path, capsys):
    table = _cohort_table(cohort_csv)
    table.loc[5, "case_id"] = table.loc[1, "case_id"]
    table.to_csv(tmp_path / "dup.csv", index=False)
    assert run_cli("--scores", tmp_path / "dup.csv", "--labels", "label", "--id-column", "case_id",
                   "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "dup.csv", "column 'case_id'", f"id {table.loc[1, 'case_id']!r} is on rows 3, 7")


def test_the_classes_default_to_the_label_values_so_other_columns_need_no_flag(cohort_csv, tmp_path, capsys):
    table = _cohort_table(cohort_csv).assign(site=lambda t: np.where(np.arange(len(t)) % 2, "north", "south"))
    table.to_csv(tmp_path / "with_site.csv", index=False)
    out = tmp_path / "o.csv"
    assert run_cli("--scores", tmp_path / "with_site.csv", "--labels", "label", "--method", "temperature",
                   "--out", out) == 0
    assert json.loads((tmp_path / "o.map.json").read_text())["classes"] == GRADES
    written = pd.read_csv(out, dtype=str)
    assert (written[["case_id", "site"]] == table[["case_id", "site"]]).all().all()  # carried through
    missing = table[table["label"] != "grade_4"]  # a class without a labelled case: its column is no class
    missing.to_csv(tmp_path / "no_grade_4.csv", index=False)
    assert run_cli("--scores", tmp_path / "no_grade_4.csv", "--labels", "label", "--out", tmp_path / "p.csv") == 2
    one_line_error(capsys, "the score columns are the label column's values", "--classes")


def test_outputs_never_replace_the_input_and_existing_files_need_overwrite(cohort_csv, tmp_path, capsys):
    scores = tmp_path / "scores.csv"
    scores.write_bytes(cohort_csv.read_bytes())
    before = scores.read_bytes()
    base = ["--scores", scores, "--labels", "label", "--method", "temperature"]
    assert run_cli(*base, "--out", scores) == 2
    one_line_error(capsys, "scores.csv: is an input of this command", "another --out")
    assert run_cli(*base, "--out", tmp_path / "o.csv", "--map", scores) == 2
    one_line_error(capsys, "scores.csv: is an input")
    assert scores.read_bytes() == before
    (tmp_path / "o.csv").write_text("mine\n")
    assert run_cli(*base, "--out", tmp_path / "o.csv") == 2
    one_line_error(capsys, "o.csv exists", "--overwrite")
    assert (tmp_path / "o.csv").read_text() == "mine\n"
    recalibrate_cohort(scores, label_column="label", method="temperature", out=tmp_path / "o.csv", overwrite=True)
    assert "calibration_split" in pd.read_csv(tmp_path / "o.csv").columns
    with pytest.raises(CohortError, match="scores.csv: is an input"):
        recalibrate_cohort(scores, label_column="label", out=scores, overwrite=True)
    assert run_cli("--scores", scores, "--apply", tmp_path / "o.map.json", "--out", tmp_path / "o.map.json") == 2
    one_line_error(capsys, "o.map.json: is an input")
    assert scores.read_bytes() == before


INTERVAL = re.compile(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")


def test_every_printed_interval_contains_its_estimate(tmp_path, capsys):
    small = example_cohort(tmp_path / "small", n=120, seed=3)  # small: the ECE's bootstrap bias is large
    assert run_cli("--scores", small, "--labels", "label", "--method", "temperature", "--out", tmp_path / "o.csv") == 0
    assert run_cli("--scores", small, "--labels", "label", "--apply", tmp_path / "o.map.json",
                   "--out", tmp_path / "again.csv") == 0
    printed = capsys.readouterr().out
    found = [tuple(map(float, m)) for m in INTERVAL.findall(printed)]
    assert len(found) == 12, printed  # ECE and AUROC before, after and change, for the fit and the apply
    for estimate, low, high in found:
        assert low <= estimate <= high, printed
    report = recalibrate_cohort(small, label_column="label", method="temperature", out=tmp_path / "r.csv")
    for interval in (report.ece_before, report.ece_after, report.ece_change, report.auroc_before,
                     report.auroc_after, report.auroc_change):
        assert interval.ci_low <= interval.estimate <= interval.ci_high
    cohort = read_cohort(small, label_column="label")
    evaluation = ~split_cohort(cohort, 0.5, seed=0)  # recalibrate_cohort's default split
    plug_in = expected_calibration_error(cohort.labels[evaluation], cohort.probs[evaluation], task="multiclass")
    assert report.ece_before.estimate < plug_in  # the upward bias of a resampled ECE is corrected
