"""Search spaces: parameters and their choices, constraints, derived quantities, named configs.

A space is loaded from `search_spaces/<kernel>.yaml`. Constraints and derived quantities are `Expr`
objects over the parameters, the problem (`dtype_size` in bytes, `layout`) and the device limits
(`DeviceLimits.as_names()`). Every space defines the derived quantities `threads` (per block),
`smem_bytes` (shared memory per block, in bytes) and `regs_per_thread` (an estimate), and a parameter
`smem` (none, static or dynamic); from these, this module adds the occupancy figures and the device-limit
constraints once for all kernels, so that a config that cannot launch never reaches a compiler.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import CodeType
from typing import Any, NamedTuple

from autotile import safe_files
from autotile.codegen import resources
from autotile.codegen.dtypes import DTYPE_SIZES
from autotile.codegen.expr import FUNCTIONS, Bound, Expr, LimitError, check_size, first_failure, value_bound
from autotile.codegen.limits import DEFAULT_OFFLINE_PROFILE, PROFILES, DeviceLimits
from autotile.codegen.problem import LAYOUT_ALIASES, LAYOUTS
from autotile.errors import InfeasibleConfigError, InvalidValueError, SpaceDefinitionError, UnknownNameError

# Occupancy: how many blocks of this config fit on one SM, by each resource. Registers are allocated per
# warp in units of 256, that is 8 per thread.
DEVICE_DERIVED: tuple[tuple[str, str], ...] = (
    ("regs_per_block", "ceil_div(regs_per_thread, 8) * 8 * threads"),
    ("blocks_by_threads", "max_threads_per_sm // max(threads, 1)"),
    ("blocks_by_smem", "max_blocks_per_sm if smem_bytes == 0 else "
                       "smem_per_sm // (smem_bytes + reserved_smem_per_block)"),
    ("blocks_by_regs", "regs_per_sm // max(regs_per_block, 1)"),
    ("blocks_per_sm", "min(max_blocks_per_sm, blocks_by_threads, blocks_by_smem, blocks_by_regs)"),
)

_DEVICE_DERIVED_NAMES = frozenset(name for name, _ in DEVICE_DERIVED)

# What evaluating a checked expression can raise where the space is at fault: text compared with a number,
# a division by zero, an unknown name (Expr refuses those at load, but a scope may lack one).
_EVAL_ERRORS = (ArithmeticError, TypeError, ValueError, NameError)

DEVICE_CONSTRAINTS: tuple[tuple[str, str, str], ...] = (
    ("threads per block", "threads <= max_threads_per_block",
     "a block may not have more threads than the device allows"),
    ("static shared memory per block", "smem != 'static' or smem_bytes <= static_smem_per_block",
     "statically declared shared memory is capped at 48 KB per block; larger tiles need smem=dynamic"),
    ("dynamic shared memory per block (opt-in)", "smem != 'dynamic' or smem_bytes <= optin_smem_per_block",
     "dynamic shared memory is capped by the device's opt-in limit per block"),
    ("shared memory per SM", "smem_bytes + reserved_smem_per_block <= smem_per_sm",
     "one block and the system's reservation must fit into one SM's shared memory"),
    ("registers per thread", "regs_per_thread <= max_regs_per_thread",
     "above 255 registers per thread the compiler spills to local memory"),
    ("registers per block", "regs_per_block <= regs_per_block_limit",
     "a block's registers must fit into the register file"),
)

MAX_PARAMS = 100  # parameters of one space (matmul has 20): enumeration recurses once per parameter
MAX_CHOICES = 4096  # choices of one parameter (the largest here has 9)


class Config(Mapping[str, Any]):
    """A frozen name -> value mapping: one point of a space. Hashable, ordered as the space declares."""

    __slots__ = ("_items", "_dict")

    def __init__(self, values: Mapping[str, Any]):
        self._items = tuple(values.items())
        self._dict = dict(self._items)

    def __getitem__(self, name: str) -> Any:
        return self._dict[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def key(self) -> str:
        """A stable one-line text, for example ``BM=64,BN=64,...``: the identity of a config in caches."""
        return ",".join(f"{k}={v}" for k, v in self._items)

    def __repr__(self) -> str:
        return f"Config({self.key()})"


@dataclasses.dataclass(frozen=True)
class Param:
    """One tunable parameter. A parameter added after configs were tuned carries a `default`: the value
    that reproduces the kernel from before it existed, so that older records still read as configs."""

    name: str
    choices: tuple[Any, ...]
    doc: str = ""
    has_default: bool = False
    default: Any = None
    # A conditional parameter: it matters only where `active` (an expression over earlier parameters)
    # holds, and takes the value `inactive` elsewhere. The sampler draws it only where it is active.
    active: Expr | None = None
    inactive: Any = None
    # Choices not yet verified on hardware: the space holds them (named configs and `--fix` can name
    # them), but while the parameter has any other choice a constraint keeps them out of every search.
    experimental: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class Constraint:
    name: str
    expr: Expr
    doc: str = ""
    from_device: bool = False


@dataclasses.dataclass(frozen=True)
class SpaceCount:
    """How many points a space has, how many are feasible, and which constraint excluded the others.

    Each infeasible point is counted once, against the first constraint that excludes it (constraints are
    checked as soon as the parameters they read are bound, in the order the space declares them).
    """

    total: int
    feasible: int
    excluded_by: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Problem:
    """The fixed part of an evaluation: the device and the data's type and layout."""

    device: DeviceLimits
    dtype: str = "float32"
    layout: str = "row"

    def names(self) -> dict[str, Any]:
        if self.dtype not in DTYPE_SIZES:
            raise InvalidValueError(f"dtype {self.dtype!r} is not supported; choose one of {list(DTYPE_SIZES)}")
        if self.layout not in LAYOUTS:
            raise InvalidValueError(f"layout {self.layout!r} is not supported; choose one of {list(LAYOUTS)}")
        names: dict[str, Any] = dict(self.device.as_names())
        names["regs_per_block_limit"] = names.pop("regs_per_block")
        names["dtype_size"] = DTYPE_SIZES[self.dtype]
        names["dtype"] = self.dtype
        names["layout"] = self.layout
        return names


