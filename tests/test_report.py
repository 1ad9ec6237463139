"""The README's summary tables from a benchmark run's JSON (a trimmed H200 run of 2026-11-22)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from autotile import report

DATA = Path(__file__).parent / "data" / "bench_results_h200.json"


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
    assert report.main([str(DATA)]) == 0
    assert "| matmul float32 M x N x K |" in capsys.readouterr().out
    assert report.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
