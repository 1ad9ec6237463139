"""The README's summary tables from a benchmark run's JSON (a trimmed H200 run of 2026-11-22)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

from autotile.cli import report as report_cli
from autotile.tuning import bench_results as report

DATA = Path(__file__).parent / "data" / "bench_results_h200.json"
REPO = Path(__file__).resolve().parents[1]


def _results():
    return json.loads(DATA.read_text())


def test_tables_hold_every_problem_with_its_ratios():
    text = report.summary_markdown(_results())
    assert text.startswith("### NVIDIA H200 — 2026-11-22, CuPy 14.2.0")
    matmul = next(line for line in text.splitlines() if line.startswith("| 4096x4096x4096 |"))
    cells = [c.strip() for c in matmul.strip("|").split("|")]
    assert cells[1] == "51.2" and cells[3] == "62.2" and cells[4] == "**1.21**" and cells[5] == "tf32x3"
    assert cells[2].endswith("(0.16)")  # the best seed against cuBLAS
    rows = [line for line in text.splitlines() if line.startswith("| 4096x4096 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["row", "col"]
    assert "**1.02**" in rows[1]
    fallback = next(line for line in text.splitlines() if line.startswith("| matvec col 20000x3000 |"))
    assert "SPLIT_K raised 1->4 (65536x4096)" in fallback and fallback.rstrip(" |").endswith("0.81")
    assert "Host time per call" in text


def test_a_wrong_result_is_marked_not_hidden():
    results = _results()
    broken = copy.deepcopy(results)
    mine = next(r for r in broken["rows"] if r["kernel"] == "matmul" and r["name"].startswith("autotile"))
    mine["error"] = float("nan")
    line = next(x for x in report.summary_markdown(broken).splitlines()
                if x.startswith(f"| {'x'.join(map(str, mine['shape']))} |"))
    assert line.rstrip(" |").endswith("/ WRONG")


def test_command_reads_files_and_rejects_a_missing_one(tmp_path, capsys):
    assert report_cli.main([str(DATA)]) == 0
    assert "| matmul float32 M x N x K |" in capsys.readouterr().out
    assert report_cli.main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err == f"autotile.cli.report: error: cannot read {tmp_path / 'missing.json'}: " \
                                      "No such file or directory\n"


# -- the command: one line and exit status 2 for anything it cannot read ---------------------------------

def _one_line_error(capsys, argv, *needles):
    rc = report_cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert out == ""  # no table printed for the good files before the bad one
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autotile.cli.report: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_bad_files_are_one_line(tmp_path, capsys):
    good = str(DATA)
    _one_line_error(capsys, [good, str(tmp_path / "missing.json")], "cannot read", "missing.json",
                    "No such file or directory")
    _one_line_error(capsys, [_write(tmp_path, "text.json", "not json\n")], "cannot read", "text.json", "not JSON")
    _one_line_error(capsys, [_write(tmp_path, "list.json", [1, 2])], "list.json is not a result of python -m "
                    "autotile.cli.bench", "JSON list")
    _one_line_error(capsys, [_write(tmp_path, "empty.json", {})], "empty.json", "no 'environment' object")
    results = _results()
    del results["ceilings"]["read_gbps"]
    _one_line_error(capsys, [_write(tmp_path, "ceil.json", results)], "'ceilings' lacks 'read_gbps'")
    results = _results()
    del results["rows"][3]["vs_cublas"]
    _one_line_error(capsys, [good, _write(tmp_path, "row.json", results)], "row.json", "row 3 lacks 'vs_cublas'")
    results = _results()
    results["rows"][0]["metric"] = "fast"
    _one_line_error(capsys, [_write(tmp_path, "kind.json", results)], "kind.json: cannot make the tables")


def test_no_file_is_one_line(capsys):
    _one_line_error(capsys, [], "no results file given", "usage: python -m autotile.cli.report RESULTS.json")


def _python_m(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "autotile.cli.report", *argv], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_python_m_report(tmp_path):
    proc = _python_m("--help", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: python -m autotile.cli.report")
    proc = _python_m(str(DATA), cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "| matmul float32 M x N x K |" in proc.stdout
    proc = _python_m(_write(tmp_path, "x.json", {"rows": []}), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr  # a traceback would be many lines
    assert proc.stderr.startswith("autotile.cli.report: error: ") and "x.json" in proc.stderr


def test_report_needs_no_cupy(tmp_path):
    code = ("import sys; sys.modules['cupy'] = None\n"  # `import cupy` would raise ImportError
            "from autotile.cli import report\n"
            f"sys.exit(report.main([{str(DATA)!r}]))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert (proc.returncode, proc.stderr) == (0, "")
