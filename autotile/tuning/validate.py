"""Checks of tuning options that cost nothing, made before any GPU work.

A bad storage URL, seed or timeout would otherwise surface minutes later, after the worker process has
started and the seeds have been compiled and timed, or (a negative seed) deep inside optuna or numpy with
a message that names neither the option nor its limit. The `autotile` command and `autotile.tune` call the
same functions, so both reject the same values with the same words. Each takes the name to print (the
command passes "--seed", the library "seed"), returns the value to use, and raises `InvalidValueError`
with a one-line message naming the value and the limit it broke. Nothing here prints, touches the GPU, or
connects to a database.
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, overload

from autotile.errors import InvalidValueError, shown

# optuna seeds its samplers with numpy's legacy RandomState, which takes 0 .. 2**32 - 1 only.
SEED_MAX = 2**32 - 1

# The databases SQLAlchemy (which optuna's RDBStorage is built on) ships dialects for. Used for the
# message, and to check a URL where SQLAlchemy itself cannot be imported.
KNOWN_DIALECTS = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql")
_URL = re.compile(r"^(?P<dialect>[A-Za-z][A-Za-z0-9_]*)(\+(?P<driver>[A-Za-z0-9_]+))?://(?P<rest>.*)$")
_STORAGE_FORMS = "journal:FILE, sqlite:///FILE, postgresql[+driver]://..., mysql[+driver]://..."


def seed(n: Any, *, name: str = "seed") -> int:
    """`n` as a sampler seed: an integer in 0 .. 2**32 - 1."""
    if isinstance(n, bool) or not isinstance(n, int):  # True would pass as 1, 3.0 would be truncated silently
        raise InvalidValueError(f"{name} must be an integer in 0..{SEED_MAX}, got {n!r}")
    if not 0 <= n <= SEED_MAX:
        raise InvalidValueError(f"{name} {n} is out of range: optuna and numpy take seeds in 0..{SEED_MAX}")
    return n


def count(n: Any, *, name: str, minimum: int = 1) -> int:
    """`n` as a whole number of at least `minimum` (trials, repetitions): a Python or NumPy integer, or
    text of ASCII digits; never a bool, a fraction, an infinity or NaN (each refused in one line)."""
    if isinstance(n, str) and n.strip().isascii() and n.strip().isdigit():
        n = int(n.strip())
    elif isinstance(n, bool) or not hasattr(n, "__index__"):
        raise InvalidValueError(f"{name} must be a whole number of at least {minimum}, got {shown(n)}")
    n = operator.index(n)  # a NumPy integer becomes an int; a float has no __index__
    if n < minimum:
        raise InvalidValueError(f"{name} must be at least {minimum}, got {n}")
    return n


@overload
def seconds(x: None, *, name: str, allow_none: bool) -> None: ...


@overload
def seconds(x: float, *, name: str, allow_none: bool) -> float: ...


def seconds(x: float | None, *, name: str, allow_none: bool) -> float | None:
    """`x` as a duration: a positive, finite number of seconds, or None (no limit) where `allow_none`.

    NaN compares false with everything, so a NaN timeout would never fire; infinity is what None means."""
    if x is None:
        if allow_none:
            return None
        raise InvalidValueError(f"{name} must be a positive, finite number of seconds, got None")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise InvalidValueError(f"{name} must be a positive, finite number of seconds, got {x!r}")
    if not math.isfinite(x) or x <= 0:
        none = " (leave it out for no limit)" if allow_none else ""
        raise InvalidValueError(f"{name} must be a positive, finite number of seconds{none}, got {x:g}")
    return float(x)


@overload
def storage_url(url: None, *, name: str = ...) -> None: ...


@overload
def storage_url(url: str, *, name: str = ...) -> str: ...


def storage_url(url: str | None, *, name: str = "storage") -> str | None:
    """`url` if optuna can open it as a storage (None, the in-memory default, passes through).

    optuna hands a storage string to SQLAlchemy, so the URL must name a database SQLAlchemy has a dialect
    (and, if given, a driver) for. For SQLite the file's folder must exist and be writable, and the file,
    if there, writable: SQLite reports neither until the study is created. No connection is made and no
    file is created."""
    if url is None:
        return None
    if not isinstance(url, str):
        raise InvalidValueError(f"{name} must be a URL string such as sqlite:///tune.db, got {url!r}")
    if url.startswith("journal:"):  # optuna's journal file (autotile.tuning.study): one host, no server
        path = url[len("journal:"):]
        if not path.strip():
            raise InvalidValueError(f"{name} {url!r} names no file; use journal:PATH")
        file = Path(path).expanduser()
        if file.is_dir():
            raise InvalidValueError(f"{name} {url!r}: {path!r} is a folder, not a journal file")
        writable_folder(file.parent, name=f"{name} {url!r}: folder")
        return url
    match = _URL.match(url)
    if match is None:
        example = url.strip() if url.strip().isprintable() and len(url.strip()) <= 60 else ""
        raise InvalidValueError(f"{name} {shown(url)} is not a storage URL; use {_STORAGE_FORMS} "
                                f"(a file: sqlite:///{example or 'tune.db'})")
    if _has_sqlalchemy():
        database = _sqlalchemy_database(url, name)
    else:  # pragma: no cover - optuna needs SQLAlchemy, so only a broken install lands here
        if match["dialect"].lower() not in KNOWN_DIALECTS:
            raise InvalidValueError(f"{name} {url!r}: unknown database {match['dialect']!r}; use {_STORAGE_FORMS}")
        rest = match["rest"].split("?", 1)[0]
        database = rest[1:] if rest.startswith("/") else None
    if match["dialect"].lower() == "sqlite":
        _check_sqlite_file(url, database, name)
    return url


def _has_sqlalchemy() -> bool:
    try:
        import sqlalchemy  # noqa: F401  (optuna's own dependency: present wherever optuna is)
    except ImportError:  # pragma: no cover
        return False
    return True


def _sqlalchemy_database(url: str, name: str) -> str | None:
    """The database part of `url`, after SQLAlchemy has parsed it and found its dialect and driver, as
    optuna's RDBStorage will (third-party dialects registered with SQLAlchemy are accepted too)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise InvalidValueError(f"{name} {url!r} is not a valid database URL ({exc})") from None
    try:
        parsed.get_dialect()  # imports the dialect's module only; the driver itself is imported on connect
    except NoSuchModuleError:
        what = f"driver {parsed.drivername!r}" if "+" in parsed.drivername else f"database {parsed.drivername!r}"
        raise InvalidValueError(f"{name} {url!r}: unknown {what}; optuna storages are SQLAlchemy URLs: "
                                f"{_STORAGE_FORMS} (also {', '.join(KNOWN_DIALECTS[3:])})") from None
    return parsed.database