CONTEXT_NAMES = frozenset(Problem(PROFILES[DEFAULT_OFFLINE_PROFILE]).names())

# What enumeration assumes of the problem's names (see `Bound` in expr.py): the device limits are integers
# up to 2**40 (a terabyte), the element size is one of DTYPE_SIZES, the dtype and the layout are text. A problem outside
# these is enumerated with every guard on.
_CONTEXT_BOUNDS: dict[str, Bound | None] = {
    name: (2.0**40, True) if type(value) is int else None
    for name, value in Problem(PROFILES[DEFAULT_OFFLINE_PROFILE]).names().items()}
_CONTEXT_BOUNDS["dtype_size"] = (float(max(DTYPE_SIZES.values())), True)


def _within(values: Mapping[str, Any], bounds: Mapping[str, Bound | None]) -> bool:
    """Whether every value that `bounds` says is an integer is one, within its magnitude bound."""
    for name, bound in bounds.items():
        if bound is not None:
            value = values.get(name)
            if type(value) is not int or abs(value) > bound[0]:
                return False
    return True


def _choices_bound(choices: tuple[Any, ...]) -> Bound | None:
    """The bound of a parameter: the largest magnitude among its choices, if all are numbers."""
    bounds = [value_bound(c) for c in choices]
    known = [b for b in bounds if b is not None]
    if not known or len(known) < len(bounds):
        return None
    return (max(m for m, _ in known), all(i for _, i in known))


def _kind(value: Any) -> str:
    """What a YAML value is, for an error message: null, a list, a mapping, the text '64', the number 256."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, (int, float)):
        return f"the number {value}" if abs(value) < 1e12 else "a number"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _short(value: Any) -> str:
    """A value's repr for an error message, cut after 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _is_scalar(value: Any) -> bool:
    """A value a parameter can take: text, a number or a boolean (a config must be hashable and rendered)."""
    return isinstance(value, (str, int, float, bool))


