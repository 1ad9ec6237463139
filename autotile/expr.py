"""Safe arithmetic expressions for search spaces: parsed once with `ast`, checked against an allow-list.

An expression may use numbers, strings, the names it is given, arithmetic, comparisons, `and`/`or`/`not`,
`x if c else y`, `in` with a literal tuple or list, and the functions in `FUNCTIONS`. Anything else (attribute
access, subscripts, lambdas, comprehensions, other calls) is rejected when the file is loaded. The checked
tree is compiled once; evaluation runs that code object with no builtins, so no text is ever substituted
and evaluated.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Mapping

from .errors import SpaceDefinitionError


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of a / b."""
    return -(-a // b)


def is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


FUNCTIONS: dict[str, Any] = {
    "min": min, "max": max, "abs": abs, "int": int,
    "ceil_div": ceil_div, "floor": math.floor, "is_pow2": is_pow2,
}

_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
    ast.Load, ast.Constant, ast.Tuple, ast.List,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn,
)


_NO_BUILTINS: dict[str, Any] = {"__builtins__": {}}


class Expr:
    """One checked expression: its text, the names it reads, and a compiled evaluator."""

    __slots__ = ("text", "names", "_code")

    def __init__(self, text: str, where: str = "expression"):
        self.text = str(text).strip()
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise SpaceDefinitionError(f"{where}: cannot parse {self.text!r}: {exc.msg}") from None
        names: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED_NODES):
                raise SpaceDefinitionError(
                    f"{where}: {type(node).__name__} is not allowed in {self.text!r}")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                    raise SpaceDefinitionError(
                        f"{where}: only calls of {sorted(FUNCTIONS)} are allowed in {self.text!r}")
            elif isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                names.add(node.id)
        self.names: frozenset[str] = frozenset(names)
        self._code = compile(tree, f"<{where}>", "eval")

    def __call__(self, values: Mapping[str, Any]) -> Any:
        """The value with `values` bound to the names (functions are added)."""
        scope = dict(FUNCTIONS)
        scope.update(values)
        return self.eval_in(scope)

    def eval_in(self, scope: dict[str, Any]) -> Any:
        """The value in a scope that already holds `FUNCTIONS` (the fast path of enumeration)."""
        return eval(self._code, _NO_BUILTINS, scope)  # checked tree, no builtins: see module doc

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"