def _check_sqlite_file(url: str, database: str | None, name: str) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return  # in memory, or an SQLite URI whose options this check does not interpret
    try:
        _check_sqlite_path(url, Path(database), name)
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte: the file system's own refusal
        raise InvalidValueError(f"{name} {shown(url)}: the database file cannot be used: "
                                f"{getattr(exc, 'strerror', None) or exc}") from None


def _check_sqlite_path(url: str, path: Path, name: str) -> None:
    folder = path.parent
    if not folder.exists():
        raise InvalidValueError(f"{name} {url!r}: folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise InvalidValueError(f"{name} {url!r}: {str(folder)!r} is not a folder")
    if path.is_dir():
        raise InvalidValueError(f"{name} {url!r}: {str(path)!r} is a folder, not a database file")
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            raise InvalidValueError(f"{name} {url!r}: database file {str(path)!r} is not writable")
    # SQLite creates the file, and its journal next to it, so the folder must take new files too.
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidValueError(f"{name} {url!r}: folder {str(folder)!r} is not writable")


def precision(value: Any, *, name: str = "precision") -> str:
    """`value` as a matmul precision setting ("highest", "high", "medium" or "emulated"); None is the
    process-wide setting (`autotile.dispatch.precision`), which is checked too. Tuning under "emulated"
    searches what "high" allows: the emulation is a library path, not a config of the spaces."""
    from autotile.dispatch import precision as precision_mod

    return precision_mod.resolve(value, name=name)


def fix_items(items: Iterable[str], *, name: str = "--fix") -> dict[str, list[str]]:
    """'PARAM=V1,V2' strings -> {PARAM: [V1, V2]}; the values are checked against a space later."""
    fix: dict[str, list[str]] = {}
    for item in items:
        param, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",")]
        if not sep or not param.strip() or not all(parts):
            raise InvalidValueError(f"{name} {item!r} must look like PARAM=VALUE or PARAM=V1,V2")
        fix[param.strip()] = parts
    return fix


def fix_mapping(fix: Any, *, name: str = "fix") -> dict[str, Any] | None:
    """`tune(fix=...)`: None, or a mapping of parameter names to a value or a list of values."""
    if fix is None:
        return None
    if not isinstance(fix, Mapping):
        raise InvalidValueError(f"{name} must map parameter names to values (for example {{'MATH': 'tf32x3'}} or "
                                f"{{'BM': [64, 128]}}), not {shown(fix)}")
    for param in fix:
        if not isinstance(param, str) or not param:
            raise InvalidValueError(f"{name}: parameter names are non-empty strings, not {shown(param)}")
    return dict(fix)


def writable_folder(folder: str | Path, *, name: str) -> Path:
    """`folder` if it is a writable folder or can be created (its nearest existing parent is writable).
    Creates nothing."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise InvalidValueError(f"{name} {str(folder)!r} is a file, not a folder")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidValueError(f"{name} {str(folder)!r}: {str(existing)!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidValueError(f"{name} {str(folder)!r}: folder {str(existing)!r} is not writable")
    return path


__all__ = ["SEED_MAX", "count", "fix_items", "precision", "seconds", "seed", "storage_url", "writable_folder"]
