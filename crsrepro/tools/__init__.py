"""The deployment teams' tools: recalibrate, quality-check, check-weights and the deployment example;
DESIGN.md section 14."""
