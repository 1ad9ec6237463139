"""The tuning cache: records, atomic and concurrent writes, bad files, lookup fallbacks, clearing. No GPU."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from autotile.codegen.problem import ProblemKey
from autotile.dispatch import cache as cache_mod
from autotile.dispatch import record as record_mod
from autotile.dispatch.cache import CacheWarning, TuningCache, default_root
from autotile.dispatch.record import Record
from autotile.errors import CacheError

DEV = "NVIDIA-H100-80GB-HBM3_sm_90"
OTHER_DEV = "NVIDIA-A100_sm_80"
COMPAT = "0123456789abcdef" * 4  # a sha256-long hash; only 12 characters reach the file name
STALE = "fedcba9876543210" * 4
REPO = Path(__file__).resolve().parents[1]


def make(shape: Sequence[Any] = (4096, 4096, 4096), time_ms: float = 1.0, **changes: Any) -> Record:
    fields: dict[str, Any] = dict(
        kernel="matmul", dtype="float32", layout="row", shape=shape, compat=COMPAT,
        config={"BM": 128, "BN": 128, "smem": "dynamic", "swizzle": True}, time_ms=time_ms,
        spread=0.02, metric=1000.0 / time_ms, metric_unit="GFLOP/s",
        baseline_ms=0.9, device=DEV,
        environment={"gpu": "NVIDIA H100 80GB HBM3", "driver": "550.54", "cuda": "12.4", "cupy": "13.1",
                     "date": "2024-05-01"})
    fields.update(changes)
    return Record(**fields)


def key(rec: Record) -> tuple[Any, ...]:
    """The entry's key as `path_for` takes it."""
    return (rec.device, rec.kernel, rec.dtype, rec.layout, rec.shape, rec.compat)


def pkey(rec: Record) -> tuple[str, ProblemKey, str]:
    """The entry's key as `get`, `records` and `device_default` take it."""
    return (rec.device, ProblemKey(rec.kernel, rec.dtype, rec.layout, rec.shape), rec.compat)


def problem(kernel: str, dtype: str, layout: str, shape: tuple[int, ...]) -> ProblemKey:
    return ProblemKey(kernel, dtype, layout, shape)


def stored_ms(cache: TuningCache, rec: Record | None = None) -> float:
    """The time of the entry stored for `rec`'s key (the default record's), which must be there."""
    found = cache.get(*pkey(rec or make()))
    assert found is not None, "no entry"
    return found.time_ms


@pytest.fixture
def cache(tmp_path: Path) -> TuningCache:
    return TuningCache(tmp_path / "user", shipped_root=None)


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    return tmp_path / "shipped"


def ship(root: Path, rec: Record, shape_part: str | None = None) -> Path:
    """Write `rec` into a shipped-style root by hand (the shipped root is never written by TuningCache)."""
    name_cache = TuningCache(root, shipped_root=None)
    path = name_cache.path_for(*key(rec))
    if shape_part is not None:
        path = path.with_name(path.name.replace("x".join(map(str, rec.shape)), shape_part))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec.to_json()))
    return path


# ------------------------------------------------------------------------------------------ records

def test_record_json_round_trip() -> None:
    rec = make()
    assert Record.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert rec.to_json()["shape"] == [4096, 4096, 4096] and rec.schema == 1


@pytest.mark.parametrize("bad", [
    [1, 2],
    "text",
    None,
])
def test_from_json_rejects_non_dict(bad: Any) -> None:
    with pytest.raises(CacheError):
        Record.from_json(bad)


@pytest.mark.parametrize("change", [
    {"schema": 2},
    {"schema": True},
    {"time_ms": "fast"},
    {"time_ms": -1.0},
    {"time_ms": float("nan")},
    {"shape": "4096x4096"},
    {"shape": [4096, 0]},
    {"shape": [4096.0, 4096]},
    {"shape": []},
    {"config": {"BM": 1.5}},
    {"config": [1, 2]},
    {"kernel": ""},
    {"device": 3},
    {"baseline_ms": "none"},
    {"environment": "h100"},
    {"extra": 1},
])
def test_from_json_rejects_wrong_fields(change: dict[str, Any]) -> None:
    d = make().to_json()
    d.update(change)
    with pytest.raises(CacheError):
        Record.from_json(d)


def test_from_json_rejects_missing_field() -> None:
    d = make().to_json()
    del d["metric_unit"]
    with pytest.raises(CacheError, match="metric_unit"):
        Record.from_json(d)


def test_record_normalises_numpy_like_integers() -> None:
    class Index:  # stands in for a NumPy integer: has __index__, is not an int
        def __init__(self, n: int) -> None:
            self.n = n

        def __index__(self) -> int:
            return self.n

    class Scalar:  # a NumPy float in the environment
        def item(self) -> float:
            return 0.5

    rec = make(shape=[Index(64), 32, 16], config={"BM": Index(64)}, baseline_ms=None,
               environment={"rounds": (1.0, 2.0), "x": Scalar(), "bad": float("nan"), "p": Path("/a")})
    assert rec.shape == (64, 32, 16) and rec.config == {"BM": 64}
    assert type(rec.config["BM"]) is int
    assert rec.environment == {"rounds": [1.0, 2.0], "x": 0.5, "bad": None, "p": "/a"}
    assert Record.from_json(json.loads(json.dumps(rec.to_json(), allow_nan=False))) == rec


