"""Bad input, careless or hostile, gets one typed line and nothing hangs (issue 29): one regression test per
defect found by probing main at 761e2a8, numbered as in the issue. No GPU."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import yaml

from autotile import safe_files
from autotile.cli import main as cli
from autotile.codegen.space import Space
from autotile.dispatch import database, first_call
from autotile.dispatch.cache import TuningCache
from autotile.errors import AutotileError, InvalidValueError, SpaceDefinitionError
from autotile.tuning import validate
from autotile.tuning.batch import read_problems
from autotile.tuning.gpu_workers import parse_devices

MAX_LINE = 600  # characters an error line may take: it names the file, the entry and the limit, no dump


def _within(fn: Callable[[], Any], seconds: float = 10.0) -> Any:
    """fn() in a thread; fails the test (instead of hanging it) if fn has not returned in `seconds`."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) <= MAX_LINE, text[:2000]
    return text


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9))


# 1. YAML alias expansion -------------------------------------------------------------------------------

def test_1_an_alias_bomb_in_a_space_file_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 500
    start = time.monotonic()
    with pytest.raises(SpaceDefinitionError) as info:
        _within(lambda: Space.load(path))
    assert time.monotonic() - start < 5
    assert "aliases expand to more than" in _one_line(info.value) and str(path) in str(info.value)


def test_1_an_alias_bomb_in_a_batch_file_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB + "problems: *j\n")
    with pytest.raises(InvalidValueError) as info:
        _within(lambda: read_problems(path))
    assert "aliases expand to more than" in _one_line(info.value)


def test_1_aliases_that_expand_a_little_still_load(tmp_path):
    # what PyYAML itself writes for a list that repeats one object
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump([{"kernel": "matmul", "shape": "8x8x8"}] * 2))
    assert "&id" in path.read_text()
    with pytest.raises(InvalidValueError, match="listed twice"):  # read, then refused for what it says
        read_problems(path)


def test_1_a_recursive_alias_is_refused():
    with pytest.raises(InvalidValueError, match="aliases expand"):
        safe_files.load_yaml("&a [*a]", "loop.yaml")


def test_1_only_the_shipped_spaces_take_the_fast_loader(tmp_path):
    """autotile's own search spaces are read through libyaml where PyYAML has it (the same data as the
    bounded loader gives); a space file a user names still goes through the bounds."""
    from autotile.codegen import resources

    for kernel in ("matmul", "matvec"):
        text = resources.search_space_path(kernel).read_text()
        assert safe_files.load_own_yaml(text, kernel) == safe_files.load_yaml(text, kernel)
    with pytest.raises(SpaceDefinitionError, match=r"junk\.yaml: not valid YAML: .* at line \d+, column \d+$"):
        safe_files.load_own_yaml("[unclosed", "junk.yaml", SpaceDefinitionError)
    copy = tmp_path / "matmul.yaml"
    copy.write_text(BOMB)
    with pytest.raises(SpaceDefinitionError, match="aliases expand to more than"):
        _within(lambda: Space.load(copy))  # the name of a shipped file does not make it one


# 2. files in the folders autotile reads --------------------------------------------------------------------

def _database_path(root: Path) -> Path:
    path = database.path_in(root, "GPU_sm_90", "matmul", "float32", "nn")
    path.parent.mkdir(parents=True)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_2_a_fifo_in_the_database_folder_is_skipped_without_hanging(tmp_path):
    path = _database_path(tmp_path)
    os.mkfifo(path)
    cache = TuningCache(tmp_path)
    with pytest.warns(UserWarning):
        assert _within(lambda: database.load(cache, "GPU_sm_90", "matmul", "float32", "nn")) is None
    assert any("not a regular file" in problem for problem in cache.problems)


