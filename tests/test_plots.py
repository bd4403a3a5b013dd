"""Every figure of the book renders on a small synthetic runs table, without a warning (DESIGN.md section 12).

The tables come from the library's own analyses (``reliability_profiles``, ``crs_scores``, the stats), so a
change of their columns breaks these tests rather than the book. Each test renders the figure to PNG
in memory and checks its panels and lines; an autouse fixture checks that nothing was written to disk
and that matplotlib's global settings were left as they were.
"""

import io
import itertools
import warnings

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from crsrepro.present import plots
from crsrepro.present.plots import style
from crsrepro.score.crs import DIMENSIONS, NORMALISED, ReferenceFrame, crs_scores
from crsrepro.score.dimensions import reliability_profiles
from crsrepro.core.schema import RUN_KEYS, severity
from crsrepro.analyse.findings import insertion_experiment, recalibration_summary
from crsrepro.score.stats import rank_agreement, seed_paired_bootstrap

FAMILIES = {"demo.a": "general", "demo.b": "general", "demo.c": "general", "demo.d": "medical",
            "demo.e": "specialist", "demo.f": "specialist"}
DATASETS = ("isic2019", "chexpert")
CONDITIONS = ("clean", "gaussian_blur@1", "gaussian_blur@2", "jpeg@1", "jpeg@2")
FRACTIONS = (0.01, 0.1, 1.0)
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    """A wide runs table (``runs_table`` layout) of 6 encoders x 2 datasets x 3 seeds, with perturbations,
    label fractions, the CheXpert -> MIMIC transfer and temperature scaling at 100 % labels."""
    rng = np.random.default_rng(0)
    rows = []
    for (i, encoder), dataset, seed in itertools.product(enumerate(FAMILIES), DATASETS, SEEDS):
        base = 0.62 + 0.05 * i
        conditions = CONDITIONS + (("mimic_cxr",) if dataset == "chexpert" else ())
        for fraction, condition in itertools.product(FRACTIONS, conditions):
            level = float(severity(condition))
            auroc = base - 0.03 * level - 0.04 * (condition == "mimic_cxr") - 0.05 * (1 - fraction)
            recalibrators = ("none", "temperature") if fraction == 1.0 and condition == "clean" else ("none",)
            for recalibrator in recalibrators:
                rows.append(dict(encoder=encoder, family=FAMILIES[encoder], dataset=dataset, seed=seed,
                                 label_fraction=fraction, condition=condition, probe="linear", layer="final",
                                 regime="frozen", recalibrator=recalibrator,
                                 auroc=auroc + rng.normal(0, 0.005),
                                 ece=(0.03 if recalibrator == "temperature" else 0.08) + 0.02 * level
                                 + rng.uniform(0, 0.01)))
    table = pd.DataFrame(rows)
    assert set(RUN_KEYS) <= set(table.columns)
    return table


@pytest.fixture(autouse=True)
def no_side_effects(tmp_path, monkeypatch):
    """A figure function writes no file and leaves matplotlib's global settings unchanged."""
    monkeypatch.chdir(tmp_path)
    before = dict(mpl.rcParams)
    yield
    assert list(tmp_path.iterdir()) == []
    assert dict(mpl.rcParams) == before


def render(make, *args, **kwargs) -> Figure:
    """Call a figure function and draw its PNG in memory with every warning raised as an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = make(*args, **kwargs)
        assert isinstance(fig, Figure)
        fig.savefig(io.BytesIO(), format="png")
    assert fig.get_figwidth() <= style.PAGE_WIDTH + 1e-9, "wider than the page: the book would shrink it"
    return fig


def panels(fig: Figure) -> list:
    """The plotting axes of a figure (colour bars left out)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_style_colours_each_family_once_and_distinctly():
    assert len(set(style.FAMILY_COLORS.values())) == len(style.FAMILY_COLORS) == 3
    assert set(style.FAMILY_COLORS.values()) <= set(style.OKABE_ITO.values())
    styles = style.encoder_styles(FAMILIES)
    assert {styles[e]["color"] for e in ("demo.a", "demo.b", "demo.c")} == {style.FAMILY_COLORS["general"]}
    assert len({styles[e]["marker"] for e in ("demo.a", "demo.b", "demo.c")}) == 3
    assert style.family_color("no-such-family") == style.NEUTRAL


