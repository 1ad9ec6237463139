"""The host's cost per library call: `python -m autotile.cli.overhead` (needs a GPU and torch).

A model calls the library back to back; a problem whose GPU work is shorter than the host's work per call
runs at the host's pace. For each entry point (matmul, matvec, bmm, `x @ W.T`, column-major gemv, and a matmul
with odd sizes that takes the padded plan's copies) this
times, on torch tensors and on CuPy arrays, the call the user would make instead (torch's, CuPy's) and
autotile's, repeated on the same arrays (and a 1024³ matmul: on an H200, float32's tf32x3 kernels that split
their operands once, three launches and a workspace a call):

- enqueue: microseconds of host time per call, without synchronising (the median over rounds of
  `--calls` calls; the GPU's queue never fills at these sizes);
- back to back: microseconds per call including the GPU's work (the same rounds, synchronised at the end),
  as a model's layer runs them; the ratio is the other call's time over autotile's (above 1: autotile
  faster).

Also an empty kernel launched through CuPy (the floor of any launch from Python). Prints one table;
`--json PATH` writes the numbers. With `--random N --seed S`, also N small problems drawn at run time
(`random_small_calls`: matmul, `x @ W.T` at 1-64 tokens, gemv both layouts, bmm; sizes log-uniform), torch's
call against autotile's on torch tensors, back to back: the distribution of the ratios, over all of them, per
kind, and per kind of launch autotile made (cuBLAS, a generated kernel, the padded plan).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from typing import Any, Callable

from autotile.cli import gpu_or_error
from autotile.runtime import torch_lookup


def time_calls(calls: dict[str, Callable[[], Any]], sync: Callable[[], None], n: int, rounds: int
          ) -> dict[str, tuple[float, float]]:
    """Per call: (enqueue, back-to-back) microseconds, medians over `rounds` rounds of `n` calls each. The
    calls take turns round by round, so a host that speeds up or slows down during the run (a shared
    machine's does) moves them alike."""
    for call in calls.values():
        for _ in range(20):
            call()
    # the steady state: a torch call's first repeats start the compiled lookup's build (seconds, once per
    # machine), during which the library's calls take the Python path
    if torch_lookup.wait(torch_lookup.BUILD_TIMEOUT_S):
        for call in calls.values():
            call()
    sync()
    enqueue: dict[str, list[float]] = {name: [] for name in calls}
    total: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(n):
                call()
            queued = time.perf_counter()
            sync()
            done = time.perf_counter()
            enqueue[name].append((queued - start) / n * 1e6)
            total[name].append((done - start) / n * 1e6)
    return {name: (statistics.median(enqueue[name]), statistics.median(total[name])) for name in calls}


Case = tuple[str, Callable[[], Any], Callable[[], Any], tuple[str, str, tuple[int, ...]]]


# the element types the benchmark takes; CuPy has no bfloat16, so that type's CuPy rows are left out
DTYPES = ("float32", "float64", "bfloat16", "float16")
CUPY_DTYPES = ("float32", "float64", "float16")


def cases(torch: Any, cupy: Any, autotile: Any, dtype: str = "float32") -> list[Case]:
    """(name, the other call, autotile's call, what autotile runs) for every entry point, on arrays of
    `dtype` (one of `DTYPES`)."""
    def t(*shape: int) -> Any:
        return (torch.rand(*shape, device="cuda") - 0.5).to(getattr(torch, dtype))

    def c(*shape: int) -> Any:
        return (cupy.random.random(shape, dtype=cupy.float32) - 0.5).astype(dtype)

    importlib.import_module("autotile.torch")  # registers torch.ops.autotile
    ops = torch.ops.autotile
    a, b, x = t(64, 64), t(64, 64), t(64)
    a3, b3 = t(8, 64, 64), t(8, 64, 64)
    w, xs = t(4096, 4096), t(16, 4096)
    gemv_a, gemv_x = t(3000, 3000).T, t(3000)  # column-major A: about 9 million elements
    odd_a, odd_b = t(2053, 2049), t(2049, 2051)  # rows not 16-byte aligned: the padded plan's copies
    big_a, big_b = t(1024, 1024), t(1024, 1024)  # float32 on an H200: the tf32x3 kernels that split once
    out = {"mm": t(64, 64), "odd": t(2053, 2051)}
    found: list[Case] = [
        ("torch matmul 64x64x64", lambda: torch.matmul(a, b), lambda: autotile.matmul(a, b),
         ("matmul", "nn", (64, 64, 64))),
        ("torch matmul 64x64x64, out=", lambda: torch.matmul(a, b, out=out["mm"]),
         lambda: autotile.matmul(a, b, out=out["mm"]), ("matmul", "nn", (64, 64, 64))),
        ("torch matvec 64x64", lambda: torch.mv(a, x), lambda: autotile.matvec(a, x), ("matvec", "row", (64, 64))),
        ("torch bmm 8 x 64x64x64", lambda: torch.bmm(a3, b3), lambda: autotile.matmul(a3, b3),
         ("bmm", "nn", (8, 64, 64, 64))),
        ("torch x @ W.T 64x64x64", lambda: torch.matmul(a, b.T), lambda: autotile.matmul(a, b.T),
         ("matmul", "nt", (64, 64, 64))),
        # the operator torch.compile's graphs call (`import autotile.torch`), against the op it replaces
        ("torch x @ W.T 64x64x64, torch.ops.autotile", lambda: torch.mm(a, b.T), lambda: ops.matmul(a, b.T),
         ("matmul", "nt", (64, 64, 64))),
        ("torch x @ W.T 16x4096x4096", lambda: torch.matmul(xs, w.T), lambda: autotile.matmul(xs, w.T),
         ("matmul", "nt", (16, 4096, 4096))),
        ("torch matmul 2053x2051x2049, out=", lambda: torch.matmul(odd_a, odd_b, out=out["odd"]),
         lambda: autotile.matmul(odd_a, odd_b, out=out["odd"]), ("matmul", "nn", (2053, 2051, 2049))),
        ("torch matmul 1024x1024x1024", lambda: torch.matmul(big_a, big_b), lambda: autotile.matmul(big_a, big_b),
         ("matmul", "nn", (1024, 1024, 1024))),
        ("torch gemv column-major 3000x3000", lambda: torch.mv(gemv_a, gemv_x),
         lambda: autotile.matvec(gemv_a, gemv_x), ("matvec", "col", (3000, 3000))),
    ]
    if dtype not in CUPY_DTYPES:
        return found
    ca, cb, cx, c_out = c(64, 64), c(64, 64), c(64), c(64, 64)
    found += [
        ("cupy matmul 64x64x64", lambda: cupy.matmul(ca, cb), lambda: autotile.matmul(ca, cb),
         ("matmul", "nn", (64, 64, 64))),
        ("cupy matmul 64x64x64, out=", lambda: cupy.matmul(ca, cb, out=c_out),
         lambda: autotile.matmul(ca, cb, out=c_out), ("matmul", "nn", (64, 64, 64))),
        ("cupy matvec 64x64", lambda: cupy.matmul(ca, cx), lambda: autotile.matvec(ca, cx),
         ("matvec", "row", (64, 64))),
    ]
    return found


SMALL_KINDS = ("matmul", "x @ W.T", "gemv row", "gemv col", "bmm")
# each kind's library problem: (kernel, layout)
SMALL_PROBLEMS = {"matmul": ("matmul", "nn"), "x @ W.T": ("matmul", "nt"), "gemv row": ("matvec", "row"),
                  "gemv col": ("matvec", "col"), "bmm": ("bmm", "nn")}


def random_small_calls(n: int, seed: int) -> list[tuple[str, tuple[int, ...]]]:
    """`n` small problems (kind, shape), the kinds in turn, sizes log-uniform: matmul M, N, K in 8-1024;
    `x @ W.T` M in 1-64, N and K in 256-4096; gemv (row- or column-major A) sides in 256-4096; bmm a batch
    of 2-32 of sides 16-256. Deterministic in (n, seed)."""
    import math
    import random

    rng = random.Random(seed)

    def draw(lo: int, hi: int) -> int:
        return int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))

    found: list[tuple[str, tuple[int, ...]]] = []
    for i in range(n):
        kind = SMALL_KINDS[i % len(SMALL_KINDS)]
        if kind == "matmul":
            shape: tuple[int, ...] = (draw(8, 1024), draw(8, 1024), draw(8, 1024))
        elif kind == "x @ W.T":
            shape = (draw(1, 64), draw(256, 4096), draw(256, 4096))
        elif kind.startswith("gemv"):
            shape = (draw(256, 4096), draw(256, 4096))
        else:
            shape = (draw(2, 32), draw(16, 256), draw(16, 256), draw(16, 256))
        found.append((kind, shape))
    return found


