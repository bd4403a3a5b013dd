"""Extraction: the content-addressed feature cache (features) and the test-image perturbations (perturb);
DESIGN.md sections 5-6."""
