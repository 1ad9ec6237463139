"""The per-device tuning cache: the fastest config found for each kernel, dtype, layout and problem shape.

Layout on disk, one JSON file per entry so that a damaged file costs only itself::

    <root>/<device fingerprint>/<kernel>-<dtype>-<layout>-<shape>[-<slot>]-<compat>.json

`shape` is like ``4096x4096x4096`` (or ``default`` for a device's fallback entry in the shipped cache);
`slot` is the precision class the record needs (`autotile.dispatch.precision`) where that is not "highest": a
problem has one entry per class, so that an IEEE-only ("highest") tuning result is never thrown away for a
faster tf32x3 ("high") one, which the "highest" setting may not run. A "highest" record keeps the name
without a slot, the name every record had before slots existed; a file of that name holding an older
record that needs "high" (a tf32x3 config, written before slots) still counts as the "high" entry, and a
`put` to the "highest" slot first moves such a record to its own name. `compat` is the first 12
characters of a compatibility hash that the caller computes
(`kernels.compat_hash`: the kernel's name and the names of its parameters that have no default); an entry
whose full hash differs from the caller's is stale and never returned. That hash only says whether a
stored config can still be read: a template edit or another compiler leaves it as it is. For those, each
record keeps in its `environment` the ``source_sha`` (a hash of the rendered kernel source it timed) and
the ``compiler``; the library compares them through `lookup(accept=...)` and `put(is_current=...)`, as
the cache knows nothing of templates.

Two roots are read: the user's (`default_root()`, written by `TuningCache.put`) and the read-only cache
that ships with autotile (`resources.shipped_cache_dir()`), which has the same layout. Writes are atomic
(temporary file in the same folder, fsync, `os.replace`) and serialised between processes by one
`filelock.FileLock` per device folder (``<device>/.lock``), so readers never take a lock and never see half
a file.

Bad files (not a regular file, over `MAX_RECORD_BYTES`, a link out of the cache, not JSON, failing
validation, or holding an entry that their name does not describe) are reported with a `CacheWarning` and
in `TuningCache.problems`, then skipped: they never stop a lookup, and nothing but a regular file is opened.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import sys
import time
import types
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Literal

import filelock

from autotile.codegen import compile_cache, resources
from autotile.codegen.problem import LAYOUT_ALIASES, ProblemKey, layout_spellings
from autotile.dispatch import precision as precision_mod
from autotile.dispatch.record import Record, check_shape
from autotile.errors import CacheError
from autotile.safe_files import fsync_dir, write_atomic

COMPAT_CHARS = 12  # how much of the compatibility hash goes into a file name
DEFAULT_SHAPE = "default"  # the shape part of a device's fallback entry
LOCK_TIMEOUT_S = 60.0  # a put or clear waits this long for another process's write to the same device folder
ENV_VAR = resources.CACHE_DIR_ENV
MAX_RECORD_BYTES = 1 << 20  # a record is about 1.3 kB; a file past this is not one, and is not read into memory
LOCK_NAME = ".lock"  # the one lock file of a device folder (see TuningCache._lock)
STALE_TMP_S = 60.0  # clear() removes a writer's temporary file once it is this old (a write takes milliseconds)

# File-name parts may not contain "-" (it separates them) nor a path separator; the device folder may
# contain "-" (fingerprints do). Anything else outside these sets becomes "_".
_PART_UNSAFE = re.compile(r"[^A-Za-z0-9_.+]+")
_DIR_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
_ALNUM = re.compile(r"[A-Za-z0-9]")

SLOTS = precision_mod.CLASSES  # one entry per problem and class: "highest", "high"
UNNAMED_SLOT = "highest"  # the slot whose file name has no slot part (every name before slots existed)



class CacheWarning(UserWarning):
    """A cache file was skipped or moved aside: corrupt, invalid, or holding another entry than its name."""


def default_root() -> Path:
    """The user cache root: ``$AUTOTILE_CACHE_DIR`` if set, else the platform's user cache folder."""
    return resources.user_cache_root()


