"""The book's figure style, defined once: colours, sizes and fonts (DESIGN.md section 12).

Every function in :mod:`crsrepro.present.plots` draws inside :func:`styled`, so that

- colours come from the Okabe-Ito palette, which stays distinguishable under the common forms of
  colour blindness (Okabe & Ito 2008, "Color Universal Design");
- an encoder family always has the same colour (:data:`FAMILY_COLORS`): general blue, medical
  vermillion, specialist green, in every figure of every chapter;
- a figure is at most :data:`PAGE_WIDTH` inches wide, so the book shows it at (about) its natural size
  and its :data:`FONT_SIZE`-point labels stay legible at page width, instead of being shrunk.

>>> family_color("medical") == FAMILY_COLORS["medical"]
True
>>> short_name("demo.effnet_lite0")
'effnet_lite0'
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import matplotlib as mpl
import numpy as np

#: The Okabe-Ito colour-blind-safe palette (black first, as published).
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish_purple": "#CC79A7",
}
#: One colour per encoder family (``EncoderSpec.family``; the demo panel uses the same three names).
FAMILY_COLORS = {"general": OKABE_ITO["blue"], "medical": OKABE_ITO["vermillion"],
                 "specialist": OKABE_ITO["bluish_green"]}
#: The colour of an encoder whose family is unknown, and of reference lines.
NEUTRAL = "#7f7f7f"
#: A categorical cycle for things that are not families (recalibrators, perturbations, modes).
CYCLE = [OKABE_ITO[k] for k in ("blue", "orange", "bluish_green", "vermillion", "reddish_purple", "sky_blue",
                                "yellow", "black")]
#: Markers that tell apart the encoders of one family (the colour says the family).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
#: Sequential colour map (probabilities) and diverging one (signed differences): both colour-blind safe.
SEQUENTIAL = "cividis"
DIVERGING = "PuOr_r"

#: The width of the book's text column in inches: a figure this wide is shown at its natural size
#: (sphinx-book-theme's content column is about 750 px, and the inline backend renders at 100 dpi).
PAGE_WIDTH = 7.5
#: The base font size in points; titles are one step larger, tick labels one step smaller.
FONT_SIZE = 10

RC_PARAMS = {
    "font.size": FONT_SIZE,
    "axes.titlesize": FONT_SIZE + 1,
    "axes.labelsize": FONT_SIZE,
    "xtick.labelsize": FONT_SIZE - 1,
    "ytick.labelsize": FONT_SIZE - 1,
    "legend.fontsize": FONT_SIZE - 1,
    "legend.title_fontsize": FONT_SIZE - 1,
    "figure.titlesize": FONT_SIZE + 2,
    "axes.prop_cycle": mpl.cycler(color=CYCLE),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e5e5",
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "legend.frameon": False,
    "image.cmap": SEQUENTIAL,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "savefig.bbox": "tight",
}
"""The matplotlib settings every figure of the book is drawn with."""


def styled(plot):
    """Decorate a figure function so that it draws with :data:`RC_PARAMS` (and leaves the global
    matplotlib settings untouched)."""
    @functools.wraps(plot)
    def draw(*args, **kwargs):
        with mpl.rc_context(RC_PARAMS):
            return plot(*args, **kwargs)
    return draw


def family_color(family: str | None) -> str:
    """The colour of an encoder family (:data:`NEUTRAL` for a family outside :data:`FAMILY_COLORS`)."""
    return FAMILY_COLORS.get(family, NEUTRAL)


def short_name(encoder: str) -> str:
    """An encoder id without its namespace, for labels: ``demo.effnet_lite0`` -> ``effnet_lite0``."""
    return str(encoder).split(".", 1)[-1]


def encoder_styles(families: dict[str, str]) -> dict[str, dict]:
    """Line and marker style per encoder: its family's colour and a marker unique within the family.

    ``families`` maps encoder id to family; the result maps encoder id to matplotlib keyword arguments
    (``color``, ``marker``), the same for the same panel in every figure.

    >>> encoder_styles({"a": "general", "b": "general", "c": "medical"})["b"]["marker"]
    's'
    """
    styles, seen = {}, {}
    for encoder in sorted(families):
        family = families[encoder]
        index = seen.get(family, 0)
        seen[family] = index + 1
        styles[encoder] = {"color": family_color(family), "marker": MARKERS[index % len(MARKERS)]}
    return styles


def grid_shape(n: int, *, max_columns: int = 3) -> tuple[int, int]:
    """(rows, columns) for ``n`` panels, at most ``max_columns`` across the page.

    >>> grid_shape(2), grid_shape(5)
    ((1, 2), (2, 3))
    """
    columns = min(n, max_columns)
    return int(np.ceil(n / columns)), columns


def family_legend_handles(families: Iterable[str]):
    """Legend handles (coloured patches) for the families present, in :data:`FAMILY_COLORS` order."""
    from matplotlib.patches import Patch

    present = set(families)
    order = [f for f in FAMILY_COLORS if f in present] + sorted(present - set(FAMILY_COLORS))
    return [Patch(color=family_color(f), label=f) for f in order]
