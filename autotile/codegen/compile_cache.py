"""Compiled kernels kept on disk, so that a kernel compiles once per machine rather than once per process.

NVRTC takes a fraction of a second to a few seconds per kernel (a wgmma kernel: about a second). Without
this, every new process pays it again for kernels an earlier one built: the library's first call of each
selected kernel, every candidate of a tune that an earlier tune of another shape already compiled (the
kernels take their sizes at run time, so one binary serves every shape), and each tuning worker.
`build.compile` looks here after its in-memory memo and before NVRTC, and stores what NVRTC builds.

Layout: ``<root>/<compiler>/<key[:2]>/<key>.bin``, `key` being `build.source_hash` of the source and the full
option list (target architecture included), `compiler` NVRTC's version (a new compiler starts afresh). A
file is one JSON header line (what `build` needs besides the binary, and the binary's length and SHA-256),
then the binary. Writes are atomic (`safe_files.write_atomic`): a reader sees a whole file or none. A file
that does not read back whole and true (torn, foreign, over `MAX_ENTRY_BYTES`, a checksum that differs) is
ignored, removed, and the kernel compiled again: the cache can cost a compile, never a wrong kernel.

The root is ``$AUTOTILE_COMPILE_CACHE_DIR``, else `compiled/` in the user cache root
(`resources.user_cache_root`); ``AUTOTILE_COMPILE_CACHE_DIR=off`` turns the cache off. It holds at most
`MAX_BYTES`: past that, the files least recently used (a hit refreshes its file's time) go first.
Deleting the folder at any time is safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from autotile.codegen import resources
from autotile.errors import InvalidValueError
from autotile.safe_files import read_bytes, write_atomic

ENV_VAR = "AUTOTILE_COMPILE_CACHE_DIR"
OFF = "off"  # the value of ENV_VAR that turns the cache off
COMPILED_DIR = "compiled"  # the folder in the user cache root (the tuning cache skips it)
FORMAT = 1  # the header's "format": a file of another format is not read
MAX_ENTRY_BYTES = 64 << 20  # a cubin is tens to hundreds of kilobytes; a file past this is not one
MAX_BYTES = 512 << 20  # the whole cache; pruned to PRUNE_TO of it when a store finds it over
PRUNE_TO = 0.75
PRUNE_EVERY = 64  # stores between two measurements of the cache's size (the first store measures too)
SUFFIX = ".bin"

_lock = threading.Lock()
_stores = 0  # stores by this process, for PRUNE_EVERY


def root() -> Path | None:
    """The cache folder, or None where ``$AUTOTILE_COMPILE_CACHE_DIR`` is "off"."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env.lower() == OFF:
        return None
    if env:
        return Path(os.path.expanduser(env))
    return resources.user_cache_root() / COMPILED_DIR


def _safe_part(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._+" else "_" for c in text) or "unknown"


def path_of(key: str, compiler: str, folder: Path) -> Path:
    """Where the compile of `key` (a SHA-256 hex digest) by `compiler` is kept under `folder`."""
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise InvalidValueError(f"compile cache key {key[:80]!r} is not a SHA-256 hex digest")
    return folder / _safe_part(compiler) / key[:2] / (key + SUFFIX)


def load(key: str, compiler: str) -> tuple[dict[str, Any], bytes] | None:
    """The header and binary stored for `key` by `compiler`, or None (absent, off, or not whole: then
    removed, so that the next store replaces it)."""
    folder = root()
    if folder is None:
        return None
    path = path_of(key, compiler, folder)
    try:
        data = read_bytes(path, "compiled kernel", MAX_ENTRY_BYTES)
    except Exception:  # absent (the usual miss), unreadable or not a regular file: a miss all the same
        if path.exists() or path.is_symlink():
            _discard(path)
        return None
    header, binary = _parse(data, key, compiler)
    if header is None:
        _discard(path)
        return None
    try:
        os.utime(path)  # least recently used goes first when the cache is pruned
    except OSError:
        pass
    return header, binary


def _parse(data: bytes, key: str, compiler: str) -> tuple[dict[str, Any] | None, bytes]:
    """(header, binary) of a file's bytes, or (None, b"") where they are not a whole entry for `key`."""
    end = data.find(b"\n")
    if end < 0:
        return None, b""
    try:
        header = json.loads(data[:end].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, b""
    binary = data[end + 1:]
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("key") != key \
            or header.get("compiler") != compiler or header.get("length") != len(binary) \
            or header.get("sha256") != hashlib.sha256(binary).hexdigest():
        return None, b""
    return header, binary


def store(key: str, compiler: str, header: dict[str, Any], binary: bytes) -> bool:
    """Keep `binary` and its `header` (JSON-serialisable) for `key`; False where the cache is off or the
    write failed (a full disk, a read-only folder: the compile stands, only the next process compiles again)."""
    global _stores
    folder = root()
    if folder is None:
        return False
    path = path_of(key, compiler, folder)
    line = json.dumps(dict(header, format=FORMAT, key=key, compiler=compiler, length=len(binary),
                           sha256=hashlib.sha256(binary).hexdigest()), sort_keys=True).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, line + b"\n" + binary)
    except OSError:
        return False
    with _lock:
        _stores += 1
        measure = _stores % PRUNE_EVERY == 1
    if measure:
        prune(folder)
    return True


def entries(folder: Path | None = None) -> list[tuple[Path, int, float]]:
    """Every entry file under `folder` (default: `root()`), as (path, bytes, last use as a Unix time)."""
    return _walk(folder)[0]


def _walk(folder: Path | None) -> tuple[list[tuple[Path, int, float]], list[tuple[Path, float]]]:
    """The entry files under `folder` (default: `root()`) as `entries` gives them, and the writers'
    temporary files, as (path, modification time), in one walk."""
    folder = folder if folder is not None else root()
    found: list[tuple[Path, int, float]] = []
    temporary: list[tuple[Path, float]] = []
    if folder is None or not folder.is_dir():
        return found, temporary
    for where, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(where) / name
            try:
                st = path.stat()
            except OSError:
                continue
            if name.endswith(SUFFIX):
                found.append((path, st.st_size, st.st_mtime))
            elif name.startswith(".") and name.endswith(".tmp"):
                temporary.append((path, st.st_mtime))
    return found, temporary


def prune(folder: Path | None = None, max_bytes: int = MAX_BYTES) -> int:
    """Bring the cache under `max_bytes`, down to PRUNE_TO of it, least recently used first, if it is over;
    also removes temporary files that a writer left over an hour ago. Returns how many entries went."""
    found, temporary = _walk(folder)
    now = time.time()
    for path, modified in temporary:
        if now - modified > 3600:
            _discard(path)
    total = sum(size for _, size, _ in found)
    if total <= max_bytes:
        return 0
    removed = 0
    for path, size, _ in sorted(found, key=lambda e: e[2]):
        if total <= max_bytes * PRUNE_TO:
            break
        _discard(path)
        total -= size
        removed += 1
    return removed


def clear(folder: Path | None = None) -> int:
    """Remove every entry; returns how many."""
    found = entries(folder)
    for path, _, _ in found:
        _discard(path)
    return len(found)


def _discard(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["COMPILED_DIR", "ENV_VAR", "MAX_BYTES", "OFF", "clear", "entries", "load", "path_of", "prune", "root",
           "store"]