def test_2_a_huge_or_deep_database_is_skipped_with_its_reason(tmp_path):
    path = _database_path(tmp_path)
    cache = TuningCache(tmp_path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.warns(UserWarning):
        assert _within(lambda: database.load(cache, "GPU_sm_90", "matmul", "float32", "nn")) is None
    assert any("nested too deeply" in problem for problem in cache.problems)
    with open(path, "wb") as f:  # /dev/zero-like: more bytes than any database has
        f.truncate(database.MAX_DATABASE_BYTES + 1)
    with pytest.warns(UserWarning):
        assert database.load(TuningCache(tmp_path), "GPU_sm_90", "matmul", "float32", "nn") is None


def test_2_safe_files_refuse_what_is_not_a_regular_file(tmp_path):
    with pytest.raises(InvalidValueError, match="is a folder"):
        safe_files.read_text(tmp_path, "space")
    with pytest.raises(InvalidValueError, match="does not exist"):
        safe_files.read_text(tmp_path / "missing.yaml", "space")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"x" * 101)
    with pytest.raises(InvalidValueError, match="over the limit of 100"):
        safe_files.read_text(big, "space", limit=100)
    if os.path.exists("/dev/zero"):
        with pytest.raises(InvalidValueError, match="not a regular file"):
            _within(lambda: safe_files.read_text("/dev/zero", "space"))


# 3. spaces that are too big or too deep -----------------------------------------------------------------------

def _tiny_space(**extra: Any) -> dict:
    from test_space import _tiny

    return _tiny(**extra)


@pytest.mark.parametrize("expr,needle", [
    ("(" * 5000 + "1" + ")" * 5000, "deeper than"),
    ("+".join(["1"] * 9999), "nested too deeply"),
    ("A in (" + ",".join(map(str, range(10**6))) + ")", "over the limit of"),
    ("not " * 4990 + "A", "nested too deeply"),
])
def test_3_deep_or_huge_expressions_are_a_space_error(expr, needle):
    data = _tiny_space(constraints=[{"name": "deep", "expr": expr}])
    start = time.monotonic()
    with pytest.raises(SpaceDefinitionError) as info:
        _within(lambda: Space(data, "tiny.yaml"))
    assert needle in _one_line(info.value) and time.monotonic() - start < 5


def test_3_a_space_of_thousands_of_parameters_or_choices_is_refused():
    many = _tiny_space(params={f"P{i}": [1, 2] for i in range(2000)})
    with pytest.raises(SpaceDefinitionError, match="2003 parameters, over the limit"):
        Space(many, "tiny.yaml")
    wide = _tiny_space(params={"P": list(range(10**6))})
    with pytest.raises(SpaceDefinitionError, match="1000000 choices, over the limit"):
        _within(lambda: Space(wide, "tiny.yaml"), 5)


# 4 and 5. batch files: every field strict ---------------------------------------------------------------------

@pytest.mark.parametrize("row,needle", [
    ({"kernel": "matmul", "shape": 4096}, "shape must be text"),
    ({"kernel": "matmul", "shape": [64, True, 64]}, "shape must be text"),
    ({"kernel": "matmul", "shape": "8x8x8", "trials": float("inf")}, "whole number"),
    ({"kernel": "matmul", "shape": "8x8x8", "trials": 2.7}, "whole number"),
    ({"kernel": "matmul", "shape": "8x8x8", "trials": True}, "whole number"),
    ({"kernel": "matmul", "shape": "8x8x8", "trials": "12abc"}, "whole number"),
])
def test_4_5_bad_batch_fields_are_one_line(tmp_path, row, needle):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump([row]))
    with pytest.raises(InvalidValueError) as info:
        read_problems(path)
    assert needle in _one_line(info.value) and "problem 1" in str(info.value)


def test_4_binary_junk_as_a_batch_file_is_one_line(tmp_path):
    path = tmp_path / "junk.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InvalidValueError) as info:
        read_problems(path)
    assert "not UTF-8" in _one_line(info.value)


