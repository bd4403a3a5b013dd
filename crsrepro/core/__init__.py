"""The foundation every layer may import: io, vocabulary, errors, the results schema, the metrics."""

__version__ = "0.1.0"
