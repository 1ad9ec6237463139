"""The overhead benchmark's random small problems (autotile/cli/overhead.py), without a GPU."""

from __future__ import annotations

from autotile.cli import overhead


def test_random_small_calls_are_deterministic_and_in_their_ranges():
    calls = overhead.random_small_calls(50, 3)
    assert calls == overhead.random_small_calls(50, 3) != overhead.random_small_calls(50, 4)
    assert [kind for kind, _ in calls[:5]] == list(overhead.SMALL_KINDS)
    for kind, shape in calls:
        if kind == "matmul":
            assert len(shape) == 3 and all(8 <= d <= 1024 for d in shape)
        elif kind == "x @ W.T":
            assert 1 <= shape[0] <= 64 and all(256 <= d <= 4096 for d in shape[1:])
        elif kind.startswith("gemv"):
            assert len(shape) == 2 and all(256 <= d <= 4096 for d in shape)
        else:
            assert kind == "bmm" and 2 <= shape[0] <= 32 and all(16 <= d <= 256 for d in shape[1:])


def test_every_small_kind_names_the_library_problem_it_times():
    from autotile.codegen.problem import ProblemKey

    assert set(overhead.SMALL_PROBLEMS) == set(overhead.SMALL_KINDS)
    for kind, shape in overhead.random_small_calls(10, 1):
        kernel, layout = overhead.SMALL_PROBLEMS[kind]
        ProblemKey(kernel, "float32", layout, shape)  # a valid problem of that shape


def test_the_small_problems_table_splits_by_kind_and_by_what_autotile_ran():
    from autotile.cli.overhead import small_table

    rows = [{"kind": "bmm", "ratio": 0.76, "autotile_runs": "cuBLAS"},
            {"kind": "bmm", "ratio": 1.5, "autotile_runs": "generated (model (665 surveyed shapes))"},
            {"kind": "matmul", "ratio": 1.2, "autotile_runs": "generated (exact)"},
            {"kind": "matmul", "ratio": 0.9, "autotile_runs": "the padded plan (model (615 surveyed shapes))"}]
    lines = small_table(rows)
    assert lines[2].startswith("| all (4) | 0.76 |")
    by_name = {line.split(" (")[0].lstrip("| "): line for line in lines[2:]}
    # no rows for the kinds without problems
    assert set(by_name) == {"all", "matmul", "bmm", "runs cuBLAS", "runs generated", "runs padded plan"}
    assert by_name["runs cuBLAS"] == "| runs cuBLAS (1) | 0.76 | 0.76 | 0.76 | 0.76 | 0 | 1 |"
    assert by_name["runs generated"].startswith("| runs generated (2) | 1.20 | 1.20 | 1.35 |")
    assert by_name["runs padded plan"].endswith("| 0 | 1 |")
