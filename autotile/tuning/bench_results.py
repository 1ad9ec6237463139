"""Summary tables of a benchmark run, as they appear in the docs (the command: `python -m autotile.cli.report`).

Reads the JSON that `python -m autotile.cli.bench` writes (no GPU needed) and prints, per GPU, the matmul
table (cuBLAS, the best seed, autotile, errors), the matvec table (with the ratio to the measured read
bandwidth) and the nearest-shape fallback table. A `random.json` of `python -m autotile.cli.bench --random N`
gives instead the distribution of autotile's speed over random shapes (`random_markdown`): one row per
kernel, layout and GPU, all such files given together in one table. Float32 matmul rows carry the precision
setting autotile ran under ("high", "highest"; runs made before the setting existed have none): each is a
row of its own, its ratio to the cuBLAS time of the same run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _shape(row: dict[str, Any]) -> str:
    return "x".join(map(str, row["shape"]))


def _groups(rows: list[dict[str, Any]]) -> dict[tuple[str, str, tuple[int, ...]], list[dict[str, Any]]]:
    """Rows of one problem together, in the order of the run; the first row of a group is cuBLAS."""
    groups: dict[tuple[str, str, tuple[int, ...]], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["layout"], tuple(row["shape"])), []).append(row)
    return groups


def _error(row: dict[str, Any]) -> str:
    err = row.get("error")
    return "WRONG" if err is None or err != err else f"{err:.1e}"


def ratio_summary(ratios: Sequence[float]) -> dict[str, Any]:
    """Statistics of speed ratios (cuBLAS time / autotile time: above 1 autotile is faster).

    count; min, p10 (10th percentile, linear interpolation between ranks as numpy.percentile does), median,
    geomean (the mean of ratios of speeds, which a few large values do not dominate); frac_ge_1 and
    frac_ge_097, the fractions of ratios >= 1.0 and >= 0.97. An empty list gives count 0 and None for the rest.
    """
    values = np.asarray(list(ratios), dtype=np.float64)
    if values.size == 0:
        return {"count": 0, "min": None, "p10": None, "median": None, "geomean": None, "frac_ge_1": None,
                "frac_ge_097": None}
    return {"count": int(values.size), "min": float(values.min()),
            "p10": float(np.percentile(values, 10)), "median": float(np.median(values)),
            "geomean": float(np.exp(np.mean(np.log(values)))),
            "frac_ge_1": float(np.mean(values >= 1.0)), "frac_ge_097": float(np.mean(values >= 0.97))}


def random_groups(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Rows of a random-shape run by (kernel, layout, precision setting: "" where none), in the order of the
    run."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["layout"], row.get("precision") or ""), []).append(row)
    return groups


def random_markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The README's table of autotile's speed over random shapes, from the `random.json` of one or more
    runs (one per GPU, say): one row per kernel, layout, precision setting (after the dtype, where the run
    had one) and GPU. Ratios are cuBLAS time / autotile time in the same run; a shape whose result was wrong
    (either implementation) stays in the numbers and is counted in the N column, so that it never hides."""
    lines = ["| kernel | layout | GPU | N | min | p10 | median | geomean | >= 1.0x |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    notes = []
    for results in runs:
        env = results["environment"]
        notes.append(f"{env['gpu']} ({env['date']}: seed {env['seed']}, {env['n']} shapes per kernel)")
        for (kernel, layout, setting), rows in random_groups(results["rows"]).items():
            s = ratio_summary([float(r["ratio"]) for r in rows])
            wrong = sum(1 for r in rows if r["wrong"])
            count = f"{s['count']}" + (f" ({wrong} WRONG)" if wrong else "")
            lines.append(f"| {kernel} {env.get('dtype', 'float32')}{' ' + setting if setting else ''} | {layout} | "
                         f"{env['gpu']} | {count} | "
                         f"{s['min']:.2f} | {s['p10']:.2f} | {s['median']:.2f} | **{s['geomean']:.2f}** | "
                         f"{s['frac_ge_1']:.0%} |")
    return ("Speed of autotile as the library runs it (the config its selection chain picks) over random shapes, "
            "as cuBLAS time / autotile time in the same run, L2 flushed, medians: "
            + "; ".join(notes) + ".\n\n" + "\n".join(lines) + "\n")


def summary_markdown(results: dict[str, Any]) -> str:
    env, ceilings = results["environment"], results["ceilings"]
    dtype = env.get("dtype", "float32")  # runs before float64 tables existed were float32
    lines = [f"### {env['gpu']} — {env['date']}, CuPy {env['cupy']}, CUDA runtime {env['cuda_runtime']}, "
             f"driver {env['driver']}, {env['compiler']}",
             "",
             f"Measured in the same run: device-to-device copy {ceilings['copy_gbps']:,.0f} GB/s, full read "
             f"{ceilings['read_gbps']:,.0f} GB/s, FP32 peak {ceilings['fp32_peak_tflops']:.1f} TFLOP/s. Medians, "
             "L2 flushed; autotile runs the config the library picks (the shipped one tuned for the shape, "
             "`cache/`) under the float32 matmul precision setting of its row (highest: IEEE FP32 only; high: "
             "tf32x3 allowed), each row against the cuBLAS time of the same run. Errors are ||C - C64|| / ||C64|| "
             "against a float64 product of the same inputs.",
             ""]
    ordinary = [r for r in results["rows"] if "nearest" not in r["name"] and "tuned for this shape" not in r["name"]]
    groups = _groups(ordinary)

    lines += [f"| matmul {dtype} M x N x K | cuBLAS TFLOP/s | best seed TFLOP/s (x cuBLAS) | autotile TFLOP/s | "
              "autotile x cuBLAS | autotile math | precision | error cuBLAS / autotile |",
              "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for (kernel, _, _), group in groups.items():
        autotile = [r for r in group if r["name"].startswith("autotile")]
        if kernel != "matmul" or not autotile:
            continue
        cublas = group[0]
        seeds = [r for r in group if r["name"].startswith("seed")]
        best = (f"{max(r['metric'] for r in seeds) / 1e3:.1f} ({max(r['vs_cublas'] for r in seeds):.2f})"
                if seeds else "-")
        for mine in autotile:  # one per precision setting, each against the cuBLAS of this run
            found = re.search(r"\bMATH=(\w+)", mine["config"])
            math = "cuBLAS" if mine["config"] == "cuBLAS" else (found.group(1) if found else "simt")
            lines.append(f"| {_shape(mine)} | {cublas['metric'] / 1e3:.1f} | {best} | {mine['metric'] / 1e3:.1f} | "
                         f"**{mine['vs_cublas']:.2f}** | {math} | {mine.get('precision') or '-'} | "
                         f"{_error(cublas)} / {_error(mine)} |")

    lines += ["", f"| matvec {dtype} M x K | layout | cuBLAS GB/s | seed 004 GB/s | autotile GB/s | "
              "autotile x cuBLAS | autotile x read |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (kernel, layout, _), group in groups.items():
        autotile = [r for r in group if r["name"].startswith("autotile")]
        if kernel != "matvec" or not autotile:
            continue
        cublas, mine = group[0], autotile[0]
        seeds = [r for r in group if r["name"].startswith("seed")]
        seed = f"{seeds[0]['metric']:,.0f}" if seeds else "-"
        lines.append(f"| {_shape(mine)} | {layout} | {cublas['metric']:,.0f} | {seed} | {mine['metric']:,.0f} | "
                     f"**{mine['vs_cublas']:.2f}** | {mine['vs_ceiling']:.2f} |")

    fallback = _groups([r for r in results["rows"] if "nearest" in r["name"] or "tuned for this shape" in r["name"]])
    if fallback:
        lines += ["", "Fallback (shapes no shipped config was tuned for; \"tuned\" is a short tune of that very shape "
                  "in the same run):", "",
                  "| shape | config served (nearest tuned shape) | nearest x cuBLAS | tuned-for-shape x cuBLAS | "
                  "nearest / tuned speed |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for (kernel, layout, _), group in fallback.items():
            near = next(r for r in group if "nearest" in r["name"])
            tuned = next(r for r in group if "tuned for this shape" in r["name"])
            served = near["name"].removeprefix("autotile ").replace("nearest, ", "")
            label = f"{kernel} {'' if kernel == 'matmul' else layout + ' '}{_shape(near)}"
            lines.append(f"| {label} | {served} | {near['vs_cublas']:.2f} | {tuned['vs_cublas']:.2f} | "
                         f"{tuned['time_ms'] / near['time_ms']:.2f} |")

    overhead = results.get("host_overhead_us") or {}
    if overhead:
        lines += ["", "Host time per call (`--overhead`, no synchronisation): "
                  + "; ".join(f"{name} {us:.1f} us" for name, us in overhead.items()) + "."]
    return "\n".join(lines) + "\n"


def _read(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"cannot read {path}: not JSON ({exc})") from None


def _is_random(results: Any) -> bool:
    return isinstance(results, dict) and results.get("mode") == "random"


def _load(path: str, results: Any = None) -> dict[str, Any]:
    """The results in `path` (or `results`, already read from it), or ValueError with the reason in one
    line: unreadable, not JSON, or JSON that `python -m autotile.cli.bench` did not write (checked here, so the
    tables fail on no missing key)."""
    results = _read(path) if results is None else results
    what = f"{path} is not a result of python -m autotile.cli.bench"
    if not isinstance(results, dict):
        raise ValueError(f"{what}: it holds a JSON {type(results).__name__}, not an object")
    if _is_random(results):
        return _check_random(results, what)
    needs = {"environment": ("gpu", "date", "cupy", "cuda_runtime", "driver", "compiler"),
             "ceilings": ("copy_gbps", "read_gbps", "fp32_peak_tflops")}
    for section, keys in needs.items():
        if not isinstance(results.get(section), dict):
            raise ValueError(f"{what}: no {section!r} object")
        missing = [k for k in keys if k not in results[section]]
        if missing:
            raise ValueError(f"{what}: {section!r} lacks {', '.join(map(repr, missing))}")
    rows = results.get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"{what}: no 'rows' list")
    row_keys = ("kernel", "layout", "shape", "name", "time_ms", "metric", "vs_cublas", "vs_ceiling", "config")
    for i, row in enumerate(rows):
        missing = [k for k in row_keys if k not in row] if isinstance(row, dict) else list(row_keys)
        if missing:
            raise ValueError(f"{what}: row {i} lacks {', '.join(map(repr, missing))}")
    return results


def _check_random(results: dict[str, Any], what: str) -> dict[str, Any]:
    """A random.json's keys (of `python -m autotile.cli.bench --random`), checked as `_load` checks results.json."""
    env = results.get("environment")
    if not isinstance(env, dict):
        raise ValueError(f"{what}: no 'environment' object")
    missing = [k for k in ("gpu", "date", "seed", "n") if k not in env]
    if missing:
        raise ValueError(f"{what}: 'environment' lacks {', '.join(map(repr, missing))}")
    rows = results.get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"{what}: no 'rows' list")
    for i, row in enumerate(rows):
        keys = ("kernel", "layout", "shape", "ratio", "wrong")
        missing = [k for k in keys if k not in row] if isinstance(row, dict) else list(keys)
        if missing:
            raise ValueError(f"{what}: row {i} lacks {', '.join(map(repr, missing))}")
    return results