def _file_kind(mode: int) -> str | None:
    """None for a regular file, else what the file is, for a problem report."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def _unfit(st: os.stat_result) -> str | None:
    """Why a file with this status is not read as a record, or None if it may be."""
    kind = _file_kind(st.st_mode)
    if kind is not None:
        # Opening a FIFO blocks until a writer comes; a device may never end (/dev/zero).
        return f"is {kind}, not a regular file; not opened"
    if st.st_size > MAX_RECORD_BYTES:
        return f"is too large ({st.st_size} bytes; a record is at most {MAX_RECORD_BYTES} bytes); not read"
    return None


def _within(path: str, *folders: Path) -> bool:
    """Whether the resolved `path` lies in one of the resolved `folders`."""
    real = Path(path)
    return any(real.is_relative_to(os.path.realpath(folder)) for folder in folders)


def _read_entry(path: Path) -> tuple[bytes | None, str | None]:
    """The bytes of an entry file, (None, reason) for one that is not read, (None, None) for a missing one.

    Only regular files are opened, and at most `MAX_RECORD_BYTES` are read. An entry that is a link is
    followed only to a file inside the same root (a shipped fallback entry may name a tuned one); the root
    and the device folders themselves may be links (a cache kept on another disk)."""
    flags = (os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_NONBLOCK", 0))  # O_NONBLOCK: a FIFO swapped in after the stat still cannot block
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(path)
            if not _within(target, path.parent.parent, path.parent):
                return None, f"is a link out of the cache (to {target}); not followed"
            st = os.stat(path)
        else:
            flags |= getattr(os, "O_NOFOLLOW", 0)  # it was no link at the lstat: refuse one swapped in since
        reason = _unfit(st)
        if reason is not None:
            return None, reason
        fd = os.open(path, flags)
    except FileNotFoundError:  # removed by clear() or moved aside by a put since it was listed
        return (None, "is a broken link; not followed") if os.path.islink(path) else (None, None)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        # Checked again on what was opened, as the name may have changed since the stat; and the read is
        # capped whatever the size said, as a file may grow or report no size at all.
        reason = _unfit(os.fstat(fd))
        if reason is not None:
            return None, reason
        chunks: list[bytes] = []
        left = MAX_RECORD_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    finally:
        os.close(fd)
    if left <= 0:
        return None, f"is too large (over {MAX_RECORD_BYTES} bytes, the most a record may have); not read"
    return b"".join(chunks), None


@dataclasses.dataclass(frozen=True)
class PutOutcome:
    """What `TuningCache.put` did; true when the record was written.

    `existing` is the valid entry of the same key (and full compat hash) that was there before, if any:
    kept when `written` is False, replaced otherwise. `reason` says why it was kept (naming both times), or
    that a faster one was replaced because the caller said it is no longer current; None otherwise."""

    written: bool
    path: Path
    reason: str | None = None
    existing: Record | None = None

    def __bool__(self) -> bool:
        return self.written


# ------------------------------------------------------------------------------------------ file names

def _safe(value: Any, what: str, unsafe: re.Pattern[str] = _PART_UNSAFE) -> str:
    if not isinstance(value, str):
        raise CacheError(f"cache key part {what} must be a string, not {value!r}")
    # Dots at the ends are stripped so that no part can be "." or ".." and climb out of the root.
    safe = unsafe.sub("_", value.strip()).strip(".")
    if not _ALNUM.search(safe):
        raise CacheError(f"cache key part {what} {value!r} is empty once made filename-safe")
    return safe


def _shape_part(shape: Any) -> str:
    try:
        dims = check_shape(shape)
    except CacheError as exc:
        raise CacheError(f"cache key shape: {exc}") from None
    return "x".join(str(n) for n in dims)


def _device_dir(device: str) -> str:
    return _safe(device, "device", _DIR_UNSAFE)


def _file_name(kernel: str, dtype: str, layout: str, shape_part: str, compat: str,
               slot: str = UNNAMED_SLOT) -> str:
    # A shape part is digits and "x" (or "default"), so a slot part after it can never be read as one.
    slot_part = () if slot == UNNAMED_SLOT else (_check_slot(slot),)
    parts = (_safe(kernel, "kernel"), _safe(dtype, "dtype"), _safe(layout, "layout"), shape_part, *slot_part,
             _safe(compat, "compat")[:COMPAT_CHARS])
    return "-".join(parts) + ".json"


def _check_slot(slot: Any) -> str:
    if slot not in SLOTS:
        raise CacheError(f"cache slot {slot!r} is not one of {', '.join(SLOTS)}")
    return str(slot)


def _best(records: Iterable[Record], allowed_by: str | None) -> Record | None:
    """Of one problem's entries (one per slot), the fastest that the setting `allowed_by` allows."""
    allowed = [r for r in records if allowed_by is None or precision_mod.allows(allowed_by, r.precision)]
    return min(allowed, key=_order, default=None)


