"""Bounded evaluation of space expressions: the guards of `*`, `**` and `%`, the place of tuples and lists,
and the bounds that let enumeration leave the guards out. No GPU."""

from __future__ import annotations

import pytest

from autotile.codegen.expr import EXPONENT_LIMIT, INT_LIMIT, SEQUENCE_LIMIT, Expr, LimitError, first_failure
from autotile.errors import SpaceDefinitionError

# Texts that would hang or exhaust memory without the guards; each fails when it is parsed, since its
# operands are constants.
AT_LOAD = [
    ("10**10**10", "exponent 10000000000 passes the limit of 64"),
    ("2 ** 65", "exponent 65 passes the limit of 64"),
    ("3 ** 64", "passes the integer limit 2**64"),
    ("2**40 * 2**40", "passes the integer limit 2**64"),
    ("'ab' * 10**6", "passes the limit of 1024 items"),
    ("10**6 * 'ab'", "passes the limit of 1024 items"),
    ("'%0999999999d' % 1", "% formats text"),
    ("10.0 ** 10**3", "exponent 1000 passes the limit of 64"),
]


@pytest.mark.parametrize("text,why", AT_LOAD, ids=[t for t, _ in AT_LOAD])
def test_unbounded_constant_arithmetic_fails_at_load(text, why):
    with pytest.raises(SpaceDefinitionError) as info:
        Expr(text, "x.yaml: derived big")
    message = str(info.value)
    assert message.startswith(f"x.yaml: derived big: {text!r}: ") and why in message
    assert "\n" not in message


# The same operators over names: the guard runs when the expression is evaluated.
AT_EVAL = [
    ("a ** b", {"a": 10, "b": 10**10}, "exponent 10000000000 passes the limit of 64"),
    ("a ** b", {"a": 10, "b": -65}, "exponent -65 passes the limit of 64"),
    ("a ** 64", {"a": 3}, "passes the integer limit 2**64"),
    ("a ** 2", {"a": 2**40}, "passes the integer limit 2**64"),
    ("a * b", {"a": 2**32, "b": 2**32 + 1}, "passes the integer limit 2**64"),
    ("a * b * c", {"a": 2**30, "b": 2**30, "c": 2**30}, "passes the integer limit 2**64"),
    ("-a * b", {"a": 2**40, "b": 2**40}, "passes the integer limit 2**64"),
    ("s * n", {"s": "dynamic", "n": 10**10}, "repeating str of length 7 10000000000 times"),
    ("n * s", {"s": "ab", "n": 513}, "passes the limit of 1024 items"),
    ("s % n", {"s": "%0999999999d", "n": 1}, "% formats text"),
    ("x * n", {"x": 1.5, "n": 10**400}, "overflows a float"),
    ("x ** 60", {"x": 1e300}, "overflows a float"),
]


@pytest.mark.parametrize("text,values,why", AT_EVAL, ids=[f"{t} {v}" for t, v, _ in AT_EVAL])
def test_unbounded_arithmetic_fails_at_evaluation(text, values, why):
    expr = Expr(text, "x.yaml: constraint big")
    with pytest.raises(SpaceDefinitionError) as info:
        expr(values)
    message = str(info.value)
    assert message.startswith(f"x.yaml: constraint big: {text!r}: ") and why in message
    assert "\n" not in message