# ------------------------------------------------------------------------------------------- paths

def test_path_layout(cache: TuningCache) -> None:
    path = cache.path_for(DEV, "matmul", "float32", "row", (4096, 4096, 4096), COMPAT)
    assert path == cache.root / DEV / f"matmul-float32-nn-4096x4096x4096-{COMPAT[:12]}.json"


def test_path_parts_are_sanitised(cache: TuningCache) -> None:
    path = cache.path_for("../../etc", "mat/mul", "float 32", "row-col", (8, 8), COMPAT)
    assert path.parent.parent == cache.root  # nothing climbs out of the root
    assert "/" not in path.name and path.name.count("-") == 4


@pytest.mark.parametrize("args", [
    ("", "matmul", "float32", "row", (8,), COMPAT),
    (DEV, "", "float32", "row", (8,), COMPAT),
    (DEV, "matmul", "///", "row", (8,), COMPAT),
    (DEV, "matmul", "float32", "..", (8,), COMPAT),
    (DEV, "matmul", "float32", "row", (8,), ""),
    (DEV, "matmul", "float32", "row", (), COMPAT),
    (DEV, "matmul", "float32", "row", (8, 0), COMPAT),
])
def test_path_rejects_empty_parts(cache: TuningCache, args: tuple[Any, ...]) -> None:
    with pytest.raises(CacheError):
        cache.path_for(*args)


def test_default_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path / "here"))
    assert default_root() == tmp_path / "here"
    assert TuningCache(shipped_root=None).root == tmp_path / "here"
    monkeypatch.delenv("AUTOTILE_CACHE_DIR")
    import platformdirs

    assert default_root() == Path(platformdirs.user_cache_dir("autotile"))


def test_shipped_root_default_is_the_package_one(tmp_path: Path) -> None:
    from autotile.codegen import resources

    assert TuningCache(tmp_path).shipped_root == resources.shipped_cache_dir()


def test_import_and_reads_create_no_directory(tmp_path: Path) -> None:
    env = dict(os.environ, AUTOTILE_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path / "home"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(REPO))
    code = ("import autotile.dispatch.cache as c; t = c.TuningCache(); "
            "from autotile.codegen.problem import ProblemKey; k = ProblemKey('matmul', 'float32', 'row', (8, 8, 8)); "
            f"t.get({DEV!r}, k, 'abc'); t.records({DEV!r}, k, 'abc'); t.device_default({DEV!r}, k, 'abc'); "
            "t.entries(); t.clear()")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------- put / get

def test_put_get_round_trip(cache: TuningCache) -> None:
    rec = make()
    assert not cache.root.exists()
    assert cache.put(rec).written is True
    assert cache.get(*pkey(rec)) == rec
    assert cache.get(DEV, problem("matmul", "float32", "row", (1024, 1024, 1024)), COMPAT) is None
    assert cache.problems == []


def test_put_keeps_the_faster_record(cache: TuningCache) -> None:
    assert cache.put(make(time_ms=1.0))
    kept = cache.put(make(time_ms=2.0))
    assert kept.written is False and not kept
    assert stored_ms(cache) == 1.0
    assert cache.put(make(time_ms=0.5)).written is True
    assert stored_ms(cache) == 0.5


def timed(time_ms: float, source_sha: str) -> Record:
    """A record of the default key, timed on the kernel source with this hash."""
    return make(time_ms=time_ms, environment={"source_sha": source_sha, "compiler": "nvrtc-12.4"})


def test_put_replaces_a_faster_record_that_is_no_longer_current(cache: TuningCache) -> None:
    # Tuned, then the template changed: the old winner renders another kernel and must not block the re-tune.
    cache.put(timed(0.5, "old"))
    seen: list[Record] = []

    def is_current(existing: Record) -> bool:
        seen.append(existing)
        return existing.environment["source_sha"] == "new"

    outcome = cache.put(timed(2.0, "new"), is_current=is_current)
    assert outcome.written and outcome.path == cache.path_for(*key(make()))
    assert seen == [timed(0.5, "old")] and outcome.existing == timed(0.5, "old")
    assert outcome.reason is not None and "0.5 ms" in outcome.reason and "no longer current" in outcome.reason
    assert cache.get(*pkey(make())) == timed(2.0, "new")
    # Now the stored entry is current, so a slower one is refused, with its time in the reason.
    kept = cache.put(timed(3.0, "new"), is_current=is_current)
    assert not kept.written and kept.existing == timed(2.0, "new")
    assert kept.reason is not None and "2 ms" in kept.reason and "3 ms" in kept.reason
    assert stored_ms(cache) == 2.0


def test_put_without_a_check_counts_every_valid_record(cache: TuningCache) -> None:
    cache.put(timed(0.5, "old"))
    outcome = cache.put(timed(2.0, "new"))
    assert outcome == cache_mod.PutOutcome(False, cache.path_for(*key(make())), outcome.reason, timed(0.5, "old"))
    assert stored_ms(cache) == 0.5


