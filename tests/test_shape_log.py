"""Recording the problems a program meets without a tuned record (autotile/dispatch/shape_log.py), without a
GPU: the switch, the file `autotile batch` reads back, no duplicates across processes, and a file that cannot be
written costs a warning, not the call."""

from __future__ import annotations

import multiprocessing
import warnings

import pytest

import autotile
from autotile.codegen.problem import ProblemKey
from autotile.dispatch import shape_log
from autotile.tuning import batch

KEYS = [ProblemKey("bmm", "float32", "nn", (5, 224, 701, 36)), ProblemKey("matmul", "bfloat16", "nt", (1, 4096, 11008)),
        ProblemKey("matvec", "float64", "col", (3001, 17)), ProblemKey("matmul", "int8", "tn", (33, 64, 4096))]


@pytest.fixture(autouse=True)
def recording_off(monkeypatch):
    """Every test starts with recording off and nothing noted, and leaves it so."""
    monkeypatch.delenv(shape_log.ENV_VAR, raising=False)
    shape_log.record_shapes(None)
    shape_log._noted.clear()
    shape_log._warned.clear()
    yield
    shape_log.record_shapes(None)
    shape_log._noted.clear()
    shape_log._warned.clear()


def test_off_unless_the_environment_or_the_function_names_a_file(monkeypatch, tmp_path):
    assert shape_log.target() is None
    shape_log.note(KEYS[0])  # off: nothing written anywhere
    monkeypatch.setenv(shape_log.ENV_VAR, str(tmp_path / "env.yaml"))
    assert shape_log.target() == str(tmp_path / "env.yaml")
    autotile.record_shapes(tmp_path / "mine.yaml")  # the function wins over the environment
    assert shape_log.target() == str(tmp_path / "mine.yaml")
    autotile.record_shapes(None)
    assert shape_log.target() == str(tmp_path / "env.yaml")
    monkeypatch.setenv(shape_log.ENV_VAR, "")
    assert shape_log.target() is None
    assert list(tmp_path.iterdir()) == []


def test_the_file_lists_each_problem_once_and_autotile_batch_reads_it_back(tmp_path):
    path = tmp_path / "seen.yaml"
    autotile.record_shapes(path)
    for key in KEYS + KEYS[:2]:
        shape_log.note(key)
    shape_log._noted.clear()  # as a second process would: the file, not memory, keeps the list unique
    shape_log.note(KEYS[1])
    text = path.read_text()
    assert text.startswith("# Problems autotile met without a tuned record") and f"autotile batch {path}" in text
    assert [item.key for item in batch.read_problems(path)] == KEYS


def test_a_file_without_a_last_newline_is_continued_on_a_new_line(tmp_path):
    path = tmp_path / "seen.yaml"
    path.write_text(shape_log.line(KEYS[0]).rstrip("\n"))  # written by hand, say
    autotile.record_shapes(path)
    shape_log.note(KEYS[2])
    assert [item.key for item in batch.read_problems(path)] == [KEYS[0], KEYS[2]]


def _record_in_a_process(path: str, keys: list[ProblemKey]) -> None:
    shape_log.record_shapes(path)
    for key in keys:
        shape_log.note(key)


def test_processes_recording_into_one_file_list_each_problem_once(tmp_path):
    path = str(tmp_path / "seen.yaml")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_record_in_a_process, args=(path, KEYS[i:] + KEYS[:i])) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    listed = [item.key for item in batch.read_problems(path)]  # read_problems refuses a problem listed twice
    assert len(listed) == len(KEYS) and set(listed) == set(KEYS)


def test_a_file_that_cannot_be_written_warns_once_and_the_call_goes_on(tmp_path):
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "seen.yaml"  # its folder is a file
    autotile.record_shapes(path)
    with pytest.warns(shape_log.ShapeLogWarning, match="cannot record problems into .*a-file"):
        shape_log.note(KEYS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same path again: no second warning
        shape_log.note(KEYS[1])
    assert not path.exists()


# -- tuning the recorded list: autotile batch --shortlist ------------------------------------------------------


def test_the_shortlist_tunes_each_problem_skips_those_tuned_before_and_goes_on_past_a_failure(monkeypatch):
    from autotile.codegen.limits import PROFILES
    from autotile.dispatch import select as select_mod
    from autotile.dispatch.select import Selection
    from autotile.tuning import at_first_call

    tuned_before, failing = KEYS[1], KEYS[2]
    timed: list[tuple[ProblemKey, str]] = []

    def fake_select(key, device, cache=None, precision=None):
        return Selection(None, "exact" if key == tuned_before else "model", None, step=(
            "exact" if key == tuned_before else "model"))

    def fake_tune(key, device, cache, setting):
        timed.append((key, setting))
        if key == failing:
            raise RuntimeError("none of 7 candidates ran correctly")
        return Selection(None, "first call", None, why="timed 7 candidates in 0.05 s: 0.0100 ms")

    monkeypatch.setattr(select_mod, "select", fake_select)
    monkeypatch.setattr(at_first_call, "_tune", fake_tune)
    said: list[str] = []
    outcome = at_first_call.tune_listed(KEYS, PROFILES["h100"], cache=None, setting=None, say=said.append)
    assert [key for key, _ in timed] == [KEYS[0], KEYS[2], KEYS[3]] and {s for _, s in timed} == {"high"}
    assert outcome == {KEYS[0]: None, KEYS[1]: None, KEYS[2]: "RuntimeError: none of 7 candidates ran correctly",
                       KEYS[3]: None}
    assert said[1] == f"[2/4] {KEYS[1]}: tuned before"
    assert said[2].startswith(f"[3/4] {KEYS[2]}: failed (RuntimeError") and said[3].startswith("[4/4]")


def test_autotile_batch_shortlist_refuses_the_search_only_options_in_one_line(tmp_path, capsys):
    from autotile.cli import main as cli

    path = tmp_path / "seen.yaml"
    path.write_text("".join(map(shape_log.line, KEYS)))
    rc = cli.main(["batch", str(path), "--shortlist", "--devices", "0,1", "--no-cache"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert "--shortlist runs in this process" in err and "--devices, --no-cache does not apply" in err


def test_autotile_batch_shortlist_reports_each_problem_and_exits_1_where_one_failed(tmp_path, capsys, monkeypatch):
    from autotile.cli import main as cli
    from autotile.codegen.limits import PROFILES
    from autotile.runtime import device
    from autotile.tuning import at_first_call

    path = tmp_path / "seen.yaml"
    path.write_text("".join(map(shape_log.line, KEYS)))
    monkeypatch.setattr(device, "live_device", lambda index=None: PROFILES["h100"])
    results = {KEYS[2]: "RuntimeError: no candidate"}

    def fake_tune_listed(keys, device_limits, cache, setting, say):
        assert keys == KEYS and device_limits is PROFILES["h100"]
        for key in keys:
            say(f"{key}: {results.get(key, 'tuned')}")
        return {key: results.get(key) for key in keys}

    monkeypatch.setattr(at_first_call, "tune_listed", fake_tune_listed)
    rc = cli.main(["batch", str(path), "--shortlist"])
    out = capsys.readouterr().out
    assert rc == 1 and "3 of 4 problems tuned in" in out and f"failed: {KEYS[2]}" in out
    results.clear()
    assert cli.main(["batch", str(path), "--shortlist"]) == 0
    assert "4 of 4 problems tuned" in capsys.readouterr().out
