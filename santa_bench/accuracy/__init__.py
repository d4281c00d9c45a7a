"""Accuracy: estimator fidelity on synthetic and captured attention inputs (tasks to come)."""
