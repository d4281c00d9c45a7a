"""The task registry: every accuracy task, one entry each, used by the task runner.

A task declares how its samples load (``samples``), how a sample becomes a prompt for
the decode engine (``prompts``) and how a generation is scored (``score``); flags say
whether its samples are made at the case's context length (``long_context``), whether
the case keeps its greedy budget (``generates``) and whether scoring reads the first
step's logits (``keep_logits``). The built-in tasks register from their modules
(:mod:`.tasks`: MMLU, GSM8K; :mod:`.ruler`; :mod:`.longcontext`: LongBench v2,
HELMET-RAG), which ``santa_bench.accuracy`` imports; a plugin registers its own with
:func:`register_task` (``docs/adding-a-task.md``). A group (``ruler-niah``,
``helmet-rag``) names several tasks, one case each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from santa_bench.registration import registering

# samples(case, tokenizer) -> the case's samples: ``case`` holds n, seed, ctx (a
# long-context task) and where the data is (_data_dir, _data_file, _demo_file);
# ``tokenizer()`` loads the case model's tokenizer (call it after the data is found)
SamplesFn = Callable[[dict[str, Any], Callable[[], Any]], list]
# prompts(tokenizer, samples, max_new_tokens) -> [santa_bench.accuracy.engine.Prompt]
PromptsFn = Callable[[Any, Sequence[Any], int], list]
# score(tokenizer, samples, generation) -> (per-sample bool or float in [0, 1], outputs);
# ``generation.tokens``: the generated ids per sample; ``generation.first_logits``: the
# first decode step's logits per sample (with ``keep_logits``)
ScoreFn = Callable[[Any, Sequence[Any], Any], tuple[list, list[str]]]


@dataclass(frozen=True)
class Task:
    """One accuracy task of the registry."""

    name: str
    description: str
    samples: SamplesFn
    prompts: PromptsFn
    score: ScoreFn
    long_context: bool = False  # samples made at the case's ctx (a case key)
    generates: bool = False  # the case keeps max_new_tokens (its greedy budget)
    keep_logits: bool = False  # score reads the first decode step's logits
    # the label `santa-bench pareto` groups it under (default: its name), and whether the
    # verdict joins its rows (at the verdict's ctx)
    family: str = ""
    verdict: bool = False
    # command(case) -> the arguments after `santa-bench` up to the model that run the
    # case (default: accuracy task NAME [--ctx CTX])
    command: Callable[[dict[str, Any]], list[str]] | None = None
    # the case through transformers' own decode loop (model families the suite's decoder
    # does not run): hf_scores(model, tokenizer, samples, case, prefills) -> scores;
    # None: greedy generation of the task's prompts
    hf_scores: Callable[..., list] | None = None
    aliases: tuple[str, ...] = ()  # other names of the task (suites' spellings)
    # how its prompts are built, decoded and scored (recorded in every row of its cases):
    # the prompt's text and chat template, the generation budget, the scoring
    protocol: str = ""
    # new tokens a sample may generate when the case sets no max_new_tokens (the run-time
    # estimate's bound for a task it has no stored rows of); 0: the case's budget
    budget: int = 0
    module: str = ""  # the module that registered it (set by :func:`register_task`)

    def command_args(self, case: dict[str, Any]) -> list[str]:
        """The ``santa-bench`` arguments naming the task of ``case``."""
        if self.command is not None:
            return self.command(case)
        args = ["accuracy", "task", self.name]
        return args + (["--ctx", str(case["ctx"])] if self.long_context else [])


class TaskError(ValueError):
    """An unknown task or group, or one registered twice."""


class TaskRegistry:
    """Name -> Task, in registration order, with aliases and groups."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._aliases: dict[str, str] = {}
        self._groups: dict[str, tuple[str, ...]] = {}

    def register(self, task: Task) -> None:
        names = (task.name, *task.aliases)
        if any(n in self._tasks or n in self._aliases or n in self._groups for n in names):
            raise TaskError(f"task {task.name!r} registered twice")
        self._tasks[task.name] = task
        self._aliases.update(dict.fromkeys(task.aliases, task.name))

    def register_group(self, name: str, members: Sequence[str]) -> None:
        """Registers ``name`` as standing for ``members`` (one case each)."""
        if name in self._tasks or name in self._groups:
            raise TaskError(f"task group {name!r} registered twice")
        self._groups[name] = tuple(members)

    def find(self, name: str) -> Task | None:
        """The task called ``name`` (or one of its aliases), else None."""
        return self._tasks.get(self._aliases.get(name, name))

    def get(self, name: str) -> Task:
        task = self.find(name)
        if task is None:
            raise TaskError(f"unknown task {name!r}; known: {', '.join(self.names())}")
        return task

    def expand(self, name: str) -> list[str]:
        """The concrete tasks of ``name``: a group's members, else ``[name]``."""
        return list(self._groups.get(name, (name,)))

    def groups(self) -> dict[str, tuple[str, ...]]:
        return dict(self._groups)

    def names(self) -> list[str]:
        return list(self._tasks)

    def __iter__(self):
        return iter(self._tasks.values())


TASKS = TaskRegistry()  # filled by the task modules (imported by the package), and plugins


def register_task(
    target: Callable[[], Task | Iterable[Task]] | None = None,
    *,
    registry: TaskRegistry | None = None,
) -> Any:
    """Decorator: calls the decorated function, which returns a :class:`Task` (or several),
    and registers the result in ``registry`` (default: :data:`TASKS`) with ``module`` set
    to the function's module. Returns the function unchanged."""

    return registering(Task, TASKS, TaskError, target, registry)
