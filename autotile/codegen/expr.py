"""Safe arithmetic expressions for search spaces: parsed once with `ast`, checked against an allow-list.

An expression may use numbers, strings, the names it is given, arithmetic, comparisons, `and`/`or`/`not`,
`x if c else y`, `in` with a literal tuple or list, and the functions in `FUNCTIONS`. Anything else (attribute
access, subscripts, lambdas, comprehensions, other calls, a tuple or list anywhere but right of `in`) is
rejected when the file is loaded. The checked tree is compiled once; evaluation runs that code object with no
builtins, so no text is ever substituted and evaluated.

Evaluation is bounded in time and memory. The operators that can build a huge value from small ones run
through guards: `*` (integer products, repeated text), `**` (powers) and `%` (which formats text when its
left operand is a string). A guard raises `SpaceDefinitionError`, naming the expression and the limit,
where a result would pass `INT_LIMIT`, `SEQUENCE_LIMIT` or `EXPONENT_LIMIT`. The other operators grow a
value by at most a bit (`+` on integers) or the length of their operands (`+` on text) per use, so within
one expression their results stay within a small multiple of the inputs; the space bounds the values that
one expression hands to the next (`Space` checks each derived quantity with `check_size`).
"""

from __future__ import annotations

import ast
import copy
import math
from types import CodeType
from typing import Any, Callable, Mapping

from autotile.errors import SpaceDefinitionError

# The bounds of guarded arithmetic. A space's quantities are tile sizes, byte counts and register counts:
# 2**64 is far above any of them and far below what takes measurable time to compute.
INT_LIMIT = 2**64  # magnitude of an integer product or power
SEQUENCE_LIMIT = 1024  # characters of repeated text (or items of any repeated sequence)
EXPONENT_LIMIT = 64  # magnitude of an exponent
TEXT_LIMIT = 20_000  # characters of one expression (the project's longest is about 300)
NESTING_LIMIT = 100  # levels of parentheses and brackets in one expression


def _nesting(text: str) -> int:
    """The deepest nesting of (), [] and {} in `text` (outside quotes too: a rough, cheap bound)."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _show_text(text: str) -> str:
    """An expression's text for an error line, cut to 200 characters."""
    shown = repr(text)
    return shown if len(shown) <= 200 else shown[:197] + "..."


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


class LimitError(Exception):
    """A guarded operator would pass a limit. `Expr` turns it into a `SpaceDefinitionError` that names the
    expression (the guards do not know it)."""


# -- guards ----------------------------------------------------------------------------------------------
# Each takes the operands of one operator and returns what the operator would, or raises LimitError before
# doing work beyond the limit. The fast paths come first: enumeration calls these millions of times.

_HALF = 2**32  # two operands below this in magnitude multiply to below INT_LIMIT


def _show(value: Any) -> str:
    """A value for an error message, kept short: a huge integer by its size, long text cut."""
    if isinstance(value, int) and value.bit_length() > 80:
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def _mul(a: Any, b: Any, _lo: int = -_HALF, _hi: int = _HALF) -> Any:
    try:
        if _lo < a < _hi and _lo < b < _hi:  # small numbers: the product is small too
            return a * b
    except TypeError:  # text, a sequence or None: not comparable with a number
        pass
    return _mul_checked(a, b)


def _mul_checked(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):  # bool is an int
        if a.bit_length() + b.bit_length() > INT_LIMIT.bit_length() + 1:  # |a * b| >= 2**(bits - 2)
            raise LimitError(f"a product of {_show(a)} and {_show(b)} passes the integer limit 2**64")
        return _bounded_int(a * b, "a product")
    for count, seq in ((a, b), (b, a)):
        if isinstance(count, int) and not isinstance(seq, (int, float, complex)) and hasattr(seq, "__len__"):
            if count > 0 and len(seq) * count > SEQUENCE_LIMIT:
                raise LimitError(f"repeating {type(seq).__name__} of length {len(seq)} {count} times passes "
                                  f"the limit of {SEQUENCE_LIMIT} items")
    try:
        return a * b
    except OverflowError:  # an integer too large for a float
        raise LimitError(f"a product of {_show(a)} and {_show(b)} overflows a float") from None


