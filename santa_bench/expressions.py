"""Safe boolean expressions over named values: suite ``where``, ``--only``, ``plot --where``.

An expression is parsed with :mod:`ast` and interpreted node by node (no ``eval``, no
``DataFrame.query``): names, numbers, strings, lists, ``and or not``, ``+ - * / // % **``,
comparisons, ``in``. Anything else (attributes, calls, subscripts, ``@`` references,
lambdas, comprehensions, ``<<``) is refused when parsed. Operators that could run for
long are bounded: a power or an integer product whose magnitude would pass ``2**64``, or
a repeated string or list longer than :data:`MAX_LENGTH`, is refused when evaluated.
"""

from __future__ import annotations

import ast
import math
import numbers
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

MAX_BITS = 64
"""A power or integer product whose magnitude would exceed ``2**MAX_BITS`` is refused."""
MAX_LENGTH = 10_000
"""A string or list repeated (``'a' * n``) to more items than this is refused."""
SYNTAX = "names, numbers, strings, lists, and/or/not, + - * / // % **, comparisons, in"


class ExpressionError(ValueError):
    """An expression outside the allowed subset, or one whose value would be too large."""


class _Absent:
    """A row's missing value (NaN, None) in :func:`frame_mask`: false; compares unequal."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<missing>"


ABSENT = _Absent()


def _is_absent(value: Any) -> bool:
    return value is ABSENT


def _bits(value: Any) -> float:
    """log2 of ``|value|`` for a real number (-inf for 0)."""
    magnitude = abs(value)
    if isinstance(magnitude, numbers.Integral):
        return math.log2(int(magnitude)) if magnitude else -math.inf
    return math.log2(magnitude) if magnitude else -math.inf


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def _power(base: Any, exponent: Any) -> Any:
    if _real(base) and _real(exponent) and base != 0 and abs(base) != 1:
        bits = _bits(base)  # |base ** exponent| = 2 ** (bits * exponent), compared exactly
        if exponent > MAX_BITS / bits if bits > 0 else exponent < MAX_BITS / bits:
            raise ExpressionError(f"a power above 2**{MAX_BITS} is refused")
    return operator.pow(base, exponent)


def _multiply(left: Any, right: Any) -> Any:
    integers = isinstance(left, numbers.Integral) and isinstance(right, numbers.Integral)
    if integers and left and right and _bits(left) + _bits(right) > MAX_BITS:
        raise ExpressionError(f"a product above 2**{MAX_BITS} is refused")
    for items, count in ((left, right), (right, left)):
        repeated = isinstance(items, (str, list)) and isinstance(count, numbers.Integral)
        if repeated and len(items) * count > MAX_LENGTH:
            raise ExpressionError(f"a repetition longer than {MAX_LENGTH:,} is refused")
    return operator.mul(left, right)


def _modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):
        raise ExpressionError("% takes numbers (no string formatting)")
    return operator.mod(left, right)


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _multiply,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _modulo,
    ast.Pow: _power,
    ast.BitAnd: lambda a, b: bool(a) and bool(b),
    ast.BitOr: lambda a, b: bool(a) or bool(b),
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_ALLOWED_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.BinOp,
    ast.Compare,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Load,
    *_BINARY,
    *_COMPARE,
    *_UNARY,
)
_CONSTANTS = {"True": True, "False": False, "None": None}


class _Missing(Exception):
    """A name the case does not have."""


@dataclass(frozen=True)
class Expression:
    """A parsed boolean expression over named values (``S <= ctx and method != 'dense'``)."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    @classmethod
    def parse(cls, text: str) -> Expression:
        """Parses ``text``; raises ExpressionError on syntax outside the allowed subset."""
        source = str(text).strip()
        try:
            tree = ast.parse(source, mode="eval")
        except SyntaxError as exc:
            hint = "; @ references are not allowed" if "@" in source else ""
            raise ExpressionError(f"not an expression: {text!r} ({exc.msg}{hint})") from None
        except (RecursionError, MemoryError):
            nested = f"not an expression: {text[:40]!r}... (nested too deeply)"
            raise ExpressionError(nested) from None
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif not isinstance(node, _ALLOWED_NODES):
                what = "@" if isinstance(node, ast.MatMult) else type(node).__name__
                raise ExpressionError(
                    f"{what} is not allowed in {text!r} (allowed: {SYNTAX})"
                )
        return cls(str(text), tree, frozenset(names - set(_CONSTANTS)))

    def __call__(self, case: dict[str, Any], missing: bool = True) -> bool:
        """Returns the expression's truth on ``case``; ``missing`` if a name is absent.

        Raises ExpressionError where an operation's value would be too large."""
        try:
            return bool(_evaluate(self.tree.body, case))
        except _Missing:
            return missing
        except RecursionError:
            raise ExpressionError(f"{self.text[:40]!r}...: nested too deeply") from None