def _mapping(value: Any, where: str, key: str, of_what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpaceDefinitionError(f"{where}: {key} must be a mapping of {of_what}, not {_kind(value)}")
    return value


def _text(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpaceDefinitionError(f"{where}: {key} must be a non-empty text, not {_kind(value)}")
    return value


def _expr(text: Any, where: str, key: str) -> Expr:
    """The expression of `key` (for example ``derived threads``); YAML reads ``256`` or ``true`` as a number
    or a boolean, so the text must be quoted."""
    if not isinstance(text, str):
        raise SpaceDefinitionError(f"{where}: {key} must be an expression in quotes, not {_kind(text)}")
    return Expr(text, f"{where}: {key}")


class _Step(NamedTuple):
    """One level of the enumeration as the walk evaluates it (`Space._steps`): binding one parameter."""

    eager: list[tuple[str, Expr]]  # derived quantities evaluated one by one (through `_eval`: size checked)
    code: CodeType  # the rest of the level's derived quantities and its constraints (`first_failure`)
    code_globals: dict[str, Any]
    constraint_names: list[str]  # by the index `code` evaluates to
    subtree_key: tuple[str, ...] | None  # the names bound before this level that it and the levels below read


# A subtree's counts are memoized by the values of its `subtree_key` where that holds at most this many names (the
# last levels of a space, whose parameters few others read); a longer key is rarely seen twice.
_SUBTREE_KEY_NAMES = 10


class Space:
    """One kernel's search space, as declared by its YAML file plus the device-limit model."""

    def __init__(self, data: Mapping[str, Any], source: str = "<space>"):
        where = source
        if not isinstance(data, Mapping):
            what = "empty" if data is None else f"{_kind(data)}, not a mapping"
            raise SpaceDefinitionError(
                f"{where}: the space is {what}; it needs the keys kernel, template, params and derived")
        self._data = dict(data)
        self._source = source
        for key in ("kernel", "template", "params"):
            if key not in data:
                raise SpaceDefinitionError(f"{where}: missing field {key!r}")
        self.kernel: str = _text(data["kernel"], where, "'kernel'")
        self.template: str = _text(data["template"], where, "'template'")
        self.description: str = str(data.get("description", "")).strip()
        layouts = data.get("layouts", ["row"])
        if not isinstance(layouts, (list, tuple)) or not layouts:
            raise SpaceDefinitionError(f"{where}: 'layouts' must be a list of layouts such as [row, col], "
                                       f"not {_kind(layouts)}")
        self.layouts: tuple[str, ...] = tuple(_text(v, where, "an entry of 'layouts'") for v in layouts)
        self.params: dict[str, Param] = {}
        raw_params = _mapping(data["params"], where, "'params'", "parameter names to their choices")
        if len(raw_params) > MAX_PARAMS:  # enumeration walks one level per parameter
            raise SpaceDefinitionError(f"{where}: 'params' has {len(raw_params)} parameters, over the limit of "
                                       f"{MAX_PARAMS}")
        for name, spec in raw_params.items():
            self._check_new_name(name, "parameter", where, set(self.params))
            self.params[name] = self._param(name, spec, where)
        if "smem" not in self.params:
            raise SpaceDefinitionError(f"{where}: every space needs the parameter 'smem' (none/static/dynamic)")

        known = set(self.params) | CONTEXT_NAMES
        self.derived: dict[str, Expr] = {}
        raw_derived = _mapping(data.get("derived") or {}, where, "'derived'", "names to expressions")
        for name, text in raw_derived.items():
            self._check_new_name(name, "derived quantity", where, known)
            expr = _expr(text, where, f"derived {name}")
            self._check_names(expr, known, where)
            self.derived[name] = expr
            known.add(name)
        for name, text in DEVICE_DERIVED:
            self.derived[name] = Expr(text, f"{where}: derived {name}")
            known.add(name)
        for required in ("threads", "smem_bytes", "regs_per_thread"):
            if required not in self.derived:
                raise SpaceDefinitionError(f"{where}: the derived quantity {required!r} is missing")

        self.constraints: list[Constraint] = []
        raw_constraints = data.get("constraints") or []
        if not isinstance(raw_constraints, (list, tuple)):
            raise SpaceDefinitionError(f"{where}: 'constraints' must be a list of mappings with 'name' and 'expr', "
                                       f"not {_kind(raw_constraints)}")
        for number, item in enumerate(raw_constraints, 1):
            if not isinstance(item, Mapping) or "expr" not in item:
                if isinstance(item, Mapping):
                    # a key with a line break or a control character is shown as its repr: the error stays one line
                    keys = ", ".join(str(k) if str(k).isprintable() else repr(k) for k in item)
                    got = f"has no 'expr' (keys: {keys})"
                else:
                    got = f"is {_kind(item)}, not a mapping with 'name' and 'expr'"
                raise SpaceDefinitionError(f"{where}: constraint {number} of 'constraints' {got}")
            name = str(item.get("name", item["expr"]))
            expr = _expr(item["expr"], where, f"constraint {name}")
            self._check_names(expr, known, where)
            self.constraints.append(Constraint(name, expr, str(item.get("doc", ""))))
        # A conditional parameter outside its condition takes one value: a constraint like any other, so
        # that enumeration, counting and checking treat it alike (and prune as soon as it is bound).
        # Where a narrowed space left the inactive value out (`--fix LOADER=presplit`), the parameter is active in
        # every feasible config: a config outside its condition would hold a value the space does not have.
        for param in self.params.values():
            if param.active is None:
                continue
            if param.inactive in param.choices:
                text = f"({param.active.text}) or {param.name} == {param.inactive!r}"
                name = f"{param.name} only where {param.active.text}"
                doc = f"{param.name} is {param.inactive!r} elsewhere"
            else:
                text = param.active.text
                name = f"{param.name} narrowed to its active values"
                doc = f"{param.name} takes only {list(param.choices)}, which hold only where {param.active.text}"
            self.constraints.append(Constraint(name, Expr(text, f"{where}: condition of {param.name}"), doc))
        # Experimental choices: out of the search while anything else is left (`restricted` to them alone,
        # as `--fix` does, lets them in).
        for param in self.params.values():
            if param.experimental and any(v not in param.experimental for v in param.choices):
                listed = ", ".join(map(repr, param.experimental))
                self.constraints.append(Constraint(
                    f"{param.name} {listed} experimental", Expr(f"{param.name} not in ({listed},)",
                                                               f"{where}: experimental {param.name}"),
                    f"searched only where {param.name} is fixed to experimental choices (--fix {param.name}=...)"))
        # Last: violations() and check() list the space's own rules before the device limits.
        for name, text, doc in DEVICE_CONSTRAINTS:
            self.constraints.append(Constraint(name, Expr(text, f"device constraint {name}"), doc, True))

        self.named_configs: dict[str, Config] = {}
        self.named_layouts: dict[str, str] = {}  # the layout a named config was made for, if only one
        raw_configs = _mapping(data.get("configs") or {}, where, "'configs'", "names to parameter values")
        for name, values in raw_configs.items():
            values = dict(_mapping(values, where, f"config {name!r}", "parameters to values"))
            if "layout" in values:
                self.named_layouts[str(name)] = str(values.pop("layout"))
            try:
                self.named_configs[str(name)] = self.config(values)
            except (InvalidValueError, UnknownNameError) as exc:
                raise SpaceDefinitionError(f"{where}: config {name!r}: {exc}") from None
        # The built-in default per layout: a name, or a list of names tried in order until one is
        # feasible for the dtype and device at hand.
        default = data.get("default")
        by_layout = ({layout: default for layout in self.layouts} if isinstance(default, (str, list))
                     else dict(_mapping(default or {}, where, "'default'", "layouts to config names")))
        self.defaults: dict[str, list[str]] = {}
        for layout, names in by_layout.items():
            if isinstance(names, str):
                names = [names]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise SpaceDefinitionError(f"{where}: 'default' for layout {layout} must be a config name or a "
                                           f"list of them, not {_kind(names)}")
            self.defaults[str(layout)] = list(names)
        for layout, names in self.defaults.items():
            for name in names:
                if name not in self.named_configs:
                    raise SpaceDefinitionError(f"{where}: default {name!r} for layout {layout} is not a named config")
        # What is known of each name's values before enumeration (see `Bound` in expr.py): the plan's
        # expressions leave out the guards this proves needless. A derived quantity that may not be a number
        # (text, say) is checked against the size limits as it is computed, since `+` could double it from
        # one derived quantity to the next.
        bounds: dict[str, Bound | None] = dict(_CONTEXT_BOUNDS)
        bounds.update((name, _choices_bound(param.choices)) for name, param in self.params.items())
        for name, expr in self.derived.items():
            bounds[name] = expr.bound(bounds)
        self._bounds = bounds
        self._unsized = frozenset(name for name in self.derived if bounds[name] is None)
        self._plan = self._make_plan(bounds)
        self._guarded_plan: list[tuple[list[tuple[str, Expr]], list[Constraint]]] | None = None
        self._counts: dict[Problem, SpaceCount] = {}  # `count`'s answers: a walk of the space each (seconds)
        self._steps_of: dict[int, list[_Step]] = {}  # `_steps`, by plan

    def _param(self, name: str, spec: Any, where: str) -> Param:
        """One parameter from its entry in 'params': a list of choices, or a mapping with 'choices'."""
        if isinstance(spec, (list, tuple)):
            spec = {"choices": spec}
        elif not isinstance(spec, Mapping):
            raise SpaceDefinitionError(f"{where}: parameter {name!r} must be a list of choices or a mapping with "
                                       f"'choices', not {_kind(spec)}")
        choices = spec.get("choices")
        if choices is None or (isinstance(choices, (list, tuple)) and not choices):
            raise SpaceDefinitionError(f"{where}: parameter {name!r} has no choices")
        if not isinstance(choices, (list, tuple)):
            raise SpaceDefinitionError(f"{where}: 'choices' of parameter {name!r} must be a list, not {_kind(choices)}")
        if len(choices) > MAX_CHOICES:
            raise SpaceDefinitionError(f"{where}: parameter {name!r} has {len(choices)} choices, over the limit of "
                                       f"{MAX_CHOICES}")
        for value in [*choices, *([spec["inactive"]] if "inactive" in spec else [])]:
            if not _is_scalar(value):
                raise SpaceDefinitionError(f"{where}: a value of parameter {name!r} must be text, a number or a "
                                           f"boolean, not {_kind(value)}")
        param = Param(name, tuple(choices), str(spec.get("doc", "")))
        experimental = spec.get("experimental", [])
        if not isinstance(experimental, (list, tuple)):
            raise SpaceDefinitionError(f"{where}: 'experimental' of parameter {name!r} must be a list of choices")
        # (a space narrowed by hand may have left some out: those are simply gone)
        param = dataclasses.replace(param, experimental=tuple(v for v in experimental if v in choices))
        if "default" in spec:
            try:
                param = dataclasses.replace(param, has_default=True, default=self._coerce(param, spec["default"]))
            except InvalidValueError:
                raise SpaceDefinitionError(
                    f"{where}: default {spec['default']!r} of {name!r} is not among its choices") from None
        if "active" in spec:
            if "inactive" not in spec:
                raise SpaceDefinitionError(f"{where}: conditional parameter {name!r} needs an 'inactive' value")
            active = _expr(spec["active"], where, f"active of {name}")
            self._check_names(active, set(self.params), where)  # earlier parameters only
            try:
                inactive = self._coerce(param, spec["inactive"])
            except InvalidValueError:
                # Allowed (a narrowed space may leave the value out): the parameter is then active
                # in every feasible config. The shipped spaces' inactive values are among their
                # choices (tests/test_space.py).
                inactive = spec["inactive"]
            param = dataclasses.replace(param, active=active, inactive=inactive)
        return param

    @staticmethod
    def _check_new_name(name: Any, what: str, where: str, taken: set[str]) -> None:
        """A parameter or derived name must be an identifier that expressions can read and that hides nothing
        else an expression reads: a function, a quantity of the problem or the device model, a name in `taken`."""
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise SpaceDefinitionError(f"{where}: the {what} name {name!r} is not an identifier")
        if name in FUNCTIONS or name in CONTEXT_NAMES or name in _DEVICE_DERIVED_NAMES or name in taken:
            raise SpaceDefinitionError(f"{where}: the {what} name {name!r} is taken (by a function, a problem or "
                                       f"device quantity, or an earlier name)")

    def restricted(self, choices: Mapping[str, Any]) -> "Space":
        """This space with some parameters narrowed to the given values (one value or a list of them).
        Named configs that fall outside the narrowed choices are dropped."""
        data = dict(self._data)
        params = {name: dict(spec) if isinstance(spec, Mapping) else {"choices": list(spec)}
                  for name, spec in data["params"].items()}
        for name, values in choices.items():
            if name not in self.params:
                raise UnknownNameError(
                    f"{self.kernel}: unknown parameter {name!r}; parameters: {', '.join(self.params)}")
            values = values if isinstance(values, (list, tuple)) else [values]
            params[name]["choices"] = [self._coerce(self.params[name], v) for v in values]
            if "experimental" in params[name]:
                params[name]["experimental"] = [v for v in self.params[name].experimental
                                                if v in params[name]["choices"]]
            if self.params[name].has_default and self.params[name].default not in params[name]["choices"]:
                del params[name]["default"]  # narrowed away from its default: every config names it
        data["params"] = params
        allowed = {name: set(map(repr, spec["choices"])) for name, spec in params.items()}
        configs = {}
        for cname, config in self.named_configs.items():  # complete: a defaulted value counts too
            if all(repr(v) in allowed[k] for k, v in config.items()):
                configs[cname] = dict(config)
        data["configs"] = configs
        data["default"] = {layout: [n for n in names if n in configs] for layout, names in self.defaults.items()
                           if any(n in configs for n in names)}
        return Space(data, f"{self._source} (narrowed)")

    @classmethod
    def load(cls, path: str | Path, shipped: bool = False) -> "Space":
        """The space of a YAML file: a regular file within `safe_files.MAX_TEXT_BYTES`, UTF-8, within
        `safe_files.load_yaml`'s bounds (`shipped`: one of autotile's own, read by the faster
        `safe_files.load_own_yaml`); every problem one `SpaceDefinitionError` line."""
        text = safe_files.read_text(path, "search space", error=SpaceDefinitionError)
        load = safe_files.load_own_yaml if shipped else safe_files.load_yaml
        return cls(load(text, str(path), SpaceDefinitionError), str(path))

    @staticmethod
    def _check_names(expr: Expr, known: set[str], where: str) -> None:
        unknown = sorted(expr.names - known)
        if unknown:
            raise SpaceDefinitionError(f"{where}: {expr.text!r} uses unknown names {unknown}")

    # -- configs -------------------------------------------------------------------------------------

    def config(self, values: Mapping[str, Any] | str) -> Config:
        """A `Config` from a named config or a full mapping, with every name and value checked."""
        if isinstance(values, str):
            return self.named(values)
        unknown = [k for k in values if k not in self.params]
        if unknown:
            raise UnknownNameError(
                f"{self.kernel}: unknown parameter {unknown[0]!r}; parameters: {', '.join(self.params)}")
        missing = [k for k, p in self.params.items() if k not in values and not p.has_default]
        if missing:
            raise InvalidValueError(f"{self.kernel}: config lacks parameter(s) {', '.join(missing)}")
        ordered = {}
        for name, param in self.params.items():
            ordered[name] = self._coerce(param, values[name]) if name in values else param.default
        return Config(ordered)

    def source_key(self, config: Config) -> str:
        """The config's line in its rendered source: `Config.key()` without the parameters that sit at
        the default they were added with, so that adding a knob leaves existing kernels' text, and the
        source hashes kept in tuned records, unchanged."""
        return ",".join(f"{k}={v}" for k, v in config.items()
                        if not (k in self.params and self.params[k].has_default and self.params[k].default == v))

    def with_overrides(self, base: Config, overrides: Mapping[str, Any]) -> Config:
        """`base` with some parameters replaced (values may be text, as typed on a command line)."""
        values = dict(base)
        for name, value in overrides.items():
            if name not in self.params:
                raise UnknownNameError(
                    f"{self.kernel}: unknown parameter {name!r}; parameters: {', '.join(self.params)}")
            values[name] = value
        return self.config(values)

    def named(self, name: str) -> Config:
        try:
            return self.named_configs[name]
        except KeyError:
            raise UnknownNameError(
                f"{self.kernel}: unknown config {name!r}; named configs: {', '.join(self.named_configs)}"
            ) from None

    def default_config(self, layout: str = "row", problem: "Problem | None" = None) -> Config:
        """The built-in fallback config: the first of the layout's defaults that is feasible for `problem`
        (float32 on the default offline profile when None)."""
        layout = LAYOUT_ALIASES.get(self.kernel, {}).get(layout, layout)
        names = self.defaults.get(layout)
        if not names:
            raise UnknownNameError(f"{self.kernel} has no default config for layout {layout!r}")
        problem = problem or Problem(PROFILES[DEFAULT_OFFLINE_PROFILE], "float32", layout)
        for name in names:
            if self.is_feasible(self.named_configs[name], problem):
                return self.named_configs[name]
        return self.named_configs[names[0]]

    @staticmethod
    def _coerce(param: Param, value: Any) -> Any:
        """The choice equal to `value`; text (from a command line) matches a choice's text."""
        for choice in param.choices:
            if type(choice) is type(value) and choice == value:
                return choice
        text = str(value).strip().lower()
        for choice in param.choices:
            if str(choice).lower() == text:
                return choice
        raise InvalidValueError(f"{param.name}={value!r} is not among the choices {list(param.choices)}")

    # -- evaluation ----------------------------------------------------------------------------------

    def derive(self, config: Config, problem: Problem) -> dict[str, Any]:
        """The derived quantities of one config (threads, smem_bytes, blocks_per_sm, ...)."""
        scope = dict(FUNCTIONS)
        scope.update(problem.names())
        scope.update(config)
        out = {}
        for name, expr in self.derived.items():
            scope[name] = out[name] = self._eval(expr, scope, name)
        return out

    def violations(self, config: Config, problem: Problem) -> list[str]:
        """One line for each constraint the config breaks, naming the values involved; empty if feasible.
        The space's own constraints come first, then the device limits (`self.constraints` keeps that order)."""
        scope = dict(FUNCTIONS)
        scope.update(problem.names())
        scope.update(config)
        for name, expr in self.derived.items():
            scope[name] = self._eval(expr, scope, name)
        lines = []
        for c in self.constraints:
            if not self._holds(c, scope):
                involved = ", ".join(f"{n}={scope[n]}" for n in sorted(c.expr.names) if n in scope)
                lines.append(f"breaks '{c.name}' ({c.expr.text}) with {involved}")
        return lines

    def check(self, config: Config, problem: Problem) -> None:
        """Raise `InfeasibleConfigError` naming every constraint the config breaks, in one line: the space's
        own constraints first, then the device limits. A device limit is often only the symptom (a tf32x3
        tile on an sm_60 device also overflows its shared memory); the structural rule names the cause."""
        broken = self.violations(config, problem)
        if broken:
            raise InfeasibleConfigError(
                f"{self.kernel} config is infeasible on {problem.device.name} ({problem.dtype}): {'; '.join(broken)}")

    def is_feasible(self, config: Config, problem: Problem) -> bool:
        """Whether `config` breaks no constraint (`feasibility` says how it is checked)."""
        return self.feasibility(problem)(config)

    def feasibility(self, problem: Problem) -> Callable[[Mapping[str, Any]], bool]:
        """A check of configs (parameter -> value) for `problem`, made once for many configs. It follows the
        enumeration's plan (each constraint checked as soon as the parameters it reads are bound) and stops
        at the first broken constraint: a random draw is refused after a few evaluations, not all of them
        (the samplers check hundreds of thousands)."""
        base = dict(FUNCTIONS)
        base.update(problem.names())
        if not _within(base, _CONTEXT_BOUNDS):  # outside the bounds the plan's shortcuts assume: in full
            return lambda config: not self.violations(Config(dict(config)), problem)
        steps = list(zip(self.params, self._steps(self._plan), strict=True))

        def check(config: Mapping[str, Any]) -> bool:
            scope = dict(base)
            try:
                for param, step in steps:
                    scope[param] = config[param]
                    for name, expr in step.eager:
                        scope[name] = self._eval(expr, scope, name)
                    if eval(step.code, step.code_globals, scope) >= 0:
                        return False
            except SpaceDefinitionError:
                raise
            except (*_EVAL_ERRORS, LimitError) as exc:
                raise self._diagnose_walk(self._plan, scope, exc) from None
            return True

        return check

    def _eval(self, expr: Expr, scope: dict[str, Any], name: str) -> Any:
        """The value of the derived quantity `name`, checked against the size limits where it may be text."""
        try:
            value = expr.eval_in(scope)
        except SpaceDefinitionError:
            raise
        except _EVAL_ERRORS as exc:
            raise self._failure(f"derived {name}", expr, scope, exc) from None
        if name in self._unsized:
            why = check_size(value)
            if why is not None:
                raise SpaceDefinitionError(f"{self._source}: derived {name}: {expr.text!r}: {why}")
        return value

    def _holds(self, c: Constraint, scope: dict[str, Any]) -> bool:
        try:
            return bool(c.expr.eval_in(scope))
        except SpaceDefinitionError:
            raise
        except _EVAL_ERRORS as exc:
            raise self._failure(f"constraint {c.name}", c.expr, scope, exc) from None

    def _failure(self, what: str, expr: Expr, scope: Mapping[str, Any], exc: Exception) -> SpaceDefinitionError:
        """An expression that cannot be evaluated for values of the space (text compared with a number, a
        division by zero): the space is at fault, so the error names it, the expression and the values."""
        involved = ", ".join(f"{n}={_short(scope[n])}" for n in sorted(expr.names) if n in scope)
        return SpaceDefinitionError(
            f"{self._source}: {what}: {expr.text!r} fails with {involved}: {type(exc).__name__}: {exc}")

    def _diagnose(self, scope: Mapping[str, Any], exc: Exception) -> SpaceDefinitionError:
        """The error of an evaluation that failed during enumeration (which, to stay fast, does not track
        the expression it is at): the first derived quantity or constraint that fails for the parameter
        values in `scope`."""
        values = {name: value for name, value in scope.items() if name not in self.derived}
        try:
            for name, expr in self.derived.items():
                values[name] = self._eval(expr, values, name)
            for c in self.constraints:
                self._holds(c, values)
        except SpaceDefinitionError as found:
            return found
        return SpaceDefinitionError(f"{self._source}: an expression fails: {type(exc).__name__}: {exc}")

    # -- enumeration ---------------------------------------------------------------------------------

    def _make_plan(self, bounds: Mapping[str, Bound | None] | None
                   ) -> list[tuple[list[tuple[str, Expr]], list[Constraint]]]:
        """For each parameter index, the derived values and constraints that become computable once that
        parameter is bound (index 0 also takes those that read no parameter). Checking a constraint as
        early as possible prunes whole subtrees of the product of choices. With `bounds`, the expressions
        are specialized to them (see `Expr.specialized`)."""
        order = {name: i for i, name in enumerate(self.params)}
        level: dict[str, int] = {}

        def level_of(names: frozenset[str]) -> int:
            return max([order[n] for n in names if n in order] + [level[n] for n in names if n in level] + [0])

        plan: list[tuple[list[tuple[str, Expr]], list[Constraint]]] = [([], []) for _ in self.params]
        for name, expr in self.derived.items():
            level[name] = level_of(expr.names)
            plan[level[name]][0].append((name, expr if bounds is None else expr.specialized(bounds)))
        for c in self.constraints:
            fast = c if bounds is None else dataclasses.replace(c, expr=c.expr.specialized(bounds))
            plan[level_of(c.expr.names)][1].append(fast)
        return plan

    def _steps(self, plan: list[tuple[list[tuple[str, Expr]], list[Constraint]]]) -> list[_Step]:
        """Each level of `plan` as the walk evaluates it (`_Step`). A level with a derived quantity that may be
        text evaluates all its derived ones one by one, through `_eval`, which checks their size. A failure is
        named afterwards by `_diagnose_walk`."""
        found = self._steps_of.get(id(plan))
        if found is not None:
            return found
        params = list(self.params)
        bound = [{params[level]} | {name for name, _ in derived} for level, (derived, _) in enumerate(plan)]
        read = [set().union(*(expr.names for _, expr in derived), *(c.expr.names for c in constraints))
                for derived, constraints in plan]
        found = []
        for level, (derived, constraints) in enumerate(plan):
            eager = derived if any(name in self._unsized for name, _ in derived) else []
            code, code_globals = first_failure([] if eager else derived, [c.expr for c in constraints],
                                               f"{self._source}: the walk's step {level}")
            key = set().union(*bound[:level]) & set().union(*read[level:])
            found.append(_Step(eager, code, code_globals, [c.name for c in constraints],
                               tuple(sorted(key)) if len(key) <= _SUBTREE_KEY_NAMES else None))
        self._steps_of[id(plan)] = found  # (a plan lives as long as its space: its id stays its own)
        return found

    def _walk(self, problem: Problem, on_feasible: Callable[[dict[str, Any]], None] | None,
              choose: Callable[[int], Iterable[int]] | None = None) -> SpaceCount:
        """Visit the product of choices depth-first, pruning a subtree at its first broken constraint; with
        `on_feasible`, call it on each feasible point's scope, in order. Without, only count: a subtree whose
        levels read few names bound above it is counted once per distinct value of those names (`_Step`'s
        `subtree_key`; the matmul space on a P100 in under half the time). With `choose` too, count first,
        then call `on_feasible` only on the points at the positions (in the walk's order) that
        `choose(feasible count)` returns, skipping the subtrees that hold none by their counts."""
        params = list(self.params.values())
        total = math.prod(len(p.choices) for p in params)
        below = [math.prod(len(p.choices) for p in params[i + 1:]) for i in range(len(params))]
        excluded = {c.name: 0 for c in self.constraints}
        count = 0
        scope = dict(FUNCTIONS)
        scope.update(problem.names())
        plan = self._plan
        if not _within(scope, _CONTEXT_BOUNDS):  # the plan's shortcuts assume these bounds
            if self._guarded_plan is None:
                self._guarded_plan = self._make_plan(None)
            plan = self._guarded_plan
        last = len(params) - 1
        steps = self._steps(plan)

        def visit(i: int) -> None:
            nonlocal count
            param, step = params[i], steps[i]
            for value in param.choices:
                scope[param.name] = value
                for name, expr in step.eager:
                    scope[name] = self._eval(expr, scope, name)
                failed = eval(step.code, step.code_globals, scope)
                if failed >= 0:
                    excluded[step.constraint_names[failed]] += below[i]
                elif i < last:
                    visit(i + 1)
                else:
                    count += 1
                    if on_feasible is not None:
                        on_feasible(scope)

        # Counting only: a subtree's counts (its feasible points, and what each constraint excluded there) are
        # kept by the values of its key, and a repeat of those values reads them.
        known: list[dict[tuple[Any, ...], tuple[int, dict[str, int]]]] = [{} for _ in params]
        dropped: dict[str, int] = {}  # what `gather`'s counts exclude again: already counted

        def tally(i: int, broken: dict[str, int]) -> int:
            """The feasible points below level i; the points each constraint excluded there are added to
            `broken`. A level whose counts are memoized keeps its own (feasible, excluded) per key; the others
            add straight into their caller's dict. (Its loop is visit's, written out again: a generator or
            call shared by the two cost the count 15-70%.)"""
            param, step = params[i], steps[i]
            key: tuple[Any, ...] = ()
            outer = broken
            if step.subtree_key is not None:
                key = tuple([scope[name] for name in step.subtree_key])
                found = known[i].get(key)
                if found is None:
                    broken = {}
                else:
                    for name, n in found[1].items():
                        outer[name] = outer.get(name, 0) + n
                    return found[0]
            feasible = 0
            for value in param.choices:
                scope[param.name] = value
                for name, expr in step.eager:
                    scope[name] = self._eval(expr, scope, name)
                failed = eval(step.code, step.code_globals, scope)
                if failed >= 0:
                    name = step.constraint_names[failed]
                    broken[name] = broken.get(name, 0) + below[i]
                elif i < last:
                    feasible += tally(i + 1, broken)
                else:
                    feasible += 1
            if step.subtree_key is not None:
                known[i][key] = (feasible, broken)
                for name, n in broken.items():
                    outer[name] = outer.get(name, 0) + n
            return feasible

        def bind(i: int, value: Any) -> bool:
            """Level i's parameter set to `value` in the scope, its derived quantities evaluated: whether its
            constraints hold."""
            param, step = params[i], steps[i]
            scope[param.name] = value
            for name, expr in step.eager:
                scope[name] = self._eval(expr, scope, name)
            return bool(eval(step.code, step.code_globals, scope) < 0)

        def gather(i: int, first: int, picks: list[int], at: int) -> tuple[int, int]:
            """`on_feasible` on the picked points below level i: `first` is the position of its first feasible
            point, `picks[at:]` the positions still to reach (ascending). Where the next level's counts are
            memoized, a subtree holding no pick is passed over by its count; where they are not, the subtree
            is walked, which passes over the memoized subtrees deeper down the same way. Returns (the position
            after what was walked or passed over, the picks reached); stops once every pick is reached."""
            assert on_feasible is not None
            counted = i < last and steps[i + 1].subtree_key is not None
            for value in params[i].choices:
                if at == len(picks):
                    break
                if not bind(i, value):
                    continue
                if i == last:
                    if picks[at] == first:
                        on_feasible(scope)
                        at += 1
                    first += 1
                elif counted:
                    size = tally(i + 1, dropped)  # memoized: the count made it
                    if picks[at] < first + size:
                        at = gather(i + 1, first, picks, at)[1]
                    first += size
                else:
                    first, at = gather(i + 1, first, picks, at)
            return first, at

        try:
            if on_feasible is None or choose is not None:
                broken: dict[str, int] = {}
                count = tally(0, broken)
                excluded.update(broken)
                if choose is not None:
                    picks = sorted(set(choose(count)))
                    if picks:
                        gather(0, 0, picks, 0)
            else:
                visit(0)
        except SpaceDefinitionError:
            raise
        except (*_EVAL_ERRORS, LimitError) as exc:
            raise self._diagnose_walk(plan, scope, exc) from None
        return SpaceCount(total, count, excluded)

    def _diagnose_walk(self, plan: list[tuple[list[tuple[str, Expr]], list[Constraint]]], scope: dict[str, Any],
                       exc: Exception) -> SpaceDefinitionError:
        """The error of an evaluation that failed during the walk, naming the expression: the plan's levels
        evaluated again in order, as the walk did, with the values it had bound (the failing level is
        reached before any deeper one, whose names may hold an earlier subtree's values)."""
        try:
            for derived, constraints in plan:
                for name, expr in derived:
                    scope[name] = self._eval(expr, scope, name)
                for c in constraints:
                    self._holds(c, scope)
        except SpaceDefinitionError as found:
            return found
        return self._diagnose(scope, exc)

    def count(self, problem: Problem) -> SpaceCount:
        """Total, feasible and excluded-per-constraint counts (about a second for a million points; computed
        once per problem: a space does not change once loaded)."""
        found = self._counts.get(problem)
        if found is None:
            found = self._counts[problem] = self._walk(problem, None)
        return found

    def feasible(self, problem: Problem, limit: int | None = None) -> list[Config]:
        """The feasible configs in the order of the declared choices (the first `limit` of them)."""
        found: list[Config] = []
        names = list(self.params)

        class _Enough(Exception):
            pass

        def keep(scope: dict[str, Any]) -> None:
            found.append(Config({n: scope[n] for n in names}))
            if limit is not None and len(found) >= limit:
                raise _Enough

        try:
            self._walk(problem, keep)
        except _Enough:
            pass
        return found

    def sample(self, problem: Problem, n: int, seed: int = 0, max_draws: int = 100_000) -> list[Config]:
        """Up to `n` distinct feasible configs drawn uniformly at random. Rejection sampling over the product
        of choices first (cheap where the feasible share is not tiny, and the draws every seeded sample was
        chosen by); where `max_draws` draws leave it short, the rest is drawn uniformly from the enumerated
        feasible set (a count of it, then the drawn positions reached through the subtrees' counts), so a
        sparse space still yields `n` configs where it has them."""
        rng = random.Random(seed)
        choice = rng.choice
        params = list(self.params.values())
        # experimental choices are never feasible while others remain: not drawn (the same draws as before)
        drawable = [(p.name, tuple(c for c in p.choices if c not in p.experimental) or p.choices) for p in params]
        feasible = self.feasibility(problem)
        seen: dict[Config, None] = {}
        for _ in range(max_draws):
            if len(seen) >= n:
                break
            values = {name: choice(choices) for name, choices in drawable}
            if feasible(values):
                config = Config(values)
                if config not in seen:
                    seen[config] = None
        if len(seen) < n:
            self._complete_from_enumeration(problem, seen, n, rng)
        return list(seen)

    def _complete_from_enumeration(self, problem: Problem, seen: dict[Config, None], n: int,
                                   rng: random.Random) -> None:
        """Adds to `seen` feasible configs it lacks, uniformly without replacement, until it holds `n` (or
        every feasible config): counts the feasible set, picks positions in it, and goes to them, passing
        over the subtrees that hold none by their counts (experimental choices are refused by their
        constraint, as in the rejection draws). The positions, and so the configs, are the ones a second
        walk of every feasible point collected."""
        known = self._counts.get(problem)
        if known is not None and len(seen) >= min(n, known.feasible):
            return
        names = list(self.params)
        found: list[Config] = []

        def choose(feasible_count: int) -> list[int]:
            if len(seen) >= min(n, feasible_count):
                return []
            # As many positions as could be needed: some may land on configs the rejection draws already hold.
            return rng.sample(range(feasible_count), min(feasible_count, n))

        def collect(scope: dict[str, Any]) -> None:
            found.append(Config({name: scope[name] for name in names}))

        self._counts.setdefault(problem, self._walk(problem, collect, choose))
        rng.shuffle(found)
        for config in found:
            if len(seen) >= n:
                break
            seen.setdefault(config, None)

    # -- optuna --------------------------------------------------------------------------------------

    def suggest(self, trial: Any) -> Config:
        """A config drawn through an optuna trial: one categorical per parameter, drawn only where the
        parameter is active (the others take their inactive value, so no draw is wasted on them)."""
        values: dict[str, Any] = {}
        for p in self.params.values():
            if p.active is not None and not p.active(values):  # __call__ adds the functions to the scope
                values[p.name] = p.inactive
            else:
                values[p.name] = trial.suggest_categorical(p.name, list(self.searchable(p.name)))
        return Config(values)

    def searchable(self, name: str) -> tuple[Any, ...]:
        """The choices of parameter `name` that `suggest` draws from (optuna's categorical distribution for
        it). Experimental choices are never drawn while others remain (the constraint would refuse them),
        which also keeps the distribution of studies made before they existed."""
        p = self.params[name]
        return tuple(c for c in p.choices if c not in p.experimental) or p.choices

    def from_drawn(self, drawn: Mapping[str, Any]) -> Config:
        """The config an optuna trial's parameters (`trial.params`) stand for: the draws, plus the
        inactive value of every conditional parameter that was not drawn."""
        values: dict[str, Any] = {}
        for p in self.params.values():
            if p.name in drawn:
                values[p.name] = self._coerce(p, drawn[p.name])
            elif p.active is not None and not p.active(values):
                values[p.name] = p.inactive
            else:
                raise InvalidValueError(f"{self.kernel}: trial lacks parameter {p.name}")
        return Config(values)


def load_space(kernel: str) -> Space:
    """The space of a kernel by name, from the installed or source-tree `search_spaces/`."""
    path = resources.search_space_path(kernel)
    return Space.load(path, shipped=True)
