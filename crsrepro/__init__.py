"""crsrepro: a reproduction of CRS-Bench (arXiv 2608.22059) as a Jupyter-book package."""

__version__ = "0.1.0"
