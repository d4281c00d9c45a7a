"""Runners: one per case kind (kernel timing now; fidelity, tasks and e2e to come)."""

MAX_CASES = 100_000
"""The most cases (or suite combinations) one grid may expand to: at a second or more a
case, more would run for days, and expanding them alone takes minutes."""
