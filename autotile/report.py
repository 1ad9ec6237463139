"""Summary tables of a benchmark run, as they appear in the README: `python -m autotile.report results.json`.

Reads the JSON that `python -m autotile.bench` writes (no GPU needed) and prints, per GPU, the matmul
table (cuBLAS, the best seed, autotile, errors), the matvec table (with the ratio to the measured read
bandwidth) and the nearest-shape fallback table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


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


def summary_markdown(results: dict[str, Any]) -> str:
    env, ceilings = results["environment"], results["ceilings"]
    lines = [f"### {env['gpu']} — {env['date']}, CuPy {env['cupy']}, CUDA runtime {env['cuda_runtime']}, "
             f"driver {env['driver']}, {env['compiler']}",
             "",
             f"Measured in the same run: device-to-device copy {ceilings['copy_gbps']:,.0f} GB/s, full read "
             f"{ceilings['read_gbps']:,.0f} GB/s, FP32 peak {ceilings['fp32_peak_tflops']:.1f} TFLOP/s. Medians, "
             "L2 flushed; autotile runs the config the library picks (the shipped one tuned for the shape, "
             "`cache/`). Errors are ||C - C64|| / ||C64|| against a float64 product of the same inputs.",
             ""]
    ordinary = [r for r in results["rows"] if "nearest" not in r["name"] and "tuned for this shape" not in r["name"]]
    groups = _groups(ordinary)

    lines += ["| matmul float32 M x N x K | cuBLAS TFLOP/s | best seed TFLOP/s (x cuBLAS) | autotile TFLOP/s | "
              "autotile x cuBLAS | autotile math | error cuBLAS / autotile |",
              "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for (kernel, _, _), group in groups.items():
        autotile = [r for r in group if r["name"].startswith("autotile")]
        if kernel != "matmul" or not autotile:
            continue
        cublas, mine = group[0], autotile[0]
        seeds = [r for r in group if r["name"].startswith("seed")]
        best = f"{max(r['metric'] for r in seeds) / 1e3:.1f} ({max(r['vs_cublas'] for r in seeds):.2f})" if seeds else "-"
        math = "tf32x3" if "MATH=tf32x3" in mine["config"] else "simt"
        lines.append(f"| {_shape(mine)} | {cublas['metric'] / 1e3:.1f} | {best} | {mine['metric'] / 1e3:.1f} | "
                     f"**{mine['vs_cublas']:.2f}** | {math} | {_error(cublas)} / {_error(mine)} |")

    lines += ["", "| matvec float32 M x K | layout | cuBLAS GB/s | seed 004 GB/s | autotile GB/s | autotile x cuBLAS | "
              "autotile x read |",
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


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: python -m autotile.report RESULTS.json [RESULTS.json ...]", file=sys.stderr)
        return 2
    for path in paths:
        try:
            results = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"autotile.report: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        print(summary_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
