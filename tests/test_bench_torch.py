"""The PyTorch benchmark's report (autotile/cli/bench_torch.py), without a GPU or torch: the random shapes'
distribution and, for those timed back to back, theirs."""

from __future__ import annotations

from autotile.cli import bench_torch


def _row(ratio: float, torch_ms: float, back_to_back: float | None = None) -> dict:
    row = {"case": "x @ W.T", "layout": "nt", "shape": [64, 64, 64], "torch_ms": torch_ms,
           "autotile_ms": torch_ms / ratio, "ratio": ratio, "error": 1e-3, "torch_error": 1e-3, "runs": "-"}
    if back_to_back is not None:
        row["back_to_back"] = back_to_back
    return row


def test_the_report_gives_the_back_to_back_distribution_of_the_small_problems():
    random_rows = [_row(0.8, 0.006, 1.3), _row(1.0, 0.010, 0.9), _row(2.0, 0.5)]
    env = {"gpu": "a GPU", "date": "2026-11-28", "torch": "2.11", "cupy": "14.2", "seed": 3}
    text = bench_torch._markdown([], random_rows, {}, env)
    assert "`x @ W.T` on 3 random shapes" in text and "geomean 1.17" in text  # (0.8 x 1.0 x 2.0)^(1/3)
    line = next(x for x in text.splitlines() if x.startswith("Back to back"))
    assert "the 2 of them under 50 us" in line and "min 0.90" in line and "below 0.97: 1." in line
    assert "geomean 1.08" in line  # (1.3 x 0.9)^(1/2)
    # no back-to-back line where no problem was timed so
    assert "Back to back" not in bench_torch._markdown([], [_row(1.0, 0.5)], {}, env)


def test_the_report_gives_the_first_calls_cost_and_says_whether_tuning_at_first_call_was_on():
    rows = [{**_row(1.2, 0.1), "case": "bmm", "first_call_s": t} for t in (0.04, 0.05, 1.5)]
    env = {"gpu": "a GPU", "date": "2026-12-06", "torch": "2.11", "cupy": "14.2", "seed": 31}
    off = bench_torch._markdown([], rows, {}, env)
    line = next(x for x in off.splitlines() if x.startswith("First call"))
    assert "(selection, compiles)" in line and "median 0.050 s, max 1.500 s, total 1.6 s" in line
    assert "tuning at first call on" not in off
    on = bench_torch._markdown([], rows, {}, {**env, "tune_at_first_call": True})
    assert "TF32 off in PyTorch, tuning at first call on." in on
    assert "(selection, compiles and tuning at first call)" in on
    # rows without the measurement (the fixed shapes) give no such line
    assert "First call" not in bench_torch._markdown([], [_row(1.0, 0.5)], {}, env)


def test_the_report_gives_the_back_to_back_distribution_of_the_small_batches_apart():
    bmm = [{**_row(0.74, 0.016, 1.45), "case": "bmm"}, {**_row(1.3, 0.4), "case": "bmm"}]
    env = {"gpu": "a GPU", "date": "2026-12-06", "torch": "2.11", "cupy": "14.2", "seed": 101}
    text = bench_torch._markdown([], [_row(1.0, 0.010, 0.9), *bmm], {}, env)
    lines = [x for x in text.splitlines() if x.startswith("Back to back")]
    assert len(lines) == 2  # one per group: the nt shapes', then the batches'
    assert "the 1 of them" in lines[1] and "min 1.45" in lines[1] and "below 0.97: 0." in lines[1]


def test_the_back_to_back_line_splits_by_what_autotile_ran():
    rows = [{**_row(1.0, 0.012, 0.78), "case": "bmm", "launch": "cuBLAS"},
            {**_row(1.0, 0.014, 0.84), "case": "bmm", "launch": "cuBLAS"},
            {**_row(1.1, 0.010, 1.6), "case": "bmm", "launch": "generated"},
            {**_row(1.3, 0.4), "case": "bmm", "launch": "generated"}]  # not timed back to back
    env = {"gpu": "a GPU", "date": "2026-12-06", "torch": "2.11", "cupy": "14.2", "seed": 101}
    line = next(x for x in bench_torch._markdown([], rows, {}, env).splitlines() if x.startswith("Back to back"))
    assert line.endswith("By what autotile ran: cuBLAS 2 (geomean 0.81, below 0.97: 2), generated 1 (geomean 1.60, "
                         "below 0.97: 0).")
    # one kind only, or rows that do not say: no split
    same = [{**r, "launch": "generated"} for r in rows]
    assert "By what" not in bench_torch._markdown([], same, {}, env)
    assert "By what" not in bench_torch._markdown([], [{k: v for k, v in r.items() if k != "launch"} for r in rows],
                                                  {}, env)
