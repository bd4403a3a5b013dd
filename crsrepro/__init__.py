"""crsrepro: a reproduction of CRS-Bench (arXiv 2608.22059) as a Jupyter-book package.

The package is layered by pipeline stage (ARCHITECTURE.md): ``core``, ``profiles``, ``data``,
``encoders``, ``extract``, ``fit``, ``run``, ``score``, ``analyse``, ``present``, ``tools``, then the
CLI. The names a user reaches for first are exported here, and imported only when first used, so that
``import crsrepro`` stays cheap in a worker process.
"""

import importlib
import logging

from crsrepro.core import __version__

# A library logs and the application decides what to show: the CLI configures logging, and a notebook
# kernel, which configures none, would otherwise print every warning into the page through logging's
# last-resort handler. What a warning says that the reader needs is in the chapters' tables (for example
# the labels a dataset leaves out, in chapter 00's data inventory).
logging.getLogger(__name__).addHandler(logging.NullHandler())

_EXPORTS = {
    "RunAnalysis": "crsrepro.analyse.run_analysis",
    "load_profile": "crsrepro.profiles",
    "create_encoder": "crsrepro.encoders",
    "load_dataset": "crsrepro.data",
    "run_grid": "crsrepro.run.grid",
    "reliability_profiles": "crsrepro.score.dimensions",
    "ReferenceFrame": "crsrepro.score.crs",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'crsrepro' has no attribute {name!r}")