def _pow(a: Any, b: Any) -> Any:
    if isinstance(b, (int, float)) and abs(b) > EXPONENT_LIMIT:
        raise LimitError(f"exponent {_show(b)} passes the limit of {EXPONENT_LIMIT}")
    if isinstance(a, int) and isinstance(b, int) and b > 0 and (a.bit_length() - 1) * b > INT_LIMIT.bit_length():
        # |a| ** b >= 2**((bits - 1) * b): far past the limit, so not computed
        raise LimitError(f"{_show(a)} ** {b} passes the integer limit 2**64")
    try:
        result = a ** b
    except OverflowError:
        raise LimitError(f"{_show(a)} ** {_show(b)} overflows a float") from None
    return _bounded_int(result, "a power") if isinstance(result, int) else result


def _mod(a: Any, b: Any) -> Any:
    # On text, % formats: a field width in the text ('%0999999999d') would build a string of that length.
    if isinstance(a, (str, bytes, bytearray)):
        raise LimitError("% formats text, which a space expression may not do")
    return a % b


def _bounded_int(value: int, what: str) -> int:
    if -INT_LIMIT <= value <= INT_LIMIT:
        return value
    raise LimitError(f"{what} of magnitude 2**{abs(value).bit_length() - 1} or more passes the integer limit 2**64")


def check_size(value: Any) -> str | None:
    """Why a value passes the limits of guarded arithmetic (text or a sequence longer than `SEQUENCE_LIMIT`,
    an integer above `INT_LIMIT` in magnitude), or None. For values that one expression hands to the next."""
    if isinstance(value, int):
        if -INT_LIMIT <= value <= INT_LIMIT:
            return None
        return f"an integer of magnitude 2**{abs(value).bit_length() - 1} or more passes the limit 2**64"
    if isinstance(value, (str, bytes, bytearray, list, tuple)) and len(value) > SEQUENCE_LIMIT:
        return f"a {type(value).__name__} of length {len(value)} passes the limit of {SEQUENCE_LIMIT} items"
    return None


# The guards live in the globals of every evaluation under names that no parsed text can spell, so neither
# an expression nor a scope can reach or shadow them.
_GUARDS: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Mult: ("<mul>", _mul),
    ast.Pow: ("<pow>", _pow),
    ast.Mod: ("<mod>", _mod),
}
_GLOBALS: dict[str, Any] = {"__builtins__": {}}
_GLOBALS.update({name: guard for name, guard in _GUARDS.values()})

# -- bounds ----------------------------------------------------------------------------------------------
# What is known of a value before evaluation: a bound on its magnitude (inf where none is known) and whether
# it is certainly an integer, or None where it may not be a number at all (text, say). Where both operands of
# `*` are numbers whose product stays below INT_LIMIT, or the left operand of `%` is a number, the operator
# cannot build a large value and runs unguarded: this keeps enumeration as fast as plain arithmetic.
Bound = tuple[float, bool]

_INF = math.inf


def value_bound(value: Any) -> Bound | None:
    """The bound of a known value (None for anything but a number)."""
    if isinstance(value, bool):
        return (1.0, True)
    if isinstance(value, int):
        return (float(abs(value)) if value.bit_length() < 1000 else _INF, True)
    if isinstance(value, (float, complex)):
        return (abs(value), False)
    return None


def _join(bounds: list[Bound | None]) -> Bound | None:
    """One of several values (the branches of `x if c else y`, the operands of `or`, the arguments of max)."""
    if not bounds or any(b is None for b in bounds):
        return None
    known = [b for b in bounds if b is not None]
    return (max(m for m, _ in known), all(i for _, i in known))