def test_guarded_arithmetic_within_the_limits_is_plain_arithmetic():
    assert Expr("2 ** 64")({}) == INT_LIMIT
    assert Expr("a * b")({"a": 2**32, "b": 2**32}) == INT_LIMIT  # the limit itself is allowed
    assert Expr("a * b")({"a": -(2**32), "b": 2**32}) == -INT_LIMIT
    assert Expr("a ** b")({"a": 2, "b": EXPONENT_LIMIT}) == 2**64
    assert Expr("a ** b")({"a": 2, "b": -2}) == 0.25
    assert Expr("a ** 0.5")({"a": 16}) == 4.0
    assert Expr("(-1) ** 63 * a")({"a": 7}) == -7
    assert Expr("a * b")({"a": True, "b": 7}) == 7
    assert Expr("a * b")({"a": 2.5, "b": 4}) == 10.0
    assert Expr("s * n")({"s": "ab", "n": SEQUENCE_LIMIT // 2}) == "ab" * (SEQUENCE_LIMIT // 2)
    assert Expr("s * n")({"s": "ab", "n": -3}) == ""
    assert Expr("a % b + b % 3")({"a": 70, "b": 32}) == 8
    assert Expr("x % 1.0")({"x": 2.25}) == 0.25
    with pytest.raises(ZeroDivisionError):  # errors that are no bound keep their kind
        Expr("a % b")({"a": 1, "b": 0})
    with pytest.raises(TypeError):
        Expr("s * t")({"s": "ab", "t": "cd"})


LISTS = [
    "[0] * 10**10",
    "(1, 2) * n",
    "[1] + [2]",
    "max((1, 2))",
    "(1, 2) in x",
    "x in ((1, 2), 3)",  # only the literal right of `in`, not one inside it
    "(x, 1) == (1, x)",
]


@pytest.mark.parametrize("text", LISTS)
def test_tuples_and_lists_only_right_of_in(text):
    with pytest.raises(SpaceDefinitionError) as info:
        Expr(text, "test")
    assert "allowed only right of 'in' or 'not in'" in str(info.value) and repr(text) in str(info.value)


def test_tuples_and_lists_right_of_in_still_work():
    Expr("x in (1, 2) and y not in [3, z] and 4 in [x, 4] not in [5]")  # parses
    assert Expr("x in (1, 2, 2 * y) and y not in [3]")({"x": 8, "y": 4}) is True
    assert Expr("a < x in (1, 2)")({"a": 0, "x": 2}) is True


def test_bounds_of_expressions():
    ints = {"a": (16.0, True), "b": (8.0, True), "s": None, "f": (2.0, False)}
    assert Expr("a * b + 1").bound(ints) == (129.0, True)
    assert Expr("a // b if s == 'x' else -a").bound(ints) == (17.0, True)
    assert Expr("a % 5 + max(a, b) + ceil_div(a, b) + floor(f)").bound(ints) == (5.0 + 16 + 17 + 3, True)
    assert Expr("a < b and a > 3").bound(ints) == (1.0, True)
    assert Expr("a * f").bound(ints) == (32.0, False)
    assert Expr("a / b").bound(ints)[0] == float("inf")  # type: ignore[index]
    assert Expr("a ** 2").bound(ints) == (float("inf"), False)
    for text in ("s", "s + s", "a if b else s", "s or a", "min(s, a)", "int(s)", "a * s", "unknown"):
        assert Expr(text).bound(ints) is None, text


def test_specialized_expressions_keep_the_guards_their_bounds_cannot_spare():
    big = {"a": (2.0**40, True), "b": (2.0**40, True)}
    with pytest.raises(SpaceDefinitionError, match="2\\*\\*64"):
        Expr("a * b").specialized(big)({"a": 2**40, "b": 2**40})
    with pytest.raises(SpaceDefinitionError, match="1024 items"):
        Expr("s * n").specialized({"s": None, "n": (4.0, True)})({"s": "ab", "n": 10**6})
    with pytest.raises(SpaceDefinitionError, match="% formats text"):
        Expr("s % n").specialized({"s": None, "n": (4.0, True)})({"s": "%0999d", "n": 1})
    with pytest.raises(SpaceDefinitionError, match="exponent"):
        Expr("a ** b").specialized({"a": (2.0, True), "b": (100.0, True)})({"a": 2, "b": 100})
    small = {"a": (256.0, True), "b": (256.0, True)}
    fast = Expr("a * b % 7 + a ** 2", "derived x").specialized(small)
    assert (fast.text, fast.names, fast.where) == ("a * b % 7 + a ** 2", {"a", "b"}, "derived x")
    for a in (0, 1, 255, -256):
        for b in (3, 256):
            assert fast({"a": a, "b": b}) == Expr(fast.text)({"a": a, "b": b}) == a * b % 7 + a**2


def test_first_failure_binds_the_derived_values_in_order_and_names_the_first_broken_constraint():
    """The enumeration's one code object per step (`first_failure`): each derived value bound into the scope, in
    order (a later one reads an earlier one), then the index of the first constraint that fails, or -1; the
    guards of the expressions stay in it."""
    derived = [("double", Expr("a * 2")), ("quad", Expr("double * 2"))]
    constraints = [Expr("quad > 4"), Expr("a != 3"), Expr("b ** a < 100")]
    code, names = first_failure(derived, constraints, "x.yaml: step 0")
    for a, b, expected in ((1, 2, 0), (3, 2, 1), (4, 4, 2), (2, 2, -1)):
        scope = {"a": a, "b": b}
        assert eval(code, names, scope) == expected, (a, b)
        assert scope["double"] == 2 * a and scope["quad"] == 4 * a
    with pytest.raises(LimitError):
        eval(code, names, {"a": 40, "b": 10**6})  # b ** a: the guard of `**`
    code, names = first_failure([], [], "x.yaml: step 1")
    assert eval(code, names, {}) == -1
