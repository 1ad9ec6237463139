"""Fuzzing the doors a user can push on (issue 29): space files, batch files, command lines, storage URLs and
the contents of the cache's and shape database's folders, random and adversarial. For every example: it
finishes within a time bound, ends in a result or an `AutotileError` (the command: exit 0 or 2, one line, no
traceback), and valid cache records around it stay intact. No GPU; example budgets keep the file to seconds.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotile.cli import main as cli
from autotile.codegen.space import Space
from autotile.dispatch import database
from autotile.dispatch.cache import TuningCache
from autotile.errors import AutotileError
from autotile.tuning import validate
from autotile.tuning.batch import read_problems

# Examples per test: 60 in the suite (seconds); AUTOTILE_FUZZ_EXAMPLES=2000 for a deeper search by hand.
EXAMPLES = int(os.environ.get("AUTOTILE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOUND_S = 20.0  # seconds any one example may take


def _within(fn: Callable[[], Any], seconds: float = BOUND_S) -> Any:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not finish within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _typed_or_none(fn: Callable[[], Any]) -> AutotileError | None:
    """Run `fn`; an AutotileError in one line is a fine answer, anything else fails the test."""
    try:
        _within(fn)
    except AutotileError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) <= 1000, text[:2000]
        return exc
    return None


# YAML-ish text: random scalars, lists and mappings, with anchors, aliases, deep nests and junk spliced in.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=30))
trees = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                     max_leaves=30)
ADVERSARIAL = [
    "a: &a [x, x, x, x, x, x, x, x]\n" + "".join(f"b{i}: &b{i} [{', '.join(['*a' if i == 0 else f'*b{i - 1}'] * 8)}]\n"
                                                for i in range(8)),
    "[" * 3000 + "]" * 3000,
    "&a [*a]",
    "kernel: matmul\nparams: {smem: [none], A: [" + ", ".join(map(str, range(5000))) + "]}\n",
    "constraints: [{name: c, expr: '" + "(" * 400 + "1" + ")" * 400 + "'}]\n",
    "\x00\x01\x02",
    "params: !!python/object/apply:os.system ['echo no']\n",
]


def _yaml_texts() -> st.SearchStrategy[str]:
    dumped = trees.map(lambda t: yaml.safe_dump(t, allow_unicode=True))
    return st.one_of(dumped, st.text(max_size=300), st.sampled_from(ADVERSARIAL),
                     st.builds(lambda t, cut: t[:cut], dumped, st.integers(0, 200)))


def _space_like() -> st.SearchStrategy[str]:
    """Mostly-valid space files with one part replaced by something random."""
    from test_space import _tiny

    def spoil(part: str, value: Any) -> str:
        data = _tiny()
        data[part] = value
        return yaml.safe_dump(data)

    return st.builds(spoil, st.sampled_from(["params", "derived", "constraints", "kernel", "layouts"]), trees)


@FUZZ
@given(text=st.one_of(_yaml_texts(), _space_like()))
def test_space_files(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "space.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        _typed_or_none(lambda: Space.load(path))


@FUZZ
@given(text=_yaml_texts(), suffix=st.sampled_from([".yaml", ".csv"]))
def test_batch_files(text, suffix):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"problems{suffix}"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        _typed_or_none(lambda: read_problems(path))


@FUZZ
@given(rows=st.lists(st.dictionaries(st.sampled_from(["kernel", "shape", "dtype", "layout", "trials", "x"]),
                                     trees, max_size=6), max_size=4))
def test_batch_rows(rows):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "problems.yaml"
        path.write_text(yaml.safe_dump(rows))
        _typed_or_none(lambda: read_problems(path))


# Command lines: the commands that need no GPU and finish at once, with their flags and random values.
WORDS = ["render", "space", "devices", "cache", "list", "show", "clear", "tune", "batch", "search-bench",
         "matmul", "matvec", "bmm", "--shape", "--dtype", "--layout", "--device", "--trials", "--seed", "--set",
         "--config", "--fix", "--devices", "--storage", "--budgets", "--jobs", "--sweeps", "--precision",
         "--timeout", "--sampler", "--profiles", "h100", "p100", "all", "-1", "0", "1e9", "nan", "inf", "²",
         "4096x4096x4096", "0x1x2", "BM=64", "MATH=wgmma", "sqlite:///:memory:", "postgresql://u:p@127.0.0.1:1/d",
         "journal:/dev/null", "/nonexistent", "seed-tiled16", "", " ", "\x00", "--", "-h"]


def _argv() -> st.SearchStrategy[list[str]]:
    return st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), min_size=1, max_size=7)


LONG_RUNNING = ("search-bench", "survey", "sweep", "batch", "tune")  # replay every sweep, or need a GPU


def _safe(argv: list[str]) -> bool:
    """Keep to what finishes at once: the commands that run long (a valid search-bench replays every sweep;
    tune, batch, sweep and survey start GPU work) only on a machine without a GPU, where each stops at its
    checks, and with a value no run can start from."""
    if argv[0] not in LONG_RUNNING:
        return True
    from conftest import gpu_skip_reason

    return gpu_skip_reason() is not None and any(v in argv for v in ("-1", "nan", "inf", "²", "0x1x2"))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv=_argv())
def test_command_lines(argv, monkeypatch_env):
    if not _safe(argv):
        return
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                return cli.main(argv)
            except SystemExit as exc:  # argparse's own errors and --version
                return int(exc.code or 0)

    rc = _within(run)
    assert rc in (0, 1, 2), (argv, rc, err.getvalue()[-500:])
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue()[-2000:])


@pytest.fixture
def monkeypatch_env(tmp_path_factory):
    """A private cache root for the command-line examples (one per test, shared by its examples)."""
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("AUTOTILE_CACHE_DIR")
    os.environ["AUTOTILE_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("AUTOTILE_CACHE_DIR", None)
    else:
        os.environ["AUTOTILE_CACHE_DIR"] = old


@FUZZ
@given(url=st.one_of(st.text(max_size=60), st.sampled_from(
    ["sqlite://", "sqlite:///", "sqlite:////", "sqlite:///:memory:", "journal:", "journal:/", "postgresql://",
     "postgresql://u:p@", "mysql://x", "redis://localhost", "sqlite:///dir/", "journal:/dev/zero", "file:x",
     "sqlite:///%00", "sqlite:///" + "a" * 5000])))
def test_storage_urls(url):
    _typed_or_none(lambda: validate.storage_url(url))


# Folder contents: junk next to a good record; the good record stays readable and unchanged.

def _fingerprint() -> str:
    from autotile.codegen.limits import PROFILES

    return PROFILES["h100"].fingerprint


FINGERPRINT = _fingerprint()


def _good_record(root: Path) -> Path:
    from autotile.codegen.limits import PROFILES
    from autotile.dispatch.record import Record

    record = Record(kernel="matmul", dtype="float32", layout="nn", shape=(64, 64, 64), compat="c" * 64,
                    config={"BM": 64}, time_ms=1.0, spread=0.0, metric=1.0, metric_unit="GFLOP/s",
                    baseline_ms=1.5, device=PROFILES["h100"].fingerprint, environment={})
    return Path(TuningCache(root).put(record).path)


junk = st.one_of(
    st.binary(max_size=400),
    trees.map(lambda t: json.dumps(t, default=str).encode()),
    st.just(b"[" * 50_000 + b"]" * 50_000),
    st.just(json.dumps({"schema": 1, "kernel": "matmul"}).encode()),
    st.sampled_from(["dir", "fifo", "link-out", "sparse"]),
)


@FUZZ
@given(items=st.lists(st.tuples(st.sampled_from(["matmul-float32-nn-8x8x8-cccccccccccc.json",
                                                 "matvec-float32-row-8x8-cccccccccccc.json", "x.json",
                                                 "database/matmul-float32-nn.json",
                                                 "database/matvec-float32-col.json"]), junk),
                      min_size=1, max_size=4))
def test_cache_and_database_folders(items):
    import warnings

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        good = _good_record(root)
        before = good.read_bytes()
        device_dir = good.parent
        for name, content in items:
            path = device_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                continue
            if content == "dir":
                path.mkdir()
            elif content == "fifo":
                if hasattr(os, "mkfifo"):
                    os.mkfifo(path)
            elif content == "link-out":
                path.symlink_to("/etc/hostname")
            elif content == "sparse":
                with open(path, "wb") as f:
                    f.truncate(64 << 20)
            else:
                path.write_bytes(content)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cache = TuningCache(root)
            entries = _within(lambda: cache.entries())
            for kernel, layout in (("matmul", "nn"), ("matvec", "row"), ("matvec", "col")):
                _within(lambda k=kernel, lay=layout: database.load(cache, FINGERPRINT, k, "float32", lay))
        assert [p for p, _ in entries] == [good]
        assert good.read_bytes() == before