def _small_call(torch: Any, autotile: Any, kind: str, shape: tuple[int, ...], dtype: str = "float32"
                ) -> tuple[Any, Any]:
    """(torch's call, autotile's call) of one small problem, on random torch tensors of `dtype`."""
    def t(*dims: int) -> Any:
        return (torch.rand(*dims, device="cuda") - 0.5).to(getattr(torch, dtype))

    if kind == "matmul":
        m, n, k = shape
        a, b = t(m, k), t(k, n)
        return (lambda: torch.matmul(a, b)), (lambda: autotile.matmul(a, b))
    if kind == "x @ W.T":
        m, n, k = shape
        x, w = t(m, k), t(n, k)
        return (lambda: torch.matmul(x, w.T)), (lambda: autotile.matmul(x, w.T))
    if kind.startswith("gemv"):
        m, k = shape
        a = t(m, k) if kind == "gemv row" else t(k, m).T
        v = t(k)
        return (lambda: torch.mv(a, v)), (lambda: autotile.matvec(a, v))
    batch, m, n, k = shape
    a3, b3 = t(batch, m, k), t(batch, k, n)
    return (lambda: torch.bmm(a3, b3)), (lambda: autotile.matmul(a3, b3))


def random_small(torch: Any, autotile: Any, n: int, seed: int, rounds: int, dtype: str = "float32"
                 ) -> list[dict[str, Any]]:
    """Back-to-back microseconds per call of torch's call and autotile's on `random_small_calls(n, seed)`,
    and what autotile runs for each."""
    rows = []
    for kind, shape in random_small_calls(n, seed):
        theirs, mine = _small_call(torch, autotile, kind, shape, dtype)
        timed = time_calls({"theirs": theirs, "mine": mine}, torch.cuda.synchronize, 50, rounds)
        kernel, layout = SMALL_PROBLEMS[kind]
        rows.append({"kind": kind, "shape": list(shape), "torch_us": timed["theirs"][1],
                     "autotile_us": timed["mine"][1], "torch_enqueue_us": timed["theirs"][0],
                     "autotile_enqueue_us": timed["mine"][0], "ratio": timed["theirs"][1] / timed["mine"][1],
                     "autotile_runs": what_runs((kernel, layout, shape), dtype)})
    return rows


