"""The specification-curve figure of the sensitivity chapter (DESIGN.md section 14, beyond the paper).

:func:`specification_curve` sorts the combinations of :func:`crsrepro.analyse.sensitivity.multiverse` by a
statistic and marks, below the curve, which level of each choice every combination uses
(Simonsohn, Simmons and Nelson 2020). It draws with the book's style (:mod:`crsrepro.present.plots.style`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from crsrepro.analyse.sensitivity import CHOICES
from crsrepro.present.plots.style import NEUTRAL, OKABE_ITO, PAGE_WIDTH, styled


@styled
def specification_curve(table: pd.DataFrame, statistic: str = "kendall_tau"):
    """Combinations sorted by ``statistic`` (top) and the level of each choice they use (bottom).

    Parameters
    ----------
    table : DataFrame
        The output of :func:`crsrepro.analyse.sensitivity.multiverse`.
    statistic : str, default "kendall_tau"
        A numeric column of ``table`` (``kendall_tau``, ``reversed_pairs``, ``rho_crs``, ``p_rank1_leader``).

    Returns
    -------
    matplotlib.figure.Figure
    """
    if statistic not in table.columns or not pd.api.types.is_numeric_dtype(table[statistic]):
        raise ValueError(f"statistic must be a numeric column of the multiverse table, got {statistic!r}")
    ordered = table.sort_values(statistic, kind="stable").reset_index(drop=True)
    choices = [c for c in CHOICES if ordered[c].nunique() > 1]
    labels = [(c, level) for c in choices for level in sorted(ordered[c].unique())]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(PAGE_WIDTH, 2.5 + 0.16 * len(labels)),
                                      gridspec_kw={"height_ratios": [2, max(1.0, 0.1 * len(labels))]})
    x = np.arange(len(ordered))
    top.plot(x, ordered[statistic], color=OKABE_ITO["blue"], lw=1.2)
    default = ordered.index[ordered["is_default"]]
    top.scatter(default, ordered.loc[default, statistic], color=OKABE_ITO["vermillion"], zorder=3, label="default")
    top.set_ylabel(statistic)
    top.legend(loc="upper left")
    for y, (choice, level) in enumerate(labels):
        used = np.flatnonzero(ordered[choice].to_numpy() == level)
        bottom.scatter(used, np.full(len(used), y), marker="|", s=12, color=NEUTRAL, linewidths=0.5)
    bottom.set_yticks(range(len(labels)), [f"{c}: {level}" for c, level in labels], fontsize=7)
    bottom.invert_yaxis()
    bottom.grid(False)
    bottom.set_xlabel(f"combination (sorted by {statistic})")
    fig.align_ylabels()
    plt.close(fig)  # the notebook displays the returned figure once
    return fig