def test_put_asks_about_a_faster_record_only(cache: TuningCache) -> None:
    def never(existing: Record) -> bool:
        raise AssertionError("asked about a record that a faster new one replaces anyway")

    assert cache.put(timed(2.0, "old"), is_current=never).written  # nothing there
    outcome = cache.put(timed(1.0, "new"), is_current=never)  # there, but slower
    assert outcome.written and outcome.reason is None and outcome.existing == timed(2.0, "old")
    cache.put(make(compat=COMPAT[:12] + "0" * 52, time_ms=0.1))  # same file, other full hash: stale, not asked
    assert cache.put(timed(3.0, "new"), is_current=never).written


def test_put_outcome_is_frozen(cache: TuningCache) -> None:
    outcome = cache.put(make())
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.written = False  # type: ignore[misc]


def test_put_rejects_a_non_record(cache: TuningCache) -> None:
    with pytest.raises(CacheError):
        cache.put(make().to_json())  # type: ignore[arg-type]


def test_put_leaves_no_temporary_files(cache: TuningCache) -> None:
    for t in (3.0, 2.0, 1.0, 4.0):
        cache.put(make(time_ms=t))
    files = sorted(p.name for p in (cache.root / DEV).iterdir())
    assert files == [cache_mod.LOCK_NAME, cache.path_for(*key(make())).name]


