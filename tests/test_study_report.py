"""Reports of tuning studies (plots and an HTML page) and the roofline of a benchmark run, made from
replayed studies and a recorded benchmark run: no GPU."""

from __future__ import annotations

import builtins
import json

import pytest
from replay_space import DATA
from test_tune_api import NARROW, SHAPE
from test_tuner import load_table

from autotile.cli import main as cli
from autotile.errors import InvalidValueError, MissingDependencyError
from autotile.tuning import api, study_report
from autotile.tuning.testing import ReplayEvaluator

pytest.importorskip("matplotlib")

BENCH = DATA / "bench_results_h200.json"
PNG = b"\x89PNG\r\n\x1a\n"


def _tune(**kwargs):
    kwargs.setdefault("trials", 24)
    return api.tune("matmul", SHAPE, evaluator=ReplayEvaluator(load_table()), fix=NARROW, cache=None, **kwargs)


def _best_key(study) -> str:
    runs = [t for t in study.trials if t.state.name == "COMPLETE"]
    return min(runs, key=lambda t: t.value).user_attrs["config_key"]


def _check_folder(out, plots=study_report.PLOTS) -> str:
    for name in plots:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000, name
    page = (out / "index.html").read_text()
    for name in plots:
        assert f'src="{name}"' in page
    return page


def test_report_of_an_in_memory_study_from_tune(tmp_path):
    result = _tune(report=tmp_path / "rep")
    assert result.report_error is None and result.report_path == str(tmp_path / "rep" / "index.html")
    page = _check_folder(tmp_path / "rep")
    assert "matmul float32 nn 1024x1024x1024" in page
    assert "x cuBLAS" in page and "cuBLAS: not recorded" not in page  # the tuner stored the baseline
    assert result.best.config.key() in page or result.finalists[0].config.key() in page


def test_report_of_a_journal_study_by_storage_and_name(tmp_path):
    storage = f"journal:{tmp_path / 'study.journal'}"
    _tune(storage=storage, study_name="replayed")
    study = study_report.load_study(storage, "replayed")
    assert study.user_attrs[study_report.BASELINE_ATTR] > 0
    index = study_report.write_report(study, tmp_path / "rep", bench=BENCH)
    page = _check_folder(tmp_path / "rep", study_report.PLOTS + (study_report.ROOFLINE,))
    assert index == tmp_path / "rep" / "index.html"
    assert f"<code>{_best_key(study)}</code>" in page  # the real best config heads the table
    assert "Roofline" in page


def test_report_study_command(tmp_path, capsys):
    storage = f"journal:{tmp_path / 'study.journal'}"
    _tune(storage=storage, study_name="replayed", trials=8)
    out = tmp_path / "rep"
    assert cli.main(["report-study", "--storage", storage, "--study-name", "replayed", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    _check_folder(out)


def test_roofline_alone_from_a_recorded_run(tmp_path):
    assert cli.main(["report-study", "--bench", str(BENCH), "--out", str(tmp_path)]) == 0
    _check_folder(tmp_path, (study_report.ROOFLINE,))
    points = study_report.roofline_points(json.loads(BENCH.read_text()))
    assert len(points) == 18
    ceilings = json.loads(BENCH.read_text())["ceilings"]
    for p in points:  # nothing achieved above the ceilings measured in the same run
        assert p.tflops <= ceilings["fp32_peak_tflops"] and p.gbps <= ceilings["read_gbps"]


def test_too_few_runs_give_notes_not_errors(tmp_path):
    storage = f"journal:{tmp_path / 'one.journal'}"
    _tune(trials=1, storage=storage, study_name="one", report=tmp_path / "rep")
    _check_folder(tmp_path / "rep")
    found, why = study_report.importances(study_report.load_study(storage, "one"))
    assert found is None and "too few" in why


@pytest.mark.parametrize("argv,message", [
    (["--storage", "journal:{tmp}/none.journal", "--study-name", "x"], "no study storage"),
    (["--storage", "journal:{tmp}/s.journal", "--study-name", "missing"], "no study named 'missing'"),
    (["--bench", "{tmp}/bad.json"], "not JSON"),
    (["--bench", "{tmp}/nothing.json"], "cannot read"),
    (["--study-name", "x"], "give both"),
    ([], "nothing to report"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    _tune(storage=f"journal:{tmp_path / 's.journal'}", study_name="there", trials=2)
    (tmp_path / "bad.json").write_text("{not json")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(["report-study", *argv, "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_without_matplotlib_the_command_says_what_to_install(tmp_path, monkeypatch, capsys):
    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert cli.main(["report-study", "--bench", str(BENCH), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'pip install "autotile[report]"' in err and err.count("\n") == 1
    with pytest.raises(MissingDependencyError):
        _tune(report=tmp_path / "rep")  # refused before any tuning
    assert not (tmp_path / "rep").exists()


def test_load_study_refuses_memory():
    with pytest.raises(InvalidValueError, match="in memory"):
        study_report.load_study(None, "x")


def test_tune_command_writes_the_report_with_devices(tmp_path, monkeypatch, capsys):
    """`autotile tune --devices 0 --report DIR` on the replay backend: workers in processes of their own,
    the study on a journal file, the report read back from it."""
    from pathlib import Path

    from autotile.tuning.testing import ReplayBackend

    repo = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(repo))
    settings = {"table": str(DATA / "matmul_replay_h200.json"), "space": str(DATA / "matmul_replay_space.yaml"),
                "delay_s": 0.0, "log": str(tmp_path / "evaluations.log")}
    (tmp_path / "replay.json").write_text(json.dumps(settings))
    monkeypatch.setenv(ReplayBackend.ENV_VAR, str(tmp_path / "replay.json"))
    out = tmp_path / "rep"
    code = cli.main(["tune", "matmul", "--shape", "1024x1024x1024", "--layout", "nn", "--trials", "6", "--devices",
                     "0", "--backend", "autotile.tuning.testing:ReplayBackend", "--no-cache", "--report", str(out)])
    assert code == 0, capsys.readouterr().err
    assert f"report: {out / 'index.html'}" in capsys.readouterr().out
    _check_folder(out)