def _put_order(record: Record) -> tuple[float, int, float]:
    """Which of two entries of one slot `put` keeps (the smaller): what runs faster; where both run cuBLAS,
    the one whose config needs the stricter class (the slot's own class, so that nearest shapes can run it
    under that class's setting), then the faster config."""
    config_class = precision_mod.needed(record.kernel, record.dtype, record.config)
    return record.run_ms, SLOTS.index(config_class), record.time_ms


def _order(record: Record) -> tuple[float, int]:
    """How records of one problem in different slots rank: what runs faster first; on a tie the stricter
    class (an IEEE record is as fast, and runs under every setting)."""
    return record.run_ms, SLOTS.index(record.precision)


def _key_parts(key: ProblemKey) -> tuple[str, str, str]:
    return key.kernel, key.dtype, key.layout


# ------------------------------------------------------------------------------------------ the cache

class TuningCache:
    """The tuned configs of every device, in a user root (read-write) and a shipped root (read-only).

    `shipped_root="default"` uses the cache that ships with autotile, None uses none. Nothing is created
    on disk until the first `put`. Problems with files are reported once per file and reason, as a
    `CacheWarning` and a line in `problems`.
    """

    def __init__(self, root: str | Path | None = None,
                 shipped_root: str | Path | None | Literal["default"] = "default") -> None:
        self.root: Path = Path(root) if root is not None else default_root()
        self._root_from_env = root is None and bool(os.environ.get(ENV_VAR, "").strip())
        if isinstance(shipped_root, str) and shipped_root == "default":
            shipped = resources.shipped_cache_dir()
        else:
            shipped = Path(shipped_root) if shipped_root is not None else None
        # The same folder as both roots would list every entry twice.
        if shipped is not None and _same_path(shipped, self.root):
            shipped = None
        self.shipped_root: Path | None = shipped
        self.problems: list[str] = []
        self._reported: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        shipped = None if self.shipped_root is None else str(self.shipped_root)
        return f"TuningCache(root={str(self.root)!r}, shipped_root={shipped!r})"

    # ----------------------------------------------------------------------------------------- paths

    def path_for(self, device: str, kernel: str, dtype: str, layout: str, shape: Sequence[int],
                 compat: str, slot: str = UNNAMED_SLOT) -> Path:
        """Where the entry for this key and precision class (`slot`: "highest" or "high") lives in the user
        root, under the layout's current name. Raises `CacheError` on an empty part or an unknown slot."""
        layout = LAYOUT_ALIASES.get(kernel, {}).get(layout, layout)
        return self._path(self.root, device, kernel, dtype, layout, _shape_part(shape), compat, slot)

    @staticmethod
    def _path(root: Path, device: str, kernel: str, dtype: str, layout: str, shape_part: str,
              compat: str, slot: str = UNNAMED_SLOT) -> Path:
        return root / _device_dir(device) / _file_name(kernel, dtype, layout, shape_part, compat, slot)

    def _check_root(self) -> None:
        """Raise `CacheError` if the user root exists and is not a folder: listed, it would look empty."""
        if self.root.exists() and not self.root.is_dir():
            what = f"{ENV_VAR}={self.root}" if self._root_from_env else f"cache root {self.root}"
            raise CacheError(f"{what} names a file, not a folder; point it at a folder (or a path not yet made)")

    def _lock(self, folder: Path) -> filelock.BaseFileLock:
        """The lock that serialises every change to one device folder.

        One lock per device folder, not one per entry: a per-entry lock file would stay for ever after its
        entry is cleared, since deleting a lock file is only safe while holding it and only for lock
        implementations that re-check, after locking, that the file they locked still has its name (filelock
        does so only in recent versions; this package allows older ones). A device folder's lock file is
        never deleted, so it needs no such care, and holding it also tells clear() that no writer of this
        version is between creating its temporary file and renaming it. Writes are rare and take
        milliseconds, so serialising the entries of one device costs nothing."""
        return filelock.FileLock(str(folder / LOCK_NAME), timeout=LOCK_TIMEOUT_S)

    def _roots(self, include_shipped: bool = True) -> list[Path]:
        roots = [self.root]
        if include_shipped and self.shipped_root is not None:
            roots.append(self.shipped_root)
        return roots

    # --------------------------------------------------------------------------------------- reading

    def _report(self, path: Path, reason: str) -> None:
        key = (str(path), reason)
        if key in self._reported:  # a hot lookup must not repeat the same warning on every call
            return
        self._reported.add(key)
        message = f"{path}: {reason}"
        self.problems.append(message)
        # Point the warning at the first caller outside this module.
        level = 1
        frame: types.FrameType | None = sys._getframe(0)
        while frame is not None and frame.f_globals.get("__name__") == __name__:
            frame, level = frame.f_back, level + 1
        warnings.warn(CacheWarning(message), stacklevel=level)

    @staticmethod
    def _parse(path: Path) -> tuple[Record | None, str | None]:
        """(record, None) for a good file, (None, reason) for a bad one, (None, None) for a missing one."""
        data, reason = _read_entry(path)
        if data is None:
            return None, reason
        try:
            record = Record.from_json(json.loads(data.decode("utf-8")))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return None, f"is not valid JSON ({type(exc).__name__}: {exc})"
        except CacheError as exc:
            return None, f"is not a valid record ({exc})"
        # A file must hold the entry its name describes; anything else (copied or renamed by hand,
        # another tool's file) would otherwise be served for the wrong problem.
        names = {_file_name(record.kernel, record.dtype, layout, part, record.compat, slot)
                 for part in ("x".join(map(str, record.shape)), DEFAULT_SHAPE)
                 for slot in {record.precision, UNNAMED_SLOT}  # the unnamed slot: a name from before slots
                 for layout in layout_spellings(record.kernel, record.layout)}  # and older layout names
        if path.name not in names or path.parent.name != _device_dir(record.device):
            return None, (f"holds the entry for {record.kernel} {record.dtype} {record.layout} "
                          f"{'x'.join(map(str, record.shape))} on {record.device}, not what its name says")
        return record, None

    def _load(self, path: Path) -> Record | None:
        record, reason = self._parse(path)
        if reason is not None:
            self._report(path, reason)
        return record

    @staticmethod
    def _matches(record: Record, device: str, kernel: str, dtype: str, layout: str, compat: str) -> bool:
        # The full compat hash, not just the 12 characters in the name: anything else is stale.
        return (record.device == device and record.kernel == kernel and record.dtype == dtype
                and record.layout == layout and record.compat == compat)

    def _slots_in(self, root: Path, device: str, key: ProblemKey, shape_part: str, compat: str,
                  shape: tuple[int, ...] | None) -> dict[str, tuple[Path, Record]]:
        """The valid entries of one root for one problem (`shape` None: any shape, for the device default
        entry), by slot. A slot's own file wins over a record of that class under the unnamed name (a file
        written before slots existed), which is read once for both."""
        found: dict[str, tuple[Path, Record]] = {}
        # A file under the layout's current name wins over one under an older name (matmul's "row").
        for layout in reversed(layout_spellings(key.kernel, key.layout)):
            for slot in (UNNAMED_SLOT, *(s for s in SLOTS if s != UNNAMED_SLOT)):
                path = self._path(root, device, key.kernel, key.dtype, layout, shape_part, compat, slot)
                record = self._load(path)
                if (record is not None and (shape is None or record.shape == shape)
                        and self._matches(record, device, *_key_parts(key), compat)):
                    found[record.precision] = (path, record)  # the unnamed file may hold an older "high" record
        return found

    def slots(self, device: str, key: ProblemKey, compat: str) -> dict[str, Record]:
        """The entries for exactly this problem, one per precision class ("highest", "high") that has one:
        each from the user root, else the shipped root."""
        found: dict[str, Record] = {}
        for root in self._roots():
            for slot, (_, record) in self._slots_in(root, device, key, _shape_part(key.shape), compat,
                                                    key.shape).items():
                found.setdefault(slot, record)
        return found

    def get(self, device: str, key: ProblemKey, compat: str, allowed_by: str | None = None) -> Record | None:
        """The entry for exactly this problem: of the slots that the precision setting `allowed_by`
        allows (None: every slot), the one whose implementation runs fastest; None where there is none."""
        return _best(self.slots(device, key, compat).values(), allowed_by)

    def records(self, device: str, key: ProblemKey, compat: str) -> list[tuple[int, Path, Record]]:
        """Every valid entry of this device for the problem's kernel, dtype and layout, whatever its shape
        and slot (the device's default entries excepted), with the rank of its root: 0 the user's, 1 the
        shipped."""
        spellings = layout_spellings(key.kernel, key.layout)
        names_default = {_file_name(key.kernel, key.dtype, layout, DEFAULT_SHAPE, compat, slot)
                         for slot in SLOTS for layout in spellings}
        found = []
        for rank, root in enumerate(self._roots()):
            for layout in spellings:
                # Sanitised parts hold no "-" and no glob characters, so the shape (and slot) is the starred part.
                pattern = _file_name(key.kernel, key.dtype, layout, "*", compat)
                for path in sorted((root / _device_dir(device)).glob(pattern)):
                    if path.name in names_default:
                        continue
                    record = self._load(path)
                    if record is not None and self._matches(record, device, *_key_parts(key), compat):
                        found.append((rank, path, record))
        return found

    def default_slots(self, device: str, key: ProblemKey, compat: str) -> dict[str, Record]:
        """The shipped fallback entries of this device for the problem's kernel, dtype and layout, by slot."""
        if self.shipped_root is None:
            return {}
        found = self._slots_in(self.shipped_root, device, key, DEFAULT_SHAPE, compat, None)
        return {slot: record for slot, (_, record) in found.items()}

    def device_default(self, device: str, key: ProblemKey, compat: str,
                       allowed_by: str | None = None) -> Record | None:
        """The shipped fallback entry of this device for the problem's kernel, dtype and layout, if any: of
        the slots that the precision setting `allowed_by` allows (None: every slot), the fastest."""
        return _best(self.default_slots(device, key, compat).values(), allowed_by)

    def _device_folders(self, root: Path, device: str | None) -> Iterator[Path]:
        if device is not None:
            folder = root / _device_dir(device)
            if folder.is_dir():
                yield folder
            return
        if root.is_dir():
            try:
                # compiled/ holds the compile cache (autotile.codegen.compile_cache), not a device's records
                folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name != compile_cache.COMPILED_DIR)
            except OSError as exc:  # unreadable: said, not taken for an empty cache
                self._report(root, f"cannot be listed ({exc.strerror or exc})")
                return
            yield from folders

    def _files_in(self, folder: Path) -> list[Path]:
        """The *.json files of a device folder; an unreadable folder is reported and yields none."""
        try:
            return sorted(folder / name for name in os.listdir(folder) if name.endswith(".json"))
        except OSError as exc:
            self._report(folder, f"cannot be listed ({exc.strerror or exc}): its entries are not read")
            return []

    def entries(self, device: str | None = None, include_shipped: bool = False) -> list[tuple[Path, Record]]:
        """Every valid entry (of one device, or all) in the user root, then the shipped root if asked.

        Stale entries are listed too: without a compat hash to compare, staleness is unknown here."""
        self._check_root()
        found: list[tuple[Path, Record]] = []
        for root in self._roots(include_shipped):
            for folder in self._device_folders(root, device):
                for path in self._files_in(folder):
                    record = self._load(path)
                    if record is not None:
                        found.append((path, record))
        return found

    # --------------------------------------------------------------------------------------- writing

    def put(self, record: Record, is_current: Callable[[Record], bool] | None = None) -> PutOutcome:
        """Store `record` in its slot (the precision class it needs) unless a valid entry of the same key and
        slot is faster and still counts. Entries of the other slot are never compared with it, nor lost.

        `is_current(existing)` says whether a faster existing entry still counts (for example: its config
        still renders the kernel source it was timed on); the cache cannot tell, as it knows nothing of
        templates. It is asked only about a faster entry, with the device folder locked; an exception from it
        propagates and nothing is written. None counts every valid entry. A corrupt or foreign file in the
        way is renamed to ``<name>.corrupt`` and reported. A record of another class under the unnamed name
        (written before slots existed) counts as its own slot's entry: moved to its slot's name when a
        "highest" record takes the unnamed name, compared with (and then replaced by) a record of its class.
        Raises `CacheError` if the file cannot be written.
        """
        if not isinstance(record, Record):
            raise CacheError(f"put() takes a Record, not {type(record).__name__}")
        path = self.path_for(record.device, record.kernel, record.dtype, record.layout, record.shape,
                             record.compat, record.precision)
        unnamed = self.path_for(record.device, record.kernel, record.dtype, record.layout, record.shape,
                                record.compat)
        text = json.dumps(record.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        self._check_root()
        problems: list[tuple[Path, str]] = []
        note: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock(path.parent):
                existing = self._occupant(path, record, problems)
                old_name: Path | None = None  # where an entry of this slot from before slots lies
                if existing is not None and existing.precision != record.precision:
                    # Under the unnamed name, a record of another class written before slots: its own slot.
                    self._move_to_slot(path, existing, problems)
                    existing = None
                elif existing is None and path != unnamed:
                    older = self._occupant(unnamed, record, problems)
                    if older is not None and older.precision == record.precision:
                        existing, old_name = older, unnamed
                # What runs decides; where both run cuBLAS (the same time), a config this slot's class can run
                # on other shapes, then the faster config, is kept.
                if existing is not None and _put_order(existing) < _put_order(record):
                    if is_current is None or is_current(existing):
                        return PutOutcome(False, old_name or path,
                                          f"kept the existing entry of {existing.run_ms:g} ms, faster than "
                                          f"{record.run_ms:g} ms", existing)
                    note = (f"replaced a faster entry of {existing.run_ms:g} ms that is no longer current "
                            f"with one of {record.run_ms:g} ms")
                self._write_atomic(path, text)
                if old_name is not None:
                    _unlink(old_name)  # replaced by the entry under its slot's own name
        except filelock.Timeout:
            raise CacheError(f"{path}: another process held the lock of {path.parent} for over "
                             f"{LOCK_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise CacheError(f"{path}: cannot be written ({exc})") from exc
        # Reported after the write, so that warnings turned into errors cannot leave the entry missing.
        for where, problem in problems:
            self._report(where, problem)
        return PutOutcome(True, path, note, existing)

    def _occupant(self, path: Path, record: Record, problems: list[tuple[Path, str]]) -> Record | None:
        """The valid entry of `record`'s key at `path`, if any, with the device folder locked. A bad file
        is moved aside (and noted in `problems`); an entry of another full compat hash is stale: None."""
        existing, reason = self._parse(path)
        if reason is not None:
            aside = self._move_aside(path)
            problems.append((path, f"{reason}; moved to {aside.name} and replaced"))
        if existing is not None and not (
                existing.shape == record.shape
                and self._matches(existing, record.device, record.kernel, record.dtype, record.layout,
                                  record.compat)):
            return None  # another full compat hash behind the same name: stale, replaced
        return existing

    def _move_to_slot(self, path: Path, existing: Record, problems: list[tuple[Path, str]]) -> None:
        """Move `existing` (at the unnamed `path`, of another class) to its slot's name, with the device
        folder locked. Where that slot has a valid entry already, it is the one `get` served: `existing`
        is left to be overwritten."""
        target = self.path_for(existing.device, existing.kernel, existing.dtype, existing.layout, existing.shape,
                               existing.compat, existing.precision)
        if self._occupant(target, existing, problems) is None:
            os.replace(path, target)
            fsync_dir(path.parent)

    @staticmethod
    def _move_aside(path: Path) -> Path:
        # Never overwrite an earlier casualty: .corrupt, then .corrupt.1, .corrupt.2, ...
        aside = path.with_name(path.name + ".corrupt")
        n = 0
        while os.path.lexists(aside):  # lexists: a broken link moved aside earlier is a casualty too
            n += 1
            aside = path.with_name(f"{path.name}.corrupt.{n}")
        os.replace(path, aside)
        return aside

    @staticmethod
    def _write_atomic(path: Path, text: str) -> None:
        write_atomic(path, text.encode("utf-8"))

    def clear(self, device: str | None = None, kernel: str | None = None) -> int:
        """Delete the user-root entries of one device and/or kernel (all if None); returns how many.

        Also removes, for the same device and kernel, the temporary files of writers that were killed
        (older than `STALE_TMP_S`) and the per-entry lock files that autotile versions before the device
        lock left. The shipped root is never touched, nor are ``.corrupt`` files (kept for inspection) or
        the device folders' lock files."""
        self._check_root()
        prefix = f"{_safe(kernel, 'kernel')}-" if kernel is not None else ""
        removed = 0
        for folder in self._device_folders(self.root, device):
            try:
                with self._lock(folder):
                    removed += self._clear_folder(folder, prefix)
            except filelock.Timeout:
                raise CacheError(f"{folder}: another process held its lock for over {LOCK_TIMEOUT_S:g} s") from None
            except OSError as exc:
                raise CacheError(f"{folder}: cannot be cleared ({exc})") from exc
        return removed

    def _clear_folder(self, folder: Path, prefix: str) -> int:
        """clear() in one device folder, whose lock the caller holds."""
        removed = 0
        now = time.time()
        for path in sorted(folder.iterdir()):
            name = path.name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if name.startswith("." + prefix) and ".json." in name and name.endswith(".tmp"):
                # Writers of this version make temporary files only while holding this lock, so none is in
                # use now; the age test spares one that a writer of an older version (which took a lock per
                # entry) may be filling at this moment.
                if now - st.st_mtime > STALE_TMP_S:
                    _unlink(path)
            elif name.startswith(prefix) and name.endswith(".json.lock"):
                self._remove_old_entry_lock(path)
            elif name.startswith(prefix) and name.endswith(".json"):
                if stat.S_ISDIR(st.st_mode):
                    self._report(path, "is a folder, not an entry; left in place")
                    continue
                if _unlink(path):  # a link is removed, never what it points at
                    removed += 1
        return removed

    @staticmethod
    def _remove_old_entry_lock(path: Path) -> None:
        """Remove a per-entry lock file of an older autotile, unless one of its writers holds it now.

        It is deleted while held, so that a writer that opens it afterwards creates a new one; a writer
        of an older version that opened it just before could still lock the deleted file while another
        locks the new one, which needs two such writers on one entry at the moment of a clear."""
        try:
            with filelock.FileLock(str(path), timeout=0):
                try:
                    os.unlink(path)
                except OSError:  # Windows: an open file cannot be deleted (its lock deletes it on release)
                    pass
        except (filelock.Timeout, OSError):  # held, or not a file a lock can open: left as it is
            pass


def _unlink(path: Path) -> bool:
    """Delete `path`; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
