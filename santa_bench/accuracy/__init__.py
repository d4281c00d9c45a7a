"""Accuracy: estimator fidelity on synthetic and captured attention inputs, and tasks.

The package imports the built-in task modules, in registration order (the order of
`santa-bench list`): each registers its tasks in :data:`.registry.TASKS` (see
``docs/adding-a-task.md``).
"""

# isort: off
from santa_bench.accuracy import ruler  # RULER's 13 tasks
from santa_bench.accuracy import longcontext  # LongBench v2, HELMET-RAG
from santa_bench.accuracy import tasks  # MMLU, GSM8K
# isort: on

__all__ = ["longcontext", "ruler", "tasks"]
