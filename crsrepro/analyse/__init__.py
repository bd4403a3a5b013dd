"""Analysis: RunAnalysis (run_analysis), the one cached object every chapter reads, the paper's analyses
(findings), the multiverse (sensitivity), subgroups, operating points, depth, LoRA and scoring a new encoder;
DESIGN.md sections 10-11 and 14."""