def test_put_writes_a_complete_file_then_replaces(cache: TuningCache, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.put(make(time_ms=2.0))
    path = cache.path_for(*key(make()))
    real_replace = os.replace
    seen: list[tuple[str, str]] = []

    def checked_replace(src: Any, dst: Any) -> None:
        # At the moment of the rename the temporary file is complete, next to its target, and the old
        # entry is still whole: a reader sees one or the other.
        seen.append((str(src), str(dst)))
        assert Path(src).parent == Path(dst).parent
        assert Record.from_json(json.loads(Path(src).read_text())).time_ms == 1.0
        assert Record.from_json(json.loads(Path(dst).read_text())).time_ms == 2.0
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", checked_replace)
    assert cache.put(make(time_ms=1.0))
    assert len(seen) == 1 and seen[0][1] == str(path)


def test_failed_replace_keeps_the_old_file(cache: TuningCache, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.put(make(time_ms=2.0))
    path = cache.path_for(*key(make()))
    before = path.read_bytes()

    def boom(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(CacheError, match="No space left"):
        cache.put(make(time_ms=1.0))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert stored_ms(cache) == 2.0


# ----------------------------------------------------------------------------------- concurrency

def test_put_waits_for_the_device_lock(cache: TuningCache) -> None:
    import threading
    import time

    import filelock

    path = cache.path_for(*key(make()))
    path.parent.mkdir(parents=True)
    result: list[bool] = []
    with filelock.FileLock(str(path.parent / cache_mod.LOCK_NAME)):  # another writer holds this device
        writer = threading.Thread(target=lambda: result.append(cache.put(make()).written))
        writer.start()
        time.sleep(0.2)
        assert writer.is_alive() and not path.exists()
    writer.join(10)
    assert result == [True] and cache.get(*pkey(make())) == make()


CONTESTED = (2048, 2048, 2048)


def _writer(root: str, worker: int, barrier: Any) -> None:
    """One of the concurrent writers: 10 entries of its own and 10 puts to the contested key."""
    cache = TuningCache(root, shipped_root=None)
    barrier.wait()  # start together, so the writes really overlap
    for i in range(20):
        if i % 2 == 0:
            # Every time differs; the fastest is worker 7's first put, and slower puts follow it from
            # every worker, so a put that compared and wrote without the lock could bury it.
            cache.put(make(shape=CONTESTED, time_ms=5.0 + i / 10 - worker / 100))
        else:
            cache.put(make(shape=(64 * (worker + 1), 64 * (i + 1), 32), time_ms=1.0 + i))


def test_concurrent_writers(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(8)
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, barrier)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 8

    cache = TuningCache(tmp_path, shipped_root=None)
    files = list((tmp_path / DEV).glob("*.json"))
    assert len(files) == 8 * 10 + 1
    for f in files:
        Record.from_json(json.loads(f.read_text()))  # every file parses
    assert len(cache.entries()) == 8 * 10 + 1 and cache.problems == []
    assert not list((tmp_path / DEV).glob("*.tmp")) and not list((tmp_path / DEV).glob("*.corrupt"))
    best = cache.get(DEV, problem("matmul", "float32", "row", CONTESTED), COMPAT)
    assert best is not None and best.time_ms == pytest.approx(5.0 - 7 / 100)


# ------------------------------------------------------------------------------------- bad files

def _bad_files(cache: TuningCache) -> dict[str, Path]:
    """A good entry, then three bad ones next to it: garbage, wrong schema, another kernel's content."""
    cache.put(make(shape=(1024, 1024, 1024)))
    garbage = cache.path_for(DEV, "matmul", "float32", "row", (8, 8, 8), COMPAT)
    garbage.write_bytes(b"\x00\xff{not json")
    schema = cache.path_for(DEV, "matmul", "float32", "row", (16, 16, 16), COMPAT)
    d = make(shape=(16, 16, 16)).to_json()
    d["schema"] = 2
    schema.write_text(json.dumps(d))
    foreign = cache.path_for(DEV, "matmul", "float32", "row", (32, 32, 32), COMPAT)
    foreign.write_text(json.dumps(make(shape=(32, 32, 32), kernel="matvec").to_json()))
    return {"garbage": garbage, "schema": schema, "foreign": foreign}


def test_bad_files_are_reported_and_skipped(cache: TuningCache) -> None:
    bad = _bad_files(cache)
    with pytest.warns(CacheWarning) as caught:
        entries = cache.entries()
    assert [r.shape for _, r in entries] == [(1024, 1024, 1024)]
    assert len(cache.problems) == 3
    for what, reason in (("garbage", "not valid JSON"), ("schema", "schema 2"),
                         ("foreign", "matvec")):
        lines = [p for p in cache.problems if str(bad[what]) in p]
        assert len(lines) == 1 and reason in lines[0], (what, cache.problems)
    assert {str(w.message) for w in caught} == set(cache.problems)


def test_bad_files_never_raise_from_get_or_records(cache: TuningCache) -> None:
    bad = _bad_files(cache)
    with pytest.warns(CacheWarning):
        for shape in ((8, 8, 8), (16, 16, 16), (32, 32, 32)):
            assert cache.get(DEV, problem("matmul", "float32", "row", shape), COMPAT) is None
            found = cache.records(DEV, problem("matmul", "float32", "row", shape), COMPAT)
            assert [r.shape for _, _, r in found] == [(1024, 1024, 1024)]  # the one good entry
    assert len(cache.problems) == 3  # each bad file reported once, however often it is read
    assert all(p.exists() for p in bad.values())  # reading never moves or deletes anything


def test_wrong_schema_alone_is_reported(cache: TuningCache) -> None:
    path = cache.path_for(DEV, "matmul", "float32", "row", (16, 16, 16), COMPAT)
    path.parent.mkdir(parents=True)
    d = make(shape=(16, 16, 16)).to_json()
    d["schema"] = 2
    path.write_text(json.dumps(d))
    with pytest.warns(CacheWarning, match="schema"):
        assert cache.get(DEV, problem("matmul", "float32", "row", (16, 16, 16)), COMPAT) is None
    assert len(cache.problems) == 1 and str(path) in cache.problems[0]


def test_file_in_the_wrong_device_folder_is_foreign(cache: TuningCache) -> None:
    cache.put(make())
    src = cache.path_for(*key(make()))
    dst = cache.path_for(OTHER_DEV, "matmul", "float32", "row", (4096, 4096, 4096), COMPAT)
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes())
    with pytest.warns(CacheWarning, match="not what its name says"):
        assert cache.get(OTHER_DEV, problem("matmul", "float32", "row", (4096, 4096, 4096)), COMPAT) is None


def test_put_over_a_corrupt_file_moves_it_aside(cache: TuningCache) -> None:
    path = cache.path_for(*key(make()))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage")
    with pytest.warns(CacheWarning, match="corrupt"):
        assert cache.put(make(time_ms=5.0)).written is True
    assert stored_ms(cache) == 5.0
    assert path.with_name(path.name + ".corrupt").read_bytes() == b"garbage"
    path.write_bytes(b"more garbage")  # a second casualty does not overwrite the first
    with pytest.warns(CacheWarning):
        cache.put(make(time_ms=5.0))
    assert path.with_name(path.name + ".corrupt").read_bytes() == b"garbage"
    assert path.with_name(path.name + ".corrupt.1").read_bytes() == b"more garbage"
    assert len(cache.problems) == 2


# ---------------------------------------------------------------------- listing (the policy is select.py's)

def test_get_exact_and_none(cache: TuningCache) -> None:
    cache.put(make())
    assert cache.get(*pkey(make())) == make()
    for other in (problem("matvec", "float32", "row", (4096, 4096)), problem("matmul", "float64", "row", (4096,) * 3),
                  problem("matmul", "float32", "nt", (4096,) * 3)):
        assert cache.get(DEV, other, COMPAT) is None
    assert cache.get(OTHER_DEV, problem("matmul", "float32", "row", (4096,) * 3), COMPAT) is None


def test_records_lists_the_problem_family_with_its_root(tmp_path: Path, shipped: Path) -> None:
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    cache.put(make(shape=(1024, 1024, 1024), time_ms=9.0))
    cache.put(make(shape=(512, 512, 512), dtype="float64"))  # another dtype: not listed
    cache.put(make(shape=(256, 256, 256), compat=STALE))  # another compat hash: not listed
    ship(shipped, make(shape=(4096, 4096, 4096), time_ms=0.1))
    ship(shipped, make(shape=(2048, 2048, 2048)), shape_part="default")  # the device default: not listed
    found = cache.records(DEV, problem("matmul", "float32", "row", (2000, 2000, 2000)), COMPAT)
    assert sorted((rank, r.shape) for rank, _, r in found) == [(0, (1024, 1024, 1024)), (1, (4096, 4096, 4096))]
    assert cache.records(OTHER_DEV, problem("matmul", "float32", "row", (2000,) * 3), COMPAT) == []


def test_device_default(tmp_path: Path, shipped: Path) -> None:
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    default = make(shape=(4096, 4096, 4096), dtype="float64", time_ms=7.0)
    path = ship(shipped, default, shape_part="default")
    assert path.name == f"matmul-float64-nn-default-{COMPAT[:12]}.json"
    query = problem("matmul", "float64", "row", (100, 200, 300))
    assert cache.device_default(DEV, query, COMPAT) == default
    assert cache.device_default(DEV, problem("matmul", "float32", "row", (100, 200, 300)), COMPAT) is None
    assert cache.device_default(OTHER_DEV, query, COMPAT) is None
    assert cache.device_default(DEV, query, STALE) is None
    assert len(cache.entries(include_shipped=True)) == 1 and cache.problems == []  # a valid entry


def test_a_user_default_file_is_not_a_device_default(cache: TuningCache) -> None:
    ship(cache.root, make(dtype="float64"), shape_part="default")
    assert cache.device_default(DEV, problem("matmul", "float64", "row", (100, 200, 300)), COMPAT) is None


def test_get_falls_back_to_the_shipped_root(tmp_path: Path, shipped: Path) -> None:
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    ship(shipped, make(time_ms=2.0))
    assert stored_ms(cache) == 2.0
    cache.put(make(time_ms=3.0))  # the user root comes first, even when slower
    assert stored_ms(cache) == 3.0


def test_stale_compat_is_never_returned(tmp_path: Path, shipped: Path) -> None:
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    cache.put(make(compat=STALE))
    ship(shipped, make(shape=(1024, 1024, 1024), compat=STALE))
    ship(shipped, make(compat=STALE), shape_part="default")
    assert cache.get(*pkey(make())) is None
    assert cache.records(*pkey(make())) == [] and cache.device_default(*pkey(make())) is None
    assert cache.problems == []  # stale is not broken


def test_same_name_other_full_hash_is_stale(cache: TuningCache) -> None:
    # Two hashes that share their first 12 characters share a file: the full hash decides.
    twin = COMPAT[:12] + "0" * 52
    cache.put(make(compat=twin, time_ms=0.1))
    assert cache.path_for(*key(make(compat=twin))) == cache.path_for(*key(make()))
    assert cache.get(*pkey(make())) is None and cache.records(*pkey(make())) == []
    assert cache.put(make(time_ms=5.0)).written is True  # a stale entry does not block a slower current one
    assert stored_ms(cache) == 5.0


# ------------------------------------------------------------------------------- entries / clear

def test_entries_filters_and_shipped(tmp_path: Path, shipped: Path) -> None:
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    assert cache.entries() == []
    cache.put(make())
    cache.put(make(device=OTHER_DEV))
    ship(shipped, make(shape=(8, 8, 8)))
    assert len(cache.entries()) == 2
    assert [r.device for _, r in cache.entries(OTHER_DEV)] == [OTHER_DEV]
    both = cache.entries(DEV, include_shipped=True)
    assert [(p.is_relative_to(shipped), r.shape) for p, r in both] == [
        (False, (4096, 4096, 4096)), (True, (8, 8, 8))]


def test_clear(tmp_path: Path, shipped: Path) -> None:
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    for dev in (DEV, OTHER_DEV):
        for kernel in ("matmul", "matvec"):
            cache.put(make(device=dev, kernel=kernel))
            cache.put(make(device=dev, kernel=kernel, shape=(64, 64, 64)))
    shipped_file = ship(shipped, make())
    assert cache.clear(device=DEV, kernel="matvec") == 2
    assert {(r.device, r.kernel) for _, r in cache.entries()} == {
        (DEV, "matmul"), (OTHER_DEV, "matmul"), (OTHER_DEV, "matvec")}
    assert cache.clear(kernel="matmul") == 4
    assert cache.clear(device=DEV) == 0
    assert cache.clear() == 2
    assert cache.entries() == [] and shipped_file.exists()
    assert cache.get(*pkey(make())) is not None  # still served from the shipped root


def test_clear_removes_corrupt_entries_too(cache: TuningCache) -> None:
    cache.put(make())
    cache.path_for(*key(make(shape=(8, 8, 8)))).write_bytes(b"junk")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # clearing does not read the files, so it reports nothing
        assert cache.clear(device=DEV, kernel="matmul") == 2


def test_records_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().time_ms = 0.0  # type: ignore[misc]
    assert record_mod.SCHEMA == 1


# ------------------------------------------------------------------------ files that are not records

def _in_thread(fn: Any, seconds: float = 10.0) -> Any:
    """fn() run in a daemon thread; fails the test (instead of hanging it) if fn blocks."""
    import threading

    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} still blocked after {seconds} s"
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_entry_is_never_opened(cache: TuningCache) -> None:
    cache.put(make(shape=(1024, 1024, 1024)))
    fifo = cache.path_for(*key(make()))
    os.mkfifo(fifo)
    try:
        with pytest.warns(CacheWarning, match="FIFO"):
            entries = _in_thread(cache.entries)
        assert [r.shape for _, r in entries] == [(1024, 1024, 1024)]
        assert len(cache.problems) == 1 and str(fifo) in cache.problems[0]
        assert _in_thread(lambda: cache.get(*pkey(make()))) is None
        # A put moves the FIFO aside (a rename does not open it) and writes the entry.
        with pytest.warns(CacheWarning, match="moved to"):
            assert _in_thread(lambda: cache.put(make(time_ms=3.0)))
        assert stored_ms(cache) == 3.0
        assert fifo.with_name(fifo.name + ".corrupt").is_fifo()
    finally:
        # Unblock a reader that a regression left waiting on the FIFO, so the process can end.
        for name in (fifo, fifo.with_name(fifo.name + ".corrupt")):
            try:
                os.close(os.open(name, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


def test_folder_named_like_an_entry_is_reported(cache: TuningCache) -> None:
    cache.put(make(shape=(1024, 1024, 1024)))
    folder = cache.path_for(*key(make()))
    folder.mkdir()
    with pytest.warns(CacheWarning, match="a folder"):
        assert len(cache.entries()) == 1
    with pytest.warns(CacheWarning, match="left in place"):
        assert cache.clear() == 1  # the real entry; the folder is reported and left
    assert folder.is_dir()


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_link_out_of_the_cache_is_not_followed(cache: TuningCache, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(make().to_json()))  # even a valid record is not read through a link
    path = cache.path_for(*key(make()))
    path.parent.mkdir(parents=True)
    path.symlink_to(outside)
    with pytest.warns(CacheWarning, match="link out of the cache"):
        assert cache.get(*pkey(make())) is None
    assert str(path) in cache.problems[0] and str(outside) in cache.problems[0]
    # /dev/zero would be read until memory runs out; it is refused without being opened.
    zero = cache.path_for(*key(make(shape=(8, 8, 8))))
    zero.symlink_to("/dev/zero")
    with pytest.warns(CacheWarning, match="link out of the cache"):
        assert _in_thread(cache.entries) == []
    with pytest.warns(CacheWarning, match="moved to"):
        assert cache.put(make(shape=(8, 8, 8)))  # the link (not /dev/zero) is moved aside
    assert zero.with_name(zero.name + ".corrupt").is_symlink() and outside.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_link_inside_the_cache_is_followed(cache: TuningCache) -> None:
    cache.put(make(dtype="float64"))
    target = cache.path_for(*key(make(dtype="float64")))
    link = target.with_name(target.name.replace("4096x4096x4096", "default"))
    link.symlink_to(target.name)  # a fallback entry that names a tuned one, as a shipped cache may
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(cache.entries()) == 2 and cache.problems == []


def test_too_large_file_is_not_read(cache: TuningCache) -> None:
    path = cache.path_for(*key(make()))
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(cache_mod.MAX_RECORD_BYTES + 1)
    with pytest.warns(CacheWarning, match="too large"):
        assert cache.entries() == []
    assert f"{cache_mod.MAX_RECORD_BYTES + 1} bytes" in cache.problems[0]


def test_read_is_capped_whatever_the_size_says(cache: TuningCache, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file that grows after the stat (or a /proc-like file that reports size 0) is cut off at the limit.
    cache.put(make())
    monkeypatch.setattr(cache_mod, "MAX_RECORD_BYTES", 100)  # the record itself is about 600 bytes
    for name in ("lstat", "stat", "fstat"):
        real = getattr(os, name)

        def tiny(*args: Any, _real: Any = real, **kwargs: Any) -> os.stat_result:
            st = _real(*args, **kwargs)
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 0,
                                   int(st.st_atime), int(st.st_mtime), int(st.st_ctime)))

        monkeypatch.setattr(os, name, tiny)
    with pytest.warns(CacheWarning, match="too large"):
        assert cache.entries() == []


def test_cache_dir_that_is_a_file_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "cache.txt"
    not_a_folder.write_text("notes")
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(not_a_folder))
    cache = TuningCache(shipped_root=None)
    for call in (cache.entries, lambda: cache.put(make()), cache.clear):
        with pytest.raises(CacheError, match="AUTOTILE_CACHE_DIR") as info:
            call()
        assert str(not_a_folder) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CacheError, match="not a folder"):
        TuningCache(not_a_folder, shipped_root=None).entries()
    assert not_a_folder.read_text() == "notes"


