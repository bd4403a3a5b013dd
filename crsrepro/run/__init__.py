"""Running: the stages (the frozen grid, the depth sweep, the LoRA grid) as keyed tasks on one runner
(stages), their dataset views and units, the executors, the planner and the results store; DESIGN.md sections
7, 11 and 13."""