class _Measure:
    """Bounds of every node of a tree, given bounds of the names it reads (a name not given: None)."""

    def __init__(self, names: Mapping[str, Bound | None]):
        self.names = names
        self.of: dict[int, Bound | None] = {}  # id(node) -> bound

    def __call__(self, node: ast.AST) -> Bound | None:
        bound = self._measure(node)
        self.of[id(node)] = bound
        return bound

    def _measure(self, node: ast.AST) -> Bound | None:
        if isinstance(node, ast.Expression):
            return self(node.body)
        if isinstance(node, ast.Constant):
            return value_bound(node.value)
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.UnaryOp):
            operand = self(node.operand)
            return (1.0, True) if isinstance(node.op, ast.Not) else operand
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                self(side)
            return (1.0, True)
        if isinstance(node, ast.BoolOp):  # `and` / `or` return one of their operands
            return _join([self(v) for v in node.values])
        if isinstance(node, ast.IfExp):
            self(node.test)
            return _join([self(node.body), self(node.orelse)])
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self(node.left), self(node.right))
        if isinstance(node, ast.Call):
            return self._call(node)
        for child in ast.iter_child_nodes(node):  # a tuple or list right of `in`
            self(child)
        return None

    @staticmethod
    def _binop(op: ast.operator, left: Bound | None, right: Bound | None) -> Bound | None:
        if left is None or right is None:
            return None  # text, or an operand of unknown kind
        (ml, il), (mr, ir) = left, right
        if isinstance(op, (ast.Add, ast.Sub)):
            return (ml + mr, il and ir)
        if isinstance(op, ast.Mult):
            return (ml * mr, il and ir)
        if isinstance(op, ast.FloorDiv):  # |a // b| <= |a| + 1 where b is a nonzero integer
            return (ml + 1.0, il) if ir else (_INF, False)
        if isinstance(op, ast.Mod):  # |a % b| < |b|
            return (mr, il and ir)
        return (_INF, False)  # `/` and `**`: a float, or an integer the guard bounds

    def _call(self, node: ast.Call) -> Bound | None:
        args = [self(a) for a in node.args]
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        if name == "is_pow2":
            return (1.0, True)
        if any(a is None for a in args) or not args:
            return None
        known = [a for a in args if a is not None]
        if name in ("min", "max") and len(known) >= 2:
            return _join(list(known))
        if name == "abs" and len(known) == 1:
            return known[0]
        if name == "int" and len(known) == 1:  # truncates toward zero
            return (known[0][0], True)
        if name == "floor" and len(known) == 1:
            return (known[0][0] + 1.0, True)
        if name == "ceil_div" and len(known) == 2:  # -(-a // b)
            (ma, ia), (_, ib) = known
            return (ma + 1.0, ia) if ib else (_INF, False)
        return None


class _Guard(ast.NodeTransformer):
    """Rewrites `a * b`, `a ** b` and `a % b` into calls of the guards, except where `measure` proves the
    operator safe (see Bound). Where both operands are constants the guard runs now instead, so that a
    literal like ``10 ** 10 ** 10`` fails when the file is loaded."""

    def __init__(self, measure: _Measure | None):
        self.measure = measure

    def _safe(self, node: ast.BinOp) -> bool:
        if self.measure is None:
            return False
        left, right = self.measure.of.get(id(node.left)), self.measure.of.get(id(node.right))
        if isinstance(node.op, ast.Mult):
            return left is not None and right is not None and left[0] * right[0] <= INT_LIMIT
        if isinstance(node.op, ast.Mod):
            return left is not None
        return False

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        safe = self._safe(node)  # before the operands are rewritten: the bounds are keyed by node
        self.generic_visit(node)
        guard = _GUARDS.get(type(node.op))
        if guard is None:
            return node
        name, function = guard
        if isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant):
            try:
                value = function(node.left.value, node.right.value)
            except LimitError:
                raise
            except Exception:  # a TypeError or ZeroDivisionError: left for evaluation to raise, as before
                pass
            else:
                if isinstance(value, (int, float, complex, str, bytes)) or value is None:
                    return ast.copy_location(ast.Constant(value), node)
        if safe:
            return node
        call = ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], [])
        return ast.copy_location(call, node)