def test_5_trials_as_text_of_digits_and_numpy_integers_still_count(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("kernel,shape,trials\nmatmul,8x8x8,12\n")
    assert read_problems(path)[0].trials == 12
    assert validate.count(np.int64(7), name="trials") == 7  # 9: a NumPy integer is a count


# 6. --devices ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["\u00b2", "\u0661", "0,\u0662", "1.0", "-1"])
def test_6_devices_take_ascii_digits_only(text):
    with pytest.raises(InvalidValueError) as info:
        parse_devices(text)
    assert "is not a GPU index" in _one_line(info.value)


def test_6_devices_on_the_command_line_exit_2_in_one_line(capsys):
    assert cli.main(["tune", "matmul", "--shape", "8x8x8", "--devices", "\u00b2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "GPU index" in err


# 8. search-bench arguments -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,needle", [
    (["search-bench", "--budgets", "abc"], "--budgets"),
    (["search-bench", "--jobs=-1"], "--jobs"),
    (["search-bench", "--sweeps", "/nonexistent/sweeps"], "no such folder"),
])
def test_8_search_bench_refuses_bad_arguments_in_one_line(capsys, argv, needle):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_8_an_empty_sweeps_folder_is_an_error_not_an_empty_table(tmp_path, capsys):
    assert cli.main(["search-bench", "--sweeps", str(tmp_path)]) == 2
    assert "holds no sweep file" in capsys.readouterr().err


# 9. the API ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [("false", False), ("0", False), ("no", False), ("off", False),
                                            ("", False), ("OFF", False), ("1", True), ("true", True),
                                            ("Yes", True), (" on ", True)])
def test_9_tuning_at_first_call_reads_the_environment_strictly(monkeypatch, value, expected):
    monkeypatch.setattr(first_call, "_enabled", None)
    monkeypatch.setenv(first_call.ENV_VAR, value)
    assert first_call.enabled() is expected


def test_9_a_value_that_is_no_boolean_is_an_error(monkeypatch):
    monkeypatch.setattr(first_call, "_enabled", None)
    monkeypatch.setenv(first_call.ENV_VAR, "flase")
    with pytest.raises(InvalidValueError, match="AUTOTILE_TUNE_AT_FIRST_CALL='flase' is not a boolean"):
        first_call.enabled()


def test_9_every_switch_of_the_environment_reads_the_same_words(monkeypatch):
    from autotile.environment import env_flag
    from autotile.runtime import torch_lookup

    monkeypatch.delenv("AUTOTILE_SOME_SWITCH", raising=False)
    assert env_flag("AUTOTILE_SOME_SWITCH") is False and env_flag("AUTOTILE_SOME_SWITCH", default=True) is True
    monkeypatch.setenv("AUTOTILE_SOME_SWITCH", "  ")  # empty: the default
    assert env_flag("AUTOTILE_SOME_SWITCH", default=True) is True
    for value, expected in (("Off", False), ("0", False), ("on", True), ("YES", True)):
        monkeypatch.setenv(torch_lookup.ENV_VAR, value)
        assert torch_lookup.enabled() is expected, value
    monkeypatch.delenv(torch_lookup.ENV_VAR)
    assert torch_lookup.enabled()  # on unless turned off
    monkeypatch.setenv(torch_lookup.ENV_VAR, "of")  # a typo never leaves it on silently
    with pytest.raises(InvalidValueError, match="AUTOTILE_COMPILED_LOOKUP='of' is not a boolean"):
        torch_lookup.enabled()


def test_9_tune_refuses_a_fix_that_is_not_a_mapping():
    import autotile

    with pytest.raises(InvalidValueError) as info:
        autotile.tune("matmul", "8x8x8", trials=1, fix=["BM"], cache=None)
    assert "fix must map parameter names" in _one_line(info.value)


def test_9_space_load_of_a_missing_file_is_a_space_error(tmp_path):
    with pytest.raises(SpaceDefinitionError, match="does not exist"):
        Space.load(tmp_path / "nope.yaml")


def test_every_error_here_is_an_autotile_error():
    for cls in (InvalidValueError, SpaceDefinitionError):
        assert issubclass(cls, AutotileError)


# 7. storages that cannot be opened --------------------------------------------------------------------------

def test_7_an_unreachable_postgresql_server_is_one_line_without_the_password():
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")
    from autotile.errors import StorageError
    from autotile.tuning.study import open_storage

    with pytest.raises(StorageError) as info:
        _within(lambda: open_storage("postgresql://tuner:s3cret@127.0.0.1:1/autotile"), 60)
    text = _one_line(info.value)
    assert "s3cret" not in text and "tuner:***@127.0.0.1:1" in text and "server runs" in text