def test_auroc_by_encoder_colours_bars_by_family(runs):
    primary = runs[(runs.condition == "clean") & (runs.label_fraction == 1.0) & (runs.recalibrator == "none")]
    fig = render(plots.auroc_by_encoder, primary)
    assert len(panels(fig)) == len(DATASETS)
    bars = panels(fig)[0].patches
    assert len(bars) == len(FAMILIES)
    assert {mpl.colors.to_hex(b.get_facecolor()) for b in bars} == \
        {c.lower() for c in style.FAMILY_COLORS.values()}


def test_ece_vs_auroc_has_one_marker_per_encoder(runs):
    primary = runs[(runs.condition == "clean") & (runs.label_fraction == 1.0) & (runs.recalibrator == "none")]
    fig = render(plots.ece_vs_auroc, primary)
    assert [len(ax.lines) for ax in panels(fig)] == [len(FAMILIES)] * len(DATASETS)


def test_reliability_diagram_before_and_after():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 300)
    before = rng.dirichlet([1, 1, 1], 300)
    after = 0.5 * before + 0.5 / 3
    fig = render(plots.reliability_diagram, y, before, after, task="multiclass", title="isic2019: demo.a")
    curve_ax, count_ax = fig.axes
    assert len(curve_ax.lines) == 3   # the diagonal and the two curves
    assert len(count_ax.patches) == 2 * 15
    assert "ECE" in curve_ax.get_legend().get_texts()[1].get_text()


def test_recalibration_effect_one_panel_per_recalibrator(runs):
    cells = recalibration_summary(runs).cells
    fig = render(plots.recalibration_effect, cells)
    assert len(panels(fig)) == cells["recalibrator"].nunique() == 1
    assert len(panels(fig)[0].collections) == len(DATASETS)


def test_label_efficiency_curves_have_a_line_and_a_band_per_encoder(runs):
    fig = render(plots.label_efficiency_curves, runs)
    for ax in panels(fig):
        assert len(ax.lines) == len(FAMILIES)
        assert len(ax.collections) == len(FAMILIES)   # the seed bands
        assert len(ax.lines[0].get_xdata()) == len(FRACTIONS)


def test_robustness_heatmap_has_a_colour_bar(runs):
    fig = render(plots.robustness_heatmap, runs[runs.recalibrator == "none"], "isic2019")
    assert len(fig.axes) == 2 and len(panels(fig)) == 1


def test_robustness_heatmap_shows_the_perturbations_then_the_transfer_sets(runs):
    fig = render(plots.robustness_heatmap, runs[runs.recalibrator == "none"], "chexpert")
    columns = [label.get_text() for label in panels(fig)[0].get_xticklabels()]
    assert columns == [*sorted(c for c in CONDITIONS if c != "clean"), "mimic_cxr"]


def test_a_figure_of_no_dataset_is_nothing(runs):
    """The contrast dataset of a one-dataset profile is None: its figure cell shows nothing."""
    assert plots.severity_curves(runs, None) is None
    assert plots.perturbation_grid(None, None) is None


def test_severity_curves_auroc_and_ece_per_perturbation(runs):
    fig = render(plots.severity_curves, runs, "chexpert")
    assert len(panels(fig)) == 2 * 2   # two metrics x two perturbations
    for ax in panels(fig):
        assert len(ax.lines) == len(FAMILIES)
        assert ax.lines[0].get_xdata().tolist() == [0.0, 1.0, 2.0]


