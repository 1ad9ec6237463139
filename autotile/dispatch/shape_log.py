"""Recording the problems a program meets without a tuned record, to tune them offline.

With ``AUTOTILE_RECORD_SHAPES=PATH`` in the environment, or `autotile.record_shapes(PATH)` (which wins over the
environment; None goes back to it), the first call of each problem that has no tuned record on this GPU (the
selection chain's exact step found none) appends the problem to PATH as one line of a YAML list, in the
problem list format that ``autotile batch`` reads::

    - {kernel: bmm, shape: 5x224x701x36, dtype: float32, layout: nn}

``autotile batch PATH`` then tunes every problem listed, and later runs find their records (the exact step):
the tuned kernels without tuning in the program's own process (`autotile.dispatch.first_call` tunes there).
The problem is the one the library runs: a one-row matmul is listed as the matvec it runs, a misaligned
batch that takes the padded plan as its padded shape.

Several processes may record into one file (a distributed job): appends are serialised by a lock file beside it
(PATH + ".lock") and a problem already listed is not listed again. Recording never fails a call: a file that
cannot be written gives one `ShapeLogWarning` per path, and the call goes on.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotile.codegen.problem import ProblemKey

ENV_VAR = "AUTOTILE_RECORD_SHAPES"
HEADER = ("# Problems autotile met without a tuned record (AUTOTILE_RECORD_SHAPES). Tune them with:\n"
          "#   autotile batch {path}\n")
LOCK_TIMEOUT_S = 10.0
_UNSET = object()
_path: object = _UNSET  # _UNSET: as the environment says; None: off
_noted: set[tuple[str, str]] = set()  # (path, line) written or found in this process
_warned: set[str] = set()
_lock = threading.Lock()


class ShapeLogWarning(UserWarning):
    """A problem could not be recorded; the call went on."""


def record_shapes(path: str | os.PathLike[str] | None = None) -> None:
    """Record the problems met without a tuned record into the YAML file `path` from now on (created where
    missing); None: back to ``AUTOTILE_RECORD_SHAPES`` (unset or empty: off)."""
    global _path
    _path = _UNSET if path is None else os.fspath(path)


def target() -> str | None:
    """The file problems are recorded into, or None where recording is off."""
    path = os.environ.get(ENV_VAR, "") if _path is _UNSET else _path
    assert path is None or isinstance(path, str)
    return path or None


def line(key: ProblemKey) -> str:
    """`key` as one line of a YAML problem list, as ``autotile batch`` reads it."""
    return (f"- {{kernel: {key.kernel}, shape: {'x'.join(map(str, key.shape))}, dtype: {key.dtype}, "
            f"layout: {key.layout}}}\n")


def note(key: ProblemKey) -> None:
    """Append `key` to the recording file unless it lists it already (nothing where recording is off)."""
    path = target()
    if path is None:
        return
    entry = line(key)
    if (path, entry) in _noted:
        return
    try:
        _append(Path(path), entry)
    except Exception as exc:  # never the caller's problem
        with _lock:
            first = path not in _warned
            _warned.add(path)
        if first:
            warnings.warn(ShapeLogWarning(f"cannot record problems into {path} ({type(exc).__name__}: {exc}); "
                                          f"the calls go on without recording"), stacklevel=4)
        return
    with _lock:
        _noted.add((path, entry))


def _append(path: Path, entry: str) -> None:
    import filelock  # only where recording is on: `import autotile` stays light

    with filelock.FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
        try:
            listed = path.read_text()
        except FileNotFoundError:
            listed = ""
        if entry in listed.splitlines(keepends=True):  # another process, or an earlier run, listed it
            return
        with open(path, "a") as f:
            if not listed:
                f.write(HEADER.format(path=path))
            elif not listed.endswith("\n"):
                f.write("\n")
            f.write(entry)
            f.flush()
            os.fsync(f.fileno())


__all__ = ["ENV_VAR", "ShapeLogWarning", "line", "note", "record_shapes", "target"]