# ------------------------------------------------------------------------------- locks and leftovers

def test_one_lock_file_per_device_folder(cache: TuningCache) -> None:
    for shape in ((8, 8, 8), (16, 16, 16), (32, 32, 32)):
        cache.put(make(shape=shape))
        cache.put(make(shape=shape, time_ms=0.5))
    names = sorted(p.name for p in (cache.root / DEV).iterdir())
    assert names == [cache_mod.LOCK_NAME] + sorted(cache.path_for(*key(make(shape=s))).name
                                                   for s in ((8, 8, 8), (16, 16, 16), (32, 32, 32)))


def _age(path: Path, seconds: float) -> None:
    import time

    os.utime(path, (time.time() - seconds, time.time() - seconds))


def test_clear_removes_stale_temporary_files(cache: TuningCache) -> None:
    cache.put(make())
    cache.put(make(kernel="matvec"))
    folder = cache.root / DEV
    name = cache.path_for(*key(make())).name
    stale = folder / f".{name}.k1ll3d.tmp"  # a writer killed between mkstemp and os.replace
    stale.write_bytes(b"x" * 1000)
    _age(stale, 3600)
    fresh = folder / f".{name}.wr1t1n.tmp"  # perhaps a writer of an older autotile, mid-write
    fresh.write_bytes(b"x")
    other = folder / f".{cache.path_for(*key(make(kernel='matvec'))).name}.k1ll3d.tmp"
    other.write_bytes(b"x")
    _age(other, 3600)
    assert cache.clear(kernel="matmul") == 1
    assert not stale.exists() and fresh.exists() and other.exists()  # other: another kernel's leftover
    assert cache.clear() == 1
    assert not other.exists() and fresh.exists()


