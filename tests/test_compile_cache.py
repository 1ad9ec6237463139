"""The compile cache on disk (`autotile.codegen.compile_cache`): what one process compiles, another reads back
instead of running NVRTC, byte for byte; a file that is not whole and true costs a compile, never a wrong
kernel; the cache stays under its size bound, least recently used first; "off" turns it off; the tuning
cache does not take its folder for a device's."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from autotile.codegen import build, compile_cache
from autotile.dispatch.cache import TuningCache
from autotile.errors import InvalidValueError

SOURCE = 'extern "C" __global__ void fill(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 1.0f; }\n'
NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded: {NVRTC_MISSING}")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A private compile cache for the test, and no memoized compiles."""
    root = tmp_path / "compiled"
    monkeypatch.setenv(compile_cache.ENV_VAR, str(root))
    build.clear_memo()
    yield root
    build.clear_memo()


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_store_then_load_gives_back_header_and_binary(folder):
    key = key_of("a")
    assert compile_cache.load(key, "nvrtc-13.0") is None
    assert compile_cache.store(key, "nvrtc-13.0", {"kind": "cubin", "log": "ok"}, b"\x7fELF\x00\nbinary")
    header, binary = compile_cache.load(key, "nvrtc-13.0")
    assert binary == b"\x7fELF\x00\nbinary"  # a newline inside the binary is the binary's
    assert header["kind"] == "cubin" and header["log"] == "ok"
    assert compile_cache.load(key, "nvrtc-12.9") is None  # another compiler's build is not this one's
    assert compile_cache.load(key_of("b"), "nvrtc-13.0") is None
    assert compile_cache.path_of(key, "nvrtc-13.0", folder).is_file()


@pytest.mark.parametrize("damage", ["truncate", "flip", "header", "empty", "foreign key"])
def test_a_file_not_whole_and_true_is_a_miss_and_is_removed(folder, damage):
    key = key_of("a")
    compile_cache.store(key, "nvrtc-13.0", {"kind": "cubin"}, b"0123456789" * 10)
    path = compile_cache.path_of(key, "nvrtc-13.0", folder)
    data = path.read_bytes()
    if damage == "truncate":
        data = data[:-3]
    elif damage == "flip":
        data = data[:-1] + bytes([data[-1] ^ 1])
    elif damage == "header":
        data = b"{not json" + data[data.index(b"\n"):]
    elif damage == "empty":
        data = b""
    else:  # a whole entry of another key, copied over this one's name
        other = key_of("b")
        compile_cache.store(other, "nvrtc-13.0", {"kind": "cubin"}, b"0123456789" * 10)
        data = compile_cache.path_of(other, "nvrtc-13.0", folder).read_bytes()
    path.write_bytes(data)
    assert compile_cache.load(key, "nvrtc-13.0") is None
    assert not path.exists()


def test_a_folder_where_the_file_should_be_is_a_miss(folder):
    key = key_of("a")
    compile_cache.path_of(key, "nvrtc-13.0", folder).mkdir(parents=True)
    assert compile_cache.load(key, "nvrtc-13.0") is None
    assert not compile_cache.store(key, "nvrtc-13.0", {}, b"x")  # cannot replace it: the compile stands


def test_off_reads_and_writes_nothing(folder, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_VAR, "OFF")
    assert compile_cache.root() is None
    assert not compile_cache.store(key_of("a"), "nvrtc-13.0", {}, b"x")
    assert compile_cache.load(key_of("a"), "nvrtc-13.0") is None
    assert not folder.exists()


def test_default_root_is_in_the_user_cache_root(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path / "user"))
    assert compile_cache.root() == tmp_path / "user" / compile_cache.COMPILED_DIR


def test_keys_are_checked():
    with pytest.raises(InvalidValueError, match="SHA-256"):
        compile_cache.path_of("../../etc/passwd", "nvrtc-13.0", Path("/tmp"))


def test_prune_removes_the_least_recently_used_down_to_three_quarters(folder):
    keys = [key_of(str(i)) for i in range(8)]
    now = time.time()
    for age, key in enumerate(keys):
        compile_cache.store(key, "c", {}, b"x" * 1000)
        path = compile_cache.path_of(key, "c", folder)
        os.utime(path, (now - 1000 + age, now - 1000 + age))  # keys[0] the least recently used
    compile_cache.load(keys[0], "c")  # a hit makes it the most recently used
    total = sum(size for _, size, _ in compile_cache.entries(folder))
    removed = compile_cache.prune(folder, max_bytes=total - 1)
    left = {p.name.removesuffix(compile_cache.SUFFIX) for p, _, _ in compile_cache.entries(folder)}
    # 8 files of one size over a bound of just under 8: down to 3/4 of the bound keeps 5
    assert removed == 3 and left == {keys[0], *keys[4:]}
    assert compile_cache.prune(folder, max_bytes=total) == 0
    assert compile_cache.clear(folder) == 5 and compile_cache.entries(folder) == []


def test_the_tuning_cache_skips_the_compiled_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    compile_cache.store(key_of("a"), "nvrtc-13.0", {}, b"x")
    cache = TuningCache(root=tmp_path)
    assert cache.entries() == [] and cache.problems == []
    assert cache.clear() == 0 and compile_cache.entries() != []


@needs_nvrtc
def test_a_second_process_reads_the_binary_instead_of_compiling(folder, monkeypatch):
    first = build.compile(SOURCE, "sm_80")
    assert len(compile_cache.entries(folder)) == 1
    build.clear_memo()  # as a new process: nothing in memory

    def no_nvrtc(*args, **kwargs):
        raise AssertionError("NVRTC ran although the disk cache holds the compile")

    monkeypatch.setattr(build, "_run_nvrtc", no_nvrtc)
    again = build.compile(SOURCE, "sm_80")
    assert again.binary == first.binary and again.usages == first.usages and again.log == first.log
    assert again.usage("fill") is not None and again.options == first.options and again.key == first.key


@needs_nvrtc
def test_a_damaged_entry_is_compiled_again(folder, monkeypatch):
    first = build.compile(SOURCE, "sm_80")
    (path, _, _), = compile_cache.entries(folder)
    path.write_bytes(path.read_bytes()[:-10])
    build.clear_memo()
    runs = []
    real = build._run_nvrtc
    monkeypatch.setattr(build, "_run_nvrtc", lambda *a: runs.append(1) or real(*a))
    assert build.compile(SOURCE, "sm_80").binary == first.binary and runs == [1]
    build.clear_memo()
    assert build.compile(SOURCE, "sm_80").binary == first.binary and runs == [1]  # stored whole again


@needs_nvrtc
def test_other_options_or_targets_are_other_entries(folder):
    build.compile(SOURCE, "sm_80")
    build.compile(SOURCE, "sm_90")
    build.compile(SOURCE, "compute_80")
    assert len(compile_cache.entries(folder)) == 3


@pytest.mark.parametrize("cores,threads", [(1, 1), (2, 2), (12, 12), (64, build.MAX_COMPILE_THREADS)])
def test_a_tune_compiles_on_every_core_it_may_use(monkeypatch, cores, threads):
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.worker import Setup

    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert build.host_compile_threads() == threads
    assert Setup(ProblemKey("matmul", "float32", "nn", (5, 6, 7))).compile_threads == threads
