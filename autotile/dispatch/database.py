"""The shape database: for one device, kernel, dtype and layout, the time of every portfolio candidate
(generated configs and cuBLAS) on a grid of shapes, measured in one run.

It is what the selection model (`autotile.dispatch.model`) learns from, and it is built by `autotile survey`
(`autotile.tuning.survey`) on the GPU it describes. Layout on disk, next to the tuned records of the device::

    <root>/<device fingerprint>/database/<kernel>-<dtype>-<layout>.json

in the user root (written by `save`) and in the shipped cache (read-only); the user's file wins. Writes
are atomic and take the device folder's lock, like the tuning cache's. A damaged file is reported as a
`CacheWarning` and skipped: the selection then falls back to the tuned records.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotile import safe_files
from autotile.codegen.problem import LAYOUT_ALIASES, layout_spellings
from autotile.dispatch.cache import TuningCache, _device_dir, _safe
from autotile.errors import CacheError

DATABASE_SCHEMA = 1
FOLDER = "database"
MAX_DATABASE_BYTES = 64 << 20  # a database of 500 shapes and 100 candidates is about 1 MB
IMPLEMENTATIONS = ("generated", "cublas")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One implementation the survey timed: cuBLAS, or a generated config (with the hash of the kernel
    source it timed, so that a template change retires exactly the candidates it alters)."""

    name: str
    implementation: str
    config: dict[str, Any] | None = None
    source_sha: str | None = None

    def __post_init__(self) -> None:
        if self.implementation not in IMPLEMENTATIONS:
            raise CacheError(f"candidate {self.name!r}: implementation {self.implementation!r} is not one of "
                             f"{', '.join(IMPLEMENTATIONS)}")
        if (self.implementation == "generated") != (self.config is not None):
            raise CacheError(f"candidate {self.name!r}: a generated candidate has a config, cuBLAS none")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "implementation": self.implementation, "config": self.config,
                "source_sha": self.source_sha}


@dataclasses.dataclass(frozen=True, eq=False)
class ShapeDatabase:
    """Times in milliseconds (median, L2 flushed): `times_ms[i][j]` is candidate j on shape i, None where it
    was not timed (infeasible, failed verification, or not worth timing there, such as a K split on a shape
    that fills the GPU without one). `environment` holds the GPU, date, versions and compile options."""

    kernel: str
    dtype: str
    layout: str
    device: str
    candidates: tuple[Candidate, ...]
    shapes: tuple[tuple[int, ...], ...]
    times_ms: tuple[tuple[float | None, ...], ...]
    environment: dict[str, Any]
    schema: int = DATABASE_SCHEMA

    def __post_init__(self) -> None:
        if self.schema != DATABASE_SCHEMA:
            raise CacheError(f"shape database schema {self.schema!r} is not supported (this autotile reads "
                             f"{DATABASE_SCHEMA})")
        if len(self.times_ms) != len(self.shapes):
            raise CacheError(f"shape database has {len(self.shapes)} shapes but {len(self.times_ms)} rows of times")
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names):
            raise CacheError("shape database candidates' names are not unique")
        for shape, row in zip(self.shapes, self.times_ms, strict=True):
            if len(row) != len(self.candidates):
                raise CacheError(f"shape database row {'x'.join(map(str, shape))} has {len(row)} times for "
                                 f"{len(self.candidates)} candidates")
            for t in row:
                if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                    raise CacheError(f"shape database time {t!r} at {'x'.join(map(str, shape))} is not a "
                                     "positive number")
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
                raise CacheError(f"shape database shape {shape!r} is not a list of positive integers")
        bound = self.environment.get("max_shape")
        if bound is not None and not (
                isinstance(bound, list) and (not self.shapes or len(bound) == len(self.shapes[0]))
                and all(b is None or (isinstance(b, int) and not isinstance(b, bool) and b >= 1) for b in bound)):
            raise CacheError(f"shape database max_shape {bound!r} is not a list of positive sizes or nulls, one "
                             "per dimension")

    def covers(self, shape: tuple[int, ...]) -> bool:
        """Whether the survey meant this database for `shape`: within its `max_shape` (the largest size per
        dimension, None where unbounded; a database surveyed for decode-size rows only has one), where it
        has one. A shape it does not cover takes another database's choice (`dispatch.select`)."""
        bound = self.environment.get("max_shape")
        if bound is None:
            return True
        return len(bound) == len(shape) and all(b is None or d <= b for d, b in zip(shape, bound, strict=True))

    @property
    def cublas_index(self) -> int | None:
        return next((j for j, c in enumerate(self.candidates) if c.implementation == "cublas"), None)

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "kernel": self.kernel, "dtype": self.dtype, "layout": self.layout,
                "device": self.device, "environment": self.environment,
                "candidates": [c.to_json() for c in self.candidates],
                "shapes": [list(s) for s in self.shapes], "times_ms": [list(r) for r in self.times_ms]}

    @classmethod
    def from_json(cls, d: Any) -> ShapeDatabase:
        """The database in a dict read from JSON; raises `CacheError` where it is not one."""
        try:
            candidates = tuple(Candidate(name=str(c["name"]), implementation=str(c["implementation"]),
                                         config=c.get("config"), source_sha=c.get("source_sha"))
                               for c in d["candidates"])
            kernel, layout = str(d["kernel"]), str(d["layout"])
            layout = LAYOUT_ALIASES.get(kernel, {}).get(layout, layout)  # an older name (matmul's "row")
            return cls(kernel=kernel, dtype=str(d["dtype"]), layout=layout,
                       device=str(d["device"]), candidates=candidates,
                       shapes=tuple(tuple(s) for s in d["shapes"]),
                       times_ms=tuple(tuple(r) for r in d["times_ms"]),
                       environment=dict(d.get("environment") or {}), schema=d.get("schema", -1))
        except (KeyError, TypeError, AttributeError) as exc:
            raise CacheError(f"not a shape database ({type(exc).__name__}: {exc})") from None


