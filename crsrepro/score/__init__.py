"""Scoring: runs to reliability profiles (dimensions), the CRS (crs) against a frozen reference frame
(frame), and the statistics (stats); DESIGN.md sections 8-10."""