def test_clear_removes_the_entry_lock_files_of_older_versions(cache: TuningCache) -> None:
    import filelock

    cache.put(make())
    cache.put(make(shape=(8, 8, 8)))
    old = cache.path_for(*key(make()))
    old_lock = old.with_name(old.name + ".lock")  # what earlier autotile versions left per entry
    old_lock.touch()
    orphan = old.with_name("matmul-float32-nn-64x64x64-" + COMPAT[:12] + ".json.lock")
    orphan.touch()
    held = cache.path_for(*key(make(shape=(8, 8, 8))))
    held_lock = held.with_name(held.name + ".lock")
    with filelock.FileLock(str(held_lock)):  # an older autotile is writing this entry now
        assert cache.clear() == 2
        assert held_lock.exists()  # its lock stays: deleting it would let a second old writer in
    assert not old_lock.exists() and not orphan.exists()
    assert sorted(p.name for p in old.parent.iterdir()) == sorted([cache_mod.LOCK_NAME, held_lock.name])


def test_clear_waits_for_a_writer(cache: TuningCache) -> None:
    import threading
    import time

    import filelock

    cache.put(make())
    removed: list[int] = []
    with filelock.FileLock(str(cache.root / DEV / cache_mod.LOCK_NAME)):
        clearer = threading.Thread(target=lambda: removed.append(cache.clear()))
        clearer.start()
        time.sleep(0.2)
        assert clearer.is_alive() and cache.get(*pkey(make())) is not None
    clearer.join(10)
    assert removed == [1] and cache.get(*pkey(make())) is None