def path_in(root: Path, device: str, kernel: str, dtype: str, layout: str) -> Path:
    """Where the database of (device, kernel, dtype, layout) lives under a cache root."""
    return _path_in(root, device, kernel, dtype, LAYOUT_ALIASES.get(kernel, {}).get(layout, layout))


def _path_in(root: Path, device: str, kernel: str, dtype: str, spelling: str) -> Path:
    name = "-".join((_safe(kernel, "kernel"), _safe(dtype, "dtype"), _safe(spelling, "layout"))) + ".json"
    return root / _device_dir(device) / FOLDER / name


def load(cache: TuningCache, device: str, kernel: str, dtype: str, layout: str) -> ShapeDatabase | None:
    """The user's database for this problem family if there is a valid one, else the shipped one, else None."""
    layout = LAYOUT_ALIASES.get(kernel, {}).get(layout, layout)
    spellings = layout_spellings(kernel, layout)  # a user's database may have an older layout name
    for root, spelling in ((root, spelling) for root in cache._roots() for spelling in spellings):
        path = _path_in(root, device, kernel, dtype, spelling)
        try:
            st = os.stat(path)
        except OSError:
            continue
        try:
            db = _read(str(path), st.st_mtime_ns, st.st_size)
        except CacheError as exc:
            cache._report(path, f"shape database skipped: {exc}")
            continue
        if (db.kernel, db.dtype, db.layout, db.device) != (kernel, dtype, layout, device):
            cache._report(path, f"shape database skipped: it describes {db.kernel} {db.dtype} {db.layout} on "
                                f"{db.device}")
            continue
        return db
    return None


def load_sibling(cache: TuningCache, device: str, kernel: str, dtype: str, layout: str) -> ShapeDatabase | None:
    """Where `device` (a fingerprint, "NAME_sm_XY") has no database for this problem family: one of another
    GPU of the same architecture (the first by name), whose kernels are the same and whose measured ranking
    is the nearest there is (an H200 reading the H100's bfloat16 and int8 databases). None where there is
    none."""
    arch = device.rsplit("_", 1)[-1]
    others = sorted({path.name for root in cache._roots() if root.is_dir()
                     for path in root.glob(f"*_{arch}") if path.is_dir() and path.name != _device_dir(device)})
    for other in others:
        db = load(cache, other, kernel, dtype, layout)
        if db is not None:
            return db
    return None


def find(cache: TuningCache, device: str, kernel: str, dtype: str, layout: str) -> ShapeDatabase | None:
    """The database a problem family on `device` is served by: its own (`load`), else a sibling GPU's of the
    same architecture (`load_sibling`), else None. The selection chain and tuning at first call both ask
    this, so that what one predicts from, the other times."""
    return load(cache, device, kernel, dtype, layout) or load_sibling(cache, device, kernel, dtype, layout)


def find_first(cache: TuningCache, device: str, families: Sequence[tuple[str, str, str]],
               accept: Callable[[ShapeDatabase], bool] = lambda db: True) -> ShapeDatabase | None:
    """The database that serves the first of `families` ((kernel, dtype, layout), the problem's own first,
    then those it borrows from, nearest first) on `device`: the GPU's own databases of all of them before
    a sibling GPU's of any. A GPU's own measurements of a neighbouring family predict better than another
    GPU's of the family itself: on the H200's databases (2026-11-28, the same 31 candidates) bfloat16's
    choices ran under 0.97x cuBLAS on 32 of 615 float16 shapes, the H100's bfloat16 choices on 76 of the
    H200's bfloat16 ones. `accept` skips a database that cannot serve (one that does not cover the shape).
    The selection chain asks in the same order (`select._own_gpu_first`)."""
    for reader in (load, load_sibling):
        for kernel, dtype, layout in families:
            db = reader(cache, device, kernel, dtype, layout)
            if db is not None and accept(db):
                return db
    return None


@functools.lru_cache(maxsize=32)
def _read(path: str, mtime_ns: int, size: int) -> ShapeDatabase:
    # Keyed by modification time and size: a rebuilt database is read again, an unchanged one once.
    # Only a regular file is opened (a FIFO would block selection), within the size limit, JSON within
    # `safe_files.MAX_DEPTH` levels: anything else is one CacheError line, and the database is skipped.
    text = safe_files.read_text(path, "shape database", MAX_DATABASE_BYTES, CacheError)
    return ShapeDatabase.from_json(safe_files.load_json(text, path, CacheError))


def save(cache: TuningCache, db: ShapeDatabase) -> Path:
    """Write `db` to the user root, atomically; returns its path. Raises `CacheError` if it cannot."""
    path = path_in(cache.root, db.device, db.kernel, db.dtype, db.layout)
    text = json.dumps(db.to_json(), separators=(",", ":"), allow_nan=False) + "\n"
    cache._check_root()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with cache._lock(path.parent.parent):
            cache._write_atomic(path, text)
    except OSError as exc:
        raise CacheError(f"cannot write the shape database {path}: {exc}") from None
    return path


__all__ = ["Candidate", "ShapeDatabase", "load", "path_in", "save"]