def _evaluate(node: ast.AST, case: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id not in case or case[node.id] is None:
            raise _Missing(node.id)
        return case[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_evaluate(item, case) for item in node.elts]
    if isinstance(node, ast.BoolOp):
        values = (_evaluate(v, case) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, case)
        if _is_absent(operand) and not isinstance(node.op, ast.Not):
            return ABSENT
        return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, case), _evaluate(node.right, case)
        if _is_absent(left) or _is_absent(right):
            return ABSENT
        try:
            return _BINARY[type(node.op)](left, right)
        except ExpressionError as exc:
            raise ExpressionError(f"{exc}: {_source(node)}") from None
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, case)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, case)
            if _is_absent(left) or _is_absent(right):
                holds = isinstance(op, (ast.NotEq, ast.NotIn))  # as NaN: unequal to all
            else:
                holds = _COMPARE[type(op)](left, right)
            if not holds:
                return False
            left = right
        return True
    raise ExpressionError(f"{type(node).__name__} is not allowed")  # pragma: no cover


def _source(node: ast.AST) -> str:
    """The node as source text (cut short), for messages."""
    try:
        text = ast.unparse(node)
    except ValueError:  # an integer literal too long to print
        return "(a long number)"
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------ over a frame's rows
def frame_mask(expression: Expression, frame: pd.DataFrame) -> pd.Series:
    """The rows of ``frame`` where ``expression`` holds, as a boolean Series.

    Names are columns (another name raises ExpressionError naming it). A missing value
    (NaN, None) compares unequal to everything, as in pandas: ``gather == 'compact'`` is
    false on it, ``gather != 'compact'`` true. The expression runs once per distinct
    combination of the named columns' values, not once per row.
    """
    import pandas as pd

    if unknown := sorted(expression.names - set(frame.columns)):
        raise ExpressionError(
            f"unknown column(s) {unknown} in {expression.text!r}; "
            f"columns: {', '.join(sorted(map(str, frame.columns)))}"
        )
    columns = sorted(expression.names)
    values = [[ABSENT if _na(v) else v for v in frame[c].tolist()] for c in columns]

    def holds(row: tuple[Any, ...]) -> bool:
        try:
            return expression(dict(zip(columns, row, strict=True)), missing=False)
        except ExpressionError:
            raise
        except Exception as exc:  # a comparison of a string and a number, ...
            raise ExpressionError(f"{expression.text!r}: {type(exc).__name__}: {exc}") from None

    verdicts: dict[Any, bool] = {}
    mask = []
    for row in zip(*values, strict=True) if columns else [()] * len(frame):
        try:
            verdict = verdicts.get(row)
        except TypeError:  # an unhashable value (a list): not cached
            verdict = holds(row)
        if verdict is None:
            verdict = verdicts[row] = holds(row)
        mask.append(verdict)
    return pd.Series(mask, index=frame.index, dtype=bool)


def _na(value: Any) -> bool:
    """A missing cell: None, NaN, pd.NA, NaT."""
    if value is None:
        return True
    try:
        import pandas as pd

        return bool(pd.isna(value)) if not isinstance(value, (str, list, tuple)) else False
    except (TypeError, ValueError):
        return False