def test_docs_say_what_the_compat_hash_covers() -> None:
    # kernels.compat_hash hashes the kernel and its parameter names; the template and the compiler are
    # checked per record (source_sha, compiler). The docs said otherwise once.
    for text in (cache_mod.__doc__ or "", (REPO / "cache" / "README.md").read_text()):
        flat = " ".join(text.split())
        assert "names of its parameters that have no default" in flat
        assert "source_sha" in flat and "compiler" in flat
        assert "from the template" not in flat and "hashes the kernel's template" not in flat


# --------------------------------------------------------------------- precision classes: one slot each

TF32X3 = {"MATH": "tf32x3", "BM": 128, "BN": 128, "smem": "dynamic"}  # needs "high"
SIMT = {"MATH": "simt", "BM": 128, "BN": 128, "smem": "dynamic"}  # needs "highest"


def high(time_ms: float = 1.0, **changes: Any) -> Record:
    return make(time_ms=time_ms, config=dict(TF32X3), **changes)


def highest(time_ms: float = 1.0, **changes: Any) -> Record:
    return make(time_ms=time_ms, config=dict(SIMT), **changes)


def old_file(root: Path, rec: Record, shape_part: str | None = None) -> Path:
    """`rec` written by hand as an autotile from before precision slots wrote it: no `precision` field,
    under the name without a slot, whatever class its config needs."""
    path = ship(root, rec, shape_part)
    data = json.loads(path.read_text())
    del data["precision"]
    path.write_text(json.dumps(data))
    return path


def test_record_carries_the_class_it_needs() -> None:
    assert high().precision == "high" and highest().precision == "highest" and make().precision == "highest"
    assert make(config=dict(TF32X3), implementation="cublas").precision == "highest"  # cuBLAS runs
    assert make(config=dict(TF32X3), dtype="float64").precision == "highest"
    assert high().to_json()["precision"] == "high"
    assert Record.from_json(high().to_json()) == high()
    old = high().to_json()
    del old["precision"]  # written before the field existed: derived from the config
    assert Record.from_json(old) == high()


@pytest.mark.parametrize("change,needle", [
    ({"precision": "highest"}, "'precision' is 'highest', but its generated config needs 'high'"),
    ({"precision": "medium"}, "expected one of highest, high"),
    ({"precision": 3}, "expected one of highest, high"),
    ({"config": {"MATH": "fp8"}}, "MATH='fp8' has no precision class"),
])
def test_record_precision_is_validated(change: dict[str, Any], needle: str) -> None:
    d = high().to_json()
    d.update(change)
    with pytest.raises(CacheError) as info:
        Record.from_json(d)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_slot_file_names(cache: TuningCache) -> None:
    base = key(make())
    assert cache.path_for(*base).name == f"matmul-float32-nn-4096x4096x4096-{COMPAT[:12]}.json"
    assert cache.path_for(*base, "highest") == cache.path_for(*base)
    assert cache.path_for(*base, "high").name == f"matmul-float32-nn-4096x4096x4096-high-{COMPAT[:12]}.json"
    with pytest.raises(CacheError, match="'medium'"):
        cache.path_for(*base, "medium")
    assert cache.put(high()).path == cache.path_for(*base, "high")
    assert cache.put(highest()).path == cache.path_for(*base)


