"""Fitting: the linear probe (linear) on the batched L-BFGS solver (lbfgs), the MLP and k-NN controls
(controls), and the four recalibrators (calibration); DESIGN.md sections 7-8."""
