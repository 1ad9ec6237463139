"""Reading the files a user gives autotile (search spaces, batch lists, databases, sweeps), with limits.

A file is opened only where it is a regular file (a FIFO would block forever, a device such as /dev/zero
would never end), read up to a size limit, decoded as UTF-8, then parsed: YAML within bounds (an anchor
expanded in a nest of aliases grows without bound: a 500-byte file can stand for gigabytes, so a document
may stand for at most MAX_NODES values) and JSON within a nesting depth. Every failure is one
`InvalidValueError` line that names the file and the limit it broke; callers that own a more specific error
(a space's `SpaceDefinitionError`) pass its class.

And writing autotile's own cache files whole or not at all (`write_atomic`): a reader, in this process or
another, sees the old file or the new one, never a part.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from autotile.errors import AutotileError, InvalidValueError, one_line

MAX_TEXT_BYTES = 16 << 20  # a search space, a batch list or a shape database is kilobytes to a few megabytes
MAX_DEPTH = 64  # nesting of lists and mappings: the project's own files use fewer than 10
MAX_NODES = 200_000  # values of a YAML document with its aliases expanded: a search space has a few thousand


def read_bytes(path: str | Path, what: str, limit: int = MAX_TEXT_BYTES,
               error: type[AutotileError] = InvalidValueError) -> bytes:
    """The bytes of the regular file `path` (at most `limit` of them); `error` in one line otherwise."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such {what} (the file does not exist)") from None
    except OSError as exc:
        raise error(f"{path}: the {what} cannot be opened: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise error(f"{path}: the {what} is {kind}; give a regular file")
        if info.st_size > limit:
            raise error(f"{path}: the {what} has {info.st_size} bytes, over the limit of {limit}")
        chunks, total = [], 0
        while True:  # read to the end, never past the limit (a file may grow while it is read)
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise error(f"{path}: the {what} is over the limit of {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"{path}: the {what} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def decode(raw: bytes, path: str | Path, what: str, error: type[AutotileError] = InvalidValueError) -> str:
    """`raw` as UTF-8 text, or `error` naming the first byte that is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}), not a {what}"
                    ) from None


def read_text(path: str | Path, what: str, limit: int = MAX_TEXT_BYTES,
              error: type[AutotileError] = InvalidValueError) -> str:
    """The UTF-8 text of the regular file `path`, within `limit` bytes."""
    return decode(read_bytes(path, what, limit, error), path, what, error)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes `root` stands for once every alias is expanded (more than `limit`: limit + 1, also
    for an alias that contains itself). Each node is visited once, so a nest of aliases that would expand
    to billions costs as much as it has nodes."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(child)] for child in children))
            continue
        if any(id(child) in open_nodes for child in children) or key in open_nodes:
            return limit + 1  # an alias inside its own anchor: endless
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


class _BoundedLoader(yaml.SafeLoader):
    """YAML's safe loader with limits: nesting at most MAX_DEPTH deep, and aliases (`*name`) accepted only
    while the document they expand to has at most MAX_NODES nodes (PyYAML writes anchors and aliases for
    a repeated object; a nest of aliases can stand for billions of nodes in a few hundred bytes)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        if expanded_size(node, MAX_NODES) > MAX_NODES:
            raise yaml.composer.ComposerError(None, None, f"its aliases expand to more than {MAX_NODES} values",
                                              node.start_mark)
        return self.construct_document(node)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser's complaint in one line: what is wrong and where (its own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem and mark is not None:
        return one_line(f"{problem} at line {mark.line + 1}, column {mark.column + 1}")
    return one_line(str(exc))


def load_yaml(text: str, where: str, error: type[AutotileError] = InvalidValueError) -> Any:
    """The data of YAML `text`: safe types only, at most MAX_DEPTH levels deep, at most MAX_NODES values with
    its aliases expanded."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply (more than {MAX_DEPTH} levels)") from None


# libyaml's parser (PyYAML's CSafeLoader, where PyYAML was built with it) reads YAML about 8x faster than the
# bounded pure-Python loader: search_spaces/matmul.yaml in 0.01 s against 0.08 s on an idle 2-core machine,
# 0.04 against 0.28 on a busy one (2026-11-28), which every process pays at its first call (each tuning
# worker, the first `autotile.matmul`). It composes in C, where the bounds above cannot be checked as it
# goes: it reads only the files that ship with autotile.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_own_yaml(text: str, where: str, error: type[AutotileError] = InvalidValueError) -> Any:
    """The data of a YAML file that ships with autotile (its search spaces): safe types only, through
    libyaml where PyYAML has it. A user's file goes through `load_yaml`, whose bounds hold for any text."""
    try:
        return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None


def _depth(value: Any, limit: int) -> int:
    """The nesting depth of parsed JSON data, stopping once past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_json(text: str, where: str, error: type[AutotileError] = InvalidValueError,
              max_depth: int = MAX_DEPTH) -> Any:
    """The data of JSON `text`, at most `max_depth` levels deep."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise error(f"{where}: nested too deeply (more than {max_depth} levels)") from None
    except ValueError as exc:
        raise error(f"{where}: not valid JSON: {one_line(str(exc))}") from None
    if _depth(data, max_depth) > max_depth:
        raise error(f"{where}: nested too deeply (more than {max_depth} levels)")
    return data


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` whole: a temporary file in the same folder (so that `os.replace` is a rename
    within one file system), readable by all (a cache folder may be shared read-only), flushed to disk, then
    renamed over `path`, and the rename made durable. Raises OSError; the temporary file is gone either way."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # mkstemp makes 0600
                os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable; best effort (Windows cannot open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["MAX_DEPTH", "MAX_NODES", "MAX_TEXT_BYTES", "decode", "expanded_size", "load_json", "load_own_yaml",
           "load_yaml", "fsync_dir", "read_bytes", "read_text", "write_atomic"]