@pytest.mark.parametrize("order", ["highest first", "high first"])
def test_a_highest_and_a_high_record_of_one_shape_coexist(cache: TuningCache, order: str) -> None:
    slow_ieee, fast_tc = highest(time_ms=2.0), high(time_ms=1.0)
    puts = [slow_ieee, fast_tc] if order == "highest first" else [fast_tc, slow_ieee]
    assert all(cache.put(rec).written for rec in puts)  # neither is compared with the other
    assert cache.slots(*pkey(make())) == {"highest": slow_ieee, "high": fast_tc}
    assert cache.get(*pkey(make())) == fast_tc  # every slot: the fastest
    assert cache.get(*pkey(make()), allowed_by="high") == fast_tc
    assert cache.get(*pkey(make()), allowed_by="medium") == fast_tc
    assert cache.get(*pkey(make()), allowed_by="highest") == slow_ieee
    assert sorted(r.precision for _, _, r in cache.records(*pkey(make()))) == ["high", "highest"]
    assert len(cache.entries()) == 2 and cache.problems == []
    # Within a slot, put compares as before.
    assert not cache.put(highest(time_ms=3.0)).written and not cache.put(high(time_ms=1.5)).written
    assert cache.put(highest(time_ms=1.5)).written
    assert cache.get(*pkey(make()), allowed_by="highest") == highest(time_ms=1.5)
    assert cache.get(*pkey(make())) == fast_tc
    assert cache.clear() == 2


def test_an_old_named_tf32x3_file_is_found_under_high(tmp_path: Path, shipped: Path) -> None:
    """The shipped records were written before slots: tf32x3 configs under the name without a slot."""
    cache = TuningCache(tmp_path / "user", shipped_root=shipped)
    path = old_file(shipped, high(time_ms=1.0))
    assert path.name == f"matmul-float32-nn-4096x4096x4096-{COMPAT[:12]}.json"  # no slot in the name
    assert cache.slots(*pkey(make())) == {"high": high(time_ms=1.0)}
    assert cache.get(*pkey(make()), allowed_by="high") == high(time_ms=1.0)
    assert cache.get(*pkey(make()), allowed_by="highest") is None
    assert [r for _, _, r in cache.records(*pkey(make()))] == [high(time_ms=1.0)]
    assert [r for _, r in cache.entries(include_shipped=True)] == [high(time_ms=1.0)]
    old_file(shipped, high(time_ms=4.0, dtype="float32", shape=(8, 8, 8)), shape_part="default")
    assert cache.device_default(*pkey(make()), allowed_by="high") == high(time_ms=4.0, shape=(8, 8, 8))
    assert cache.device_default(*pkey(make()), allowed_by="highest") is None
    # A "highest" record tuned by the user sits beside it, under the same name in the user root.
    cache.put(highest(time_ms=2.0))
    assert cache.slots(*pkey(make())) == {"highest": highest(time_ms=2.0), "high": high(time_ms=1.0)}
    assert cache.problems == []


def test_a_highest_put_moves_an_old_named_high_record_to_its_slot(cache: TuningCache) -> None:
    old = old_file(cache.root, high(time_ms=1.0))
    outcome = cache.put(highest(time_ms=5.0))  # slower, but another class: never compared, nothing lost
    assert outcome.written and outcome.path == old and outcome.existing is None
    assert json.loads(old.read_text())["precision"] == "highest"
    moved = cache.path_for(*key(make()), "high")
    assert Record.from_json(json.loads(moved.read_text())) == high(time_ms=1.0)
    assert cache.slots(*pkey(make())) == {"highest": highest(time_ms=5.0), "high": high(time_ms=1.0)}
    assert cache.problems == []


def test_a_high_put_competes_with_an_old_named_high_record(cache: TuningCache) -> None:
    old = old_file(cache.root, high(time_ms=1.0))
    kept = cache.put(high(time_ms=2.0))
    assert not kept.written and kept.path == old and kept.existing == high(time_ms=1.0)
    assert "kept the existing entry of 1 ms" in (kept.reason or "")
    replaced = cache.put(high(time_ms=0.5))
    assert replaced.written and replaced.existing == high(time_ms=1.0)
    assert not old.exists()  # the old name held the "high" entry: now under its slot's name only
    assert cache.slots(*pkey(make())) == {"high": high(time_ms=0.5)}


def test_a_slot_file_holding_another_class_is_foreign(cache: TuningCache) -> None:
    path = cache.path_for(*key(make()), "high")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(highest().to_json()))
    with pytest.warns(CacheWarning, match="not what its name says"):
        assert cache.slots(*pkey(make())) == {}


def test_the_slot_winner_on_a_tie_is_the_stricter_class(cache: TuningCache) -> None:
    cache.put(highest(time_ms=1.0))
    cache.put(high(time_ms=1.0))
    assert cache.get(*pkey(make())) == highest(time_ms=1.0)  # as fast, and it runs under every setting


def test_two_cublas_records_of_a_slot_keep_the_config_its_class_can_run(cache: TuningCache) -> None:
    """cuBLAS won both runs (the same time): the "highest" slot keeps the SIMT config, which "highest" can
    run on nearest shapes, over a faster tf32x3 one, which it cannot."""
    tc = make(time_ms=1.0, config=dict(TF32X3), implementation="cublas", baseline_ms=0.5)
    ieee = make(time_ms=2.0, config=dict(SIMT), implementation="cublas", baseline_ms=0.5)
    assert tc.precision == ieee.precision == "highest"
    assert cache.put(tc).written
    assert cache.put(ieee).written
    assert not cache.put(tc).written
    assert cache.get(*pkey(make())) == ieee