class Expr:
    """One checked expression: its text, the names it reads, and a compiled evaluator."""

    __slots__ = ("text", "names", "where", "_code", "_body")

    def __init__(self, text: str, where: str = "expression"):
        self.text = str(text).strip()
        self.where = where
        if len(self.text) > TEXT_LIMIT:  # a literal tuple of a million items would take seconds to check
            raise SpaceDefinitionError(f"{where}: the expression has {len(self.text)} characters, over the "
                                       f"limit of {TEXT_LIMIT}")
        if _nesting(self.text) > NESTING_LIMIT:  # the parser and the checks below recurse per level
            raise SpaceDefinitionError(f"{where}: the expression nests parentheses or brackets deeper than "
                                       f"{NESTING_LIMIT} levels")
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise SpaceDefinitionError(f"{where}: cannot parse {_show_text(self.text)}: {exc.msg}") from None
        except (RecursionError, MemoryError):
            raise SpaceDefinitionError(f"{where}: the expression is nested too deeply to parse") from None
        names: set[str] = set()
        # A tuple or list is allowed only as the literal right operand of `in` / `not in`: anywhere else it
        # would be a value that `*` could repeat and that nothing in a space needs.
        in_operands: set[int] = set()
        for node in ast.walk(tree):  # breadth first: a Compare is met before its operands
            if not isinstance(node, _ALLOWED_NODES):
                raise SpaceDefinitionError(
                    f"{where}: {type(node).__name__} is not allowed in {self.text!r}")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                    raise SpaceDefinitionError(
                        f"{where}: only calls of {sorted(FUNCTIONS)} are allowed in {self.text!r}")
            elif isinstance(node, ast.Compare):
                in_operands.update(id(right) for op, right in zip(node.ops, node.comparators, strict=True)
                                   if isinstance(op, (ast.In, ast.NotIn)))
            elif isinstance(node, (ast.Tuple, ast.List)) and id(node) not in in_operands:
                raise SpaceDefinitionError(
                    f"{where}: a {type(node).__name__} is allowed only right of 'in' or 'not in' in {self.text!r}")
            elif isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                names.add(node.id)
        self.names: frozenset[str] = frozenset(names)
        try:
            self._code = self._compile(tree, None)
        except (RecursionError, MemoryError):  # operators chained without parentheses (1+1+...+1) nest too
            raise SpaceDefinitionError(f"{where}: the expression is nested too deeply to compile") from None

    def _compile(self, tree: ast.Expression, measure: _Measure | None) -> CodeType:
        try:
            guarded = ast.fix_missing_locations(_Guard(measure).visit(tree))
        except LimitError as exc:
            raise SpaceDefinitionError(f"{self.where}: {self.text!r}: {exc}") from None
        self._body = guarded.body  # the checked, guarded tree, for `first_failure`
        return compile(guarded, f"<{self.where}>", "eval")

    def bound(self, names: Mapping[str, Bound | None]) -> Bound | None:
        """What is known of the value where each name holds a value within its bound in `names` (see
        `Bound`): a bound on its magnitude and whether it is an integer, or None if it may not be a number."""
        return _Measure(names)(ast.parse(self.text, mode="eval"))

    def specialized(self, names: Mapping[str, Bound | None]) -> "Expr":
        """This expression, compiled to evaluate only where each name holds a value within its bound in
        `names`: the guards of operators that cannot exceed a limit there are left out. Faster; unsafe
        with values outside the bounds, so for enumeration over a space's own choices only."""
        tree = ast.parse(self.text, mode="eval")
        measure = _Measure(names)
        measure(tree)
        other = Expr.__new__(Expr)
        other.text, other.names, other.where = self.text, self.names, self.where
        other._code = other._compile(tree, measure)
        return other

    def __call__(self, values: Mapping[str, Any]) -> Any:
        """The value with `values` bound to the names (functions are added)."""
        scope = dict(FUNCTIONS)
        scope.update(values)
        return self.eval_in(scope)

    def eval_in(self, scope: dict[str, Any]) -> Any:
        """The value in a scope that already holds `FUNCTIONS` (the fast path of enumeration)."""
        try:
            return eval(self._code, _GLOBALS, scope)  # checked tree, no builtins: see module doc
        except LimitError as exc:
            raise SpaceDefinitionError(f"{self.where}: {self.text!r}: {exc}") from None

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


def first_failure(derived: list[tuple[str, Expr]], constraints: list[Expr], where: str
                  ) -> tuple[CodeType, dict[str, Any]]:
    """One code object for a step of the enumeration: it binds each derived quantity in order, into the scope
    it is evaluated in, then evaluates the constraints in order, and its value is the index of the first that
    fails, or -1. Returned with the globals it runs with: `eval(code, globals, scope)` (a guard's limit then
    raises `LimitError` unnamed, for the caller to name). One evaluation where each expression took its own:
    the walk of the H100's bfloat16 matmul space made 13.8 million calls of `eval` over 1.5 million steps, and
    took 1.6x the time. Built from the expressions' checked, guarded trees only."""
    outcome: ast.expr = ast.Constant(-1)
    for index in reversed(range(len(constraints))):
        test = copy.deepcopy(constraints[index]._body)
        outcome = ast.IfExp(test=test, body=outcome, orelse=ast.Constant(index))
    steps: list[ast.expr] = [ast.NamedExpr(target=ast.Name(name, ast.Store()), value=copy.deepcopy(expr._body))
                             for name, expr in derived]
    if steps:
        outcome = ast.Subscript(value=ast.Tuple([*steps, outcome], ast.Load()), slice=ast.Constant(-1),
                                ctx=ast.Load())
    return compile(ast.fix_missing_locations(ast.Expression(outcome)), f"<{where}>", "eval"), _GLOBALS
