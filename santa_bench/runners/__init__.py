"""Runners: one per case kind (kernel timing now; fidelity, tasks and e2e to come)."""
