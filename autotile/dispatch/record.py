"""A tuned record: the best config for one problem on one device, with its measurement, checked when made.

The cache (`autotile.dispatch.cache`) stores records as JSON files; this module says what a valid record
is (every field checked and normalised when a `Record` is made, so a bad one fails at once, not when it is
written or read back) and how it reads from and writes to JSON.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from autotile.codegen.problem import LAYOUT_ALIASES
from autotile.dispatch import precision as precision_mod
from autotile.errors import AutotileError, CacheError

SCHEMA = 1
_FIELDS = ("kernel", "dtype", "layout", "shape", "compat", "config", "time_ms", "spread", "metric",
           "metric_unit", "baseline_ms", "device", "environment", "schema")
# Added later: a record without `implementation` runs its generated config; one without `precision` needs
# what its config and implementation need (`precision.needed`).
_OPTIONAL_FIELDS = ("implementation", "precision")
IMPLEMENTATIONS = ("generated", "cublas")


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CacheError(f"record field {name!r} must be a non-empty string, not {value!r}")
    return value


def _check_number(name: str, value: Any, *, positive: bool) -> float:
    # bool is an int subclass; True as a time is a bug, not 1 ms.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CacheError(f"record field {name!r} must be a number, not {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise CacheError(f"record field {name!r} must be a finite number {'> 0' if positive else '>= 0'}, "
                    f"not {value!r}")
    return value


def check_shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise CacheError(f"shape must be a non-empty sequence of positive integers, not {value!r}")
    dims: list[int] = []
    for dim in value:
        try:
            if isinstance(dim, bool):
                raise TypeError
            n = operator.index(dim)  # accepts NumPy integers, rejects floats and strings
        except TypeError:
            raise CacheError(f"shape {value!r} must hold positive integers, not {dim!r}") from None
        if n < 1:
            raise CacheError(f"shape {value!r} must hold positive integers, not {n}")
        dims.append(int(n))
    return tuple(dims)


def _check_config(value: Any) -> dict[str, str | int | bool]:
    if not isinstance(value, Mapping):
        raise CacheError(f"record field 'config' must be a dict of parameter values, not {value!r}")
    config: dict[str, str | int | bool] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key:
            raise CacheError(f"config parameter names must be non-empty strings, not {key!r}")
        if isinstance(v, (str, bool, int)):
            config[key] = v
        else:
            try:  # a NumPy integer from a sampler is still an integer
                config[key] = int(operator.index(v))
            except TypeError:
                raise CacheError(f"config parameter {key!r} must be a str, int or bool, not {v!r}") from None
    return config


def _plain(value: Any) -> Any:
    """`value` as plain JSON data: NumPy scalars unwrapped, tuples as lists, NaN/inf as None, others str."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # a NumPy scalar
        try:
            return _plain(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _check_environment(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise CacheError(f"record field 'environment' must be a dict with string keys, not {value!r}")
    # The environment only describes the run, so it is made writable rather than refused: a tuning
    # result must not be lost at the end of a long run over a NumPy float among the versions.
    return _plain(value)


@dataclasses.dataclass(frozen=True)
class Record:
    """One tuned entry: the best config for a problem on a device, with its measurement.

    Times in milliseconds (`time_ms` is the median); `spread` is relative (for example
    (p75 - p25) / median); `metric` is in `metric_unit` (GFLOP/s or GB/s); `baseline_ms` is the cuBLAS time
    measured in the same run, if any. `implementation` says what the library runs for this problem:
    "generated" (the config) or "cublas" (where cuBLAS beat the best config; the config is kept all the
    same, a tuning result is never thrown away). `run_ms` is the time of what runs. `precision` is the
    class what runs needs ("highest": IEEE FP32 or float64; "high": tf32x3), which is also the record's slot
    in the cache; "" derives it from `config` and `implementation`, and a value that differs from what
    they need is refused. Constructing an invalid record raises `CacheError`.
    """

    kernel: str
    dtype: str
    layout: str
    shape: tuple[int, ...]
    compat: str
    config: dict[str, Any]
    time_ms: float
    spread: float
    metric: float
    metric_unit: str
    baseline_ms: float | None
    device: str
    environment: dict[str, Any]
    schema: int = SCHEMA
    implementation: str = "generated"
    precision: str = ""

    @property
    def run_ms(self) -> float:
        """Milliseconds of what the library runs for this record: the config, or cuBLAS."""
        if self.implementation == "cublas" and self.baseline_ms is not None:
            return self.baseline_ms
        return self.time_ms

    def __post_init__(self) -> None:
        # Validate and normalise here so that a bad record fails when it is made, not when it is written
        # or read back; frozen, so the normalised values go in through object.__setattr__.
        if isinstance(self.schema, bool) or self.schema != SCHEMA:
            raise CacheError(f"record schema {self.schema!r} is not supported (this autotile reads {SCHEMA})")
        for name in ("kernel", "dtype", "layout", "compat", "metric_unit", "device"):
            _check_str(name, getattr(self, name))
        # A layout under an older name (matmul's "row") is read under its current one ("nn").
        object.__setattr__(self, "layout", LAYOUT_ALIASES.get(self.kernel, {}).get(self.layout, self.layout))
        if self.implementation not in IMPLEMENTATIONS:
            raise CacheError(f"record field 'implementation' is {self.implementation!r}; "
                             f"expected one of {', '.join(IMPLEMENTATIONS)}")
        if self.implementation == "cublas" and self.baseline_ms is None:
            raise CacheError("a record that runs cuBLAS needs its time (baseline_ms)")
        normalised = {
            "shape": check_shape(self.shape),
            "config": _check_config(self.config),
            "environment": _check_environment(self.environment),
            "time_ms": _check_number("time_ms", self.time_ms, positive=True),
            "spread": _check_number("spread", self.spread, positive=False),
            "metric": _check_number("metric", self.metric, positive=False),
            "baseline_ms": (None if self.baseline_ms is None
                            else _check_number("baseline_ms", self.baseline_ms, positive=True)),
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "precision", self._check_precision())

    def _check_precision(self) -> str:
        """The class this record needs: derived, and compared with the stored one where there is one (a
        record filed under a stricter class than its config needs would run tensor cores under "highest")."""
        try:
            derived = precision_mod.needed(self.kernel, self.dtype, self.config, self.implementation)
        except AutotileError as exc:
            raise CacheError(f"record config: {exc}") from None
        if self.precision == "":
            return derived
        if self.precision not in precision_mod.CLASSES:
            raise CacheError(f"record field 'precision' is {self.precision!r}; expected one of "
                             f"{', '.join(precision_mod.CLASSES)}")
        if self.precision != derived:
            raise CacheError(f"record field 'precision' is {self.precision!r}, but its {self.implementation} "
                             f"config needs {derived!r}")
        return derived

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the shape as a list)."""
        return {
            "schema": self.schema, "kernel": self.kernel, "dtype": self.dtype, "layout": self.layout,
            "shape": list(self.shape), "compat": self.compat, "config": dict(self.config),
            "time_ms": self.time_ms, "spread": self.spread, "metric": self.metric,
            "metric_unit": self.metric_unit, "baseline_ms": self.baseline_ms, "device": self.device,
            "environment": dict(self.environment), "implementation": self.implementation,
            "precision": self.precision,
        }

    @classmethod
    def from_json(cls, d: Any) -> Record:
        """The record in a dict read from JSON. Raises `CacheError` on a missing, unknown or wrong field."""
        if not isinstance(d, dict):
            raise CacheError(f"a cache record must be a JSON object, not {type(d).__name__}")
        missing = [f for f in _FIELDS if f not in d]
        if missing:
            raise CacheError(f"cache record lacks field(s) {', '.join(missing)}")
        unknown = sorted(str(k) for k in d if k not in _FIELDS + _OPTIONAL_FIELDS)
        if unknown:  # a writer with another layout: the schema number should have said so
            raise CacheError(f"cache record has unknown field(s) {', '.join(unknown)}")
        if isinstance(d["schema"], bool) or not isinstance(d["schema"], int):
            raise CacheError(f"record field 'schema' must be an integer, not {d['schema']!r}")
        if not isinstance(d["shape"], list):  # JSON gives lists; a string would pass as a sequence
            raise CacheError(f"record field 'shape' must be a list of integers, not {d['shape']!r}")
        if not isinstance(d["config"], dict) or not isinstance(d["environment"], dict):
            raise CacheError("record fields 'config' and 'environment' must be JSON objects")
        return cls(**{f: d[f] for f in _FIELDS + _OPTIONAL_FIELDS if f in d})


__all__ = ["IMPLEMENTATIONS", "SCHEMA", "Record", "check_shape"]