def test_7_a_damaged_journal_or_sqlite_file_is_one_line(tmp_path):
    from autotile.errors import StorageError
    from autotile.tuning.study import open_storage

    journal = tmp_path / "study.journal"
    journal.write_bytes(b"\xff\xfe not a journal \x00\n{]\n")
    with pytest.raises(StorageError) as info:
        open_storage(f"journal:{journal}")
    assert "cannot be read as an optuna journal" in _one_line(info.value)
    database_file = tmp_path / "study.db"
    database_file.write_bytes(os.urandom(4096))
    with pytest.raises(StorageError) as info:
        open_storage(f"sqlite:///{database_file}")
    assert "SQLite database" in _one_line(info.value)


def test_7_the_command_prints_a_storage_error_in_one_line(tmp_path, capsys):
    journal = tmp_path / "bad.journal"
    journal.write_bytes(b"\x00\x01garbage\n")
    assert cli.main(["report-study", "--storage", f"journal:{journal}", "--study-name", "x",
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "journal" in err and "Traceback" not in err


# 10 and 11. the cache's listing -------------------------------------------------------------------------------

def _record_file(root: Path) -> Path:
    from autotile.codegen.limits import PROFILES
    from autotile.dispatch.record import Record

    cache = TuningCache(root)
    record = Record(kernel="matmul", dtype="float32", layout="nn", shape=(64, 64, 64), compat="c" * 64,
                    config={"BM": 64}, time_ms=1.0, spread=0.0, metric=1.0, metric_unit="GFLOP/s",
                    baseline_ms=1.5, device=PROFILES["h100"].fingerprint, environment={})
    outcome = cache.put(record)
    return Path(outcome.path)


def test_11_cache_list_says_what_it_skipped_and_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path))
    good = _record_file(tmp_path)
    (good.parent / "matmul-float32-nn-8x8x8-cccccccccccc.json").write_text('{"schema": 1}')  # injected
    (good.parent / "matvec-float32-row-8x8-cccccccccccc.json").write_bytes(b"\xff\x00junk")
    assert cli.main(["cache", "list"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().splitlines()[-1] == "1 entry; 2 files skipped (not valid entries; the reasons are above)"
    assert err.count("autotile: warning:") == 2 and "lacks field" in err and "not valid JSON" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders whatever their mode")
def test_10_an_unreadable_device_folder_is_reported_not_empty(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path))
    good = _record_file(tmp_path)
    good.parent.chmod(0)
    try:
        assert cli.main(["cache", "list"]) == 0
        out, err = capsys.readouterr()
        assert "cannot be listed" in err and "1 file skipped" in out
    finally:
        good.parent.chmod(0o755)


def test_10_an_unreadable_device_folder_is_reported_even_as_root(tmp_path, monkeypatch):
    good = _record_file(tmp_path)
    real = os.listdir

    def refuse(path: Any) -> list[str]:
        if Path(path) == good.parent:
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "listdir", refuse)
    cache = TuningCache(tmp_path)
    with pytest.warns(UserWarning, match="cannot be listed"):
        assert cache.entries() == []
    assert any("cannot be listed (Permission denied)" in p for p in cache.problems)


# 12. an in-memory storage shared by worker processes -------------------------------------------------------------

@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://"])
def test_12_an_in_memory_sqlite_storage_with_devices_is_refused_saying_why(url):
    import autotile

    with pytest.raises(InvalidValueError) as info:
        autotile.tune("matmul", "8x8x8", trials=1, storage=url, devices=[0], backend="x:y", cache=None)
    assert "one process's memory" in _one_line(info.value)


def test_9_api_calls_without_a_gpu_raise_a_typed_error():
    from conftest import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is present: this checks the error where there is none")
    from autotile.errors import DeviceUnavailableError
    from autotile.library.calls import selection_for

    with pytest.raises(DeviceUnavailableError) as info:
        selection_for("matmul", "float32", "nn", (8, 8, 8))
    assert _one_line(info.value).startswith("no usable CUDA GPU")


@pytest.mark.parametrize("argv", [["tune", "matmul", "--shape", "8x8x8", "--trials", "2.7"], ["frob"],
                                  ["search-bench", "--seeds", "x"], ["cache"]])
def test_argparse_errors_are_one_line_too(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err and "--help" in err