def launch_kind(runs: str) -> str:
    """The kind of launch a `what_runs` text names: "cuBLAS", "generated" or "padded plan"."""
    return "padded plan" if runs.startswith("the padded plan") else runs.split(" (")[0]


def small_table(rows: list[dict[str, Any]]) -> list[str]:
    """The random small problems' back-to-back ratios (torch's time / autotile's) as a markdown table: all of
    them, each kind, and each kind of launch autotile made (a cuBLAS pick costs torch's call plus the
    lookup; a generated kernel's launch costs less than torch's call)."""
    lines = ["| problems | min | p10 | median | geomean | at or above 1.0 | below 0.97 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    groups = [("all", lambda r: True)] + [(kind, lambda r, k=kind: r["kind"] == k) for kind in SMALL_KINDS]
    groups += [(f"runs {what}", lambda r, w=what: launch_kind(r["autotile_runs"]) == w)
               for what in ("cuBLAS", "generated", "padded plan")]
    for name, member in groups:
        ratios = sorted(r["ratio"] for r in rows if member(r))
        if not ratios:
            continue
        lines.append(f"| {name} ({len(ratios)}) | {ratios[0]:.2f} | {ratios[len(ratios) // 10]:.2f} | "
                     f"{statistics.median(ratios):.2f} | {statistics.geometric_mean(ratios):.2f} | "
                     f"{sum(r >= 1.0 for r in ratios)} | {sum(r < 0.97 for r in ratios)} |")
    return lines


def what_runs(problem: tuple[str, str, tuple[int, ...]], dtype: str = "float32") -> str:
    """What the library runs for a problem: cuBLAS, or a generated config (and the selection step), or the
    padded plan."""
    from autotile.dispatch import precision
    from autotile.library.calls import padded_plan, selection_for

    kernel, layout, shape = problem
    padded = padded_plan(kernel, dtype, layout, shape, precision.resolve(None))
    if padded is not None:
        return f"the padded plan ({padded.selection.source})"
    selection = selection_for(kernel, dtype, layout, shape)
    return "cuBLAS" if selection.implementation == "cublas" else f"generated ({selection.source})"


def main(argv: list[str] | None = None, prog: str = "python -m autotile.cli.overhead") -> int:
    parser = argparse.ArgumentParser(prog=prog,
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per round (default 100)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds; the median is reported (default 30)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the numbers as JSON")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="also N random small problems")
    parser.add_argument("--seed", type=int, default=1, help="the random problems' seed (default 1)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the arrays' element type (default float32; bfloat16 has no CuPy rows)")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        print(f"{parser.prog}: error: --calls and --rounds must be at least 1", file=sys.stderr)
        return 2
    if gpu_or_error(parser.prog, torch=True) is None:
        return 2
    import cupy
    import torch

    from autotile.library import api as autotile

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    sync_torch, sync_cupy = torch.cuda.synchronize, cupy.cuda.runtime.deviceSynchronize
    empty = cupy.RawKernel('extern "C" __global__ void empty() {}', "empty")
    floor = time_calls({"empty": lambda: empty((1,), (32,), ())}, sync_cupy, args.calls, args.rounds)["empty"][0]
    for name, theirs, mine, problem in cases(torch, cupy, autotile, args.dtype):
        sync = sync_torch if name.startswith("torch") else sync_cupy
        timed = time_calls({"theirs": theirs, "mine": mine}, sync, args.calls, args.rounds)
        (their_enqueue, their_total), (my_enqueue, my_total) = timed["theirs"], timed["mine"]
        rows.append({"case": name, "other_enqueue_us": their_enqueue, "autotile_enqueue_us": my_enqueue,
                     "other_us": their_total, "autotile_us": my_total, "ratio": their_total / my_total,
                     "autotile_runs": what_runs(problem, args.dtype)})
    device = torch.cuda.get_device_name()
    print(f"## Host cost per call, {args.dtype}, {device}, {time.strftime('%Y-%m-%d')} (torch {torch.__version__}, "
          f"CuPy {cupy.__version__}, TF32 off)\n")
    print(f"An empty kernel launched through CuPy: {floor:.1f} us to enqueue.\n")
    print("| call | autotile runs | enqueue: theirs us | autotile us | back to back: theirs us | autotile us | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['case']} | {r['autotile_runs']} | {r['other_enqueue_us']:.1f} | {r['autotile_enqueue_us']:.1f} | "
              f"{r['other_us']:.1f} | {r['autotile_us']:.1f} | {r['ratio']:.2f} |")
    small = (random_small(torch, autotile, args.random, args.seed, max(3, args.rounds // 3), args.dtype)
             if args.random else [])
    if small:
        print(f"\n{len(small)} random small problems (seed {args.seed}), back to back, ratio = torch's time / "
              "autotile's:\n")
        print("\n".join(small_table(small)))
        worst = sorted(small, key=lambda r: r["ratio"])[:5]
        print("\nslowest: " + ", ".join(f"{r['kind']} {'x'.join(map(str, r['shape']))} {r['ratio']:.2f}x "
                                      f"({r['torch_us']:.1f} / {r['autotile_us']:.1f} us, "
                                      f"{r['autotile_runs'].split(' (')[0]})" for r in worst))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "dtype": args.dtype, "empty_kernel_us": floor, "rows": rows,
                       "random_small": small}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
