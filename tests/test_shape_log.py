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