def test_transfer_scatter_and_bars(runs):
    source = runs[(runs.dataset == "chexpert") & (runs.label_fraction == 1.0) & (runs.recalibrator == "none")]
    table = pd.DataFrame({"source_auroc": source[source.condition == "clean"].groupby("encoder")["auroc"].mean(),
                          "target_auroc": source[source.condition == "mimic_cxr"].groupby("encoder")["auroc"].mean()})
    fig = render(plots.transfer_scatter, table, pd.Series(FAMILIES))
    assert len(panels(fig)[0].collections) == 3   # one scatter per family

    fig = render(plots.transfer_bars, runs)
    ax = panels(fig)[0]
    assert len(ax.patches) == len(FAMILIES)
    assert "Welch p" in ax.get_title()


def test_depth_curves(runs):
    depth = pd.DataFrame([dict(encoder=e, family=f, dataset=d, seed=s, depth=k, auroc=0.6 + k / 500 + s / 100)
                          for (e, f), d, s, k in itertools.product(FAMILIES.items(), DATASETS, SEEDS, (25, 50, 75, 100))])
    fig = render(plots.depth_curves, depth)
    assert len(panels(fig)) == len(DATASETS)
    assert all(len(ax.lines) == len(FAMILIES) for ax in panels(fig))


@pytest.fixture(scope="module")
def scores(runs) -> pd.DataFrame:
    profiles = reliability_profiles(runs)
    return crs_scores(profiles, ReferenceFrame.freeze(profiles))


def test_dimension_profiles_one_line_per_encoder(scores):
    table = scores[["encoder", "dataset", *NORMALISED]].rename(columns=dict(zip(NORMALISED, DIMENSIONS)))
    fig = render(plots.dimension_profiles, table)
    assert len(panels(fig)) == len(DATASETS)
    assert all(len(ax.lines) == len(FAMILIES) for ax in panels(fig))


def test_pareto_scatter_marks_the_front(runs):
    profiles = reliability_profiles(runs)
    fig = render(plots.pareto_scatter, profiles)
    ax = panels(fig)[0]
    markers = ax.lines[:-1]   # the last line is the front
    filled = [m for m in markers if m.get_markerfacecolor() != "white"]
    assert len(markers) == len(FAMILIES) and 1 <= len(filled) < len(FAMILIES)
    assert ax.yaxis_inverted()   # ECE: lower is better, drawn upwards


def test_rank_shift_for_crs_and_for_lora(scores):
    auroc = scores.groupby("encoder")["auroc"].mean().to_dict()
    crs = scores.groupby("encoder")["crs"].mean().to_dict()
    agreement = rank_agreement(auroc, crs)
    fig = render(plots.rank_shift, agreement.ranks)
    assert len(panels(fig)[0].lines) == len(FAMILIES)
    lora = rank_agreement(auroc, dict(zip(auroc, reversed(auroc.values()))))   # LoRA reverses the ranks
    fig = render(plots.rank_shift, lora.ranks, a="frozen", b="LoRA", families=pd.Series(FAMILIES))
    ax = panels(fig)[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank by frozen", "rank by LoRA"]
    assert {mpl.colors.to_hex(line.get_color()) for line in ax.lines} == \
        {c.lower() for c in style.FAMILY_COLORS.values()}


def test_rank_probabilities_heatmap(runs):
    per_seed = reliability_profiles(runs)   # one row per seed, as the bootstrap resamples seeds
    frame = ReferenceFrame.freeze(per_seed)
    probabilities = seed_paired_bootstrap(per_seed, frame, n_resamples=50, rng=0).rank_probabilities
    fig = render(plots.rank_probabilities, probabilities)
    assert len(panels(fig)) == 1 and len(fig.axes) == 2
    assert panels(fig)[0].texts   # the probabilities are written in the cells


def test_insertion_movements_fixed_against_cohort(runs):
    movements = insertion_experiment(reliability_profiles(runs), n_trials=4, n_inserted=2).movements
    fig = render(plots.insertion_movements, movements)
    cells_ax, trials_ax = fig.axes
    assert [t.get_text() for t in cells_ax.get_xticklabels()] == ["fixed\ncell", "cohort\ncell", "fixed\naggregate",
                                                                   "cohort\naggregate"]
    assert len(trials_ax.lines) == 4
    assert trials_ax.lines[0].get_ydata().max() == 0 == trials_ax.lines[2].get_ydata().max()  # fixed moves nothing
