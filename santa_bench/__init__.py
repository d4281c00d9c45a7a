"""santa-bench: benchmark harness for stochastic sparse attention."""

__version__ = "0.1.0"
