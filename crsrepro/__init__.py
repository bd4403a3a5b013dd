"""crsrepro: a reproduction of CRS-Bench (arXiv 2608.22059) as a Jupyter-book package."""

import logging

__version__ = "0.1.0"

# A library logs and the application decides what to show: the CLI configures logging, and a notebook
# kernel, which configures none, would otherwise print every warning into the page through logging's
# last-resort handler. What a warning says that the reader needs is in the chapters' tables (for example
# the labels a dataset leaves out, in chapter 00's data inventory).
logging.getLogger(__name__).addHandler(logging.NullHandler())
