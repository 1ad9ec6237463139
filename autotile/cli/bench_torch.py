"""The PyTorch benchmark: autotile on torch tensors against PyTorch on the same tensors, in one run.

    python -m autotile.cli.bench_torch [--quick] [--random N] [--random-bmm N] [--random-decode N] [--seed S]
                                       [--out DIR]

- `x @ W.T` (layout nt, PyTorch's linear layer) and `x @ W` (nn) on the benchmark shapes: autotile.matmul
  against torch.matmul (cuBLAS SGEMM/DGEMM, TF32 off), both with `out=`; with the kernels autotile
  launched for the nt call (torch.profiler: one kernel, no copy);
- batches: torch.bmm against autotile.matmul on 3-D tensors, and the wall time of autotile's first call of each
  (selection, compiles, and the tuning at first call where `AUTOTILE_TUNE_AT_FIRST_CALL` is on);
- `--random N`: N random shapes in layout nt, the distribution of the ratio;
- `--random-decode N`: N random decode-size shapes (M 1-64 against N and K of 1024-16384, an LLM's tokens
  through a projection), `x @ W.T` and `x @ W` in turn;
- the host time per call (no synchronisation) of autotile.matmul and torch.matmul on small tensors.

--dtype int8: integers drawn from all of int8, against torch._int_mm (PyTorch's int8 matmul, int32 results)
where it takes the shape (M > 16, K and N multiples of 8: the random sides are rounded up to multiples of 8),
rows it refuses left out; no batches (PyTorch has no batched int8 matmul on CUDA).

--dtype float8_e4m3fn (or float8_e5m2): values of [-4, 4) rounded to the type, per-tensor scales `SCALES`,
autotile.scaled_matmul against torch._scaled_mm (out_dtype bfloat16) where it takes the shape (A row-major
and B column-major only, so layout nt; sides multiples of 16: the random sides are rounded up to them); no
batches.

Times: CUDA events around the launch alone, L2 flushed before each repetition, median (`autotile.runtime.timing`).
Random `x @ W.T` shapes and batches of under `BACK_TO_BACK_BELOW_MS` of torch's GPU time are also timed back to
back (as a model's layer makes them: `BACK_TO_BACK_CALLS` calls enqueued with nothing between, the host's time per
call included: `autotile.cli.overhead`), where the host decides what a call costs and the GPU time alone does not.
Writes torch.md and torch.json to --out. Needs a GPU, CuPy and torch.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from autotile.cli import bench, gpu_or_error
from autotile.cli.overhead import launch_kind, time_calls, what_runs
from autotile.codegen import dtypes
from autotile.codegen.dtypes import DTYPE_NAMES
from autotile.dispatch import first_call
from autotile.library import calls as ops
from autotile.library.api import matmul, scaled_matmul
from autotile.runtime.timing import L2Flusher, relative_error, time_launch
from autotile.tuning import survey

NT_SHAPES = bench.MATMUL_SHAPES
# random problems under this much of torch's GPU time (ms) are also timed back to back, in rounds of this many
# calls (the median of BACK_TO_BACK_ROUNDS): above it the GPU's time decides back to back too
BACK_TO_BACK_BELOW_MS = 0.05
BACK_TO_BACK_CALLS, BACK_TO_BACK_ROUNDS = 30, 7
BMM_SHAPES = [(64, 512, 512, 512), (8, 2048, 2048, 2048), (32, 1024, 1024, 64), (128, 256, 256, 256)]
QUICK_NT = [(4096, 4096, 4096), (4095, 4095, 4095), (1000, 3000, 500)]


def _kernels_launched(call: Any) -> list[str]:
    """The CUDA kernels one call launches (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]  # kernels, copies and memsets


def _pair(torch_call: Any, mine_call: Any, flush: Any) -> tuple[float, float]:
    """(torch ms, autotile ms), interleaved twice so that a drift of the shared GPU hits both alike."""
    t1 = time_launch(torch_call, flush).median_ms
    m1 = time_launch(mine_call, flush).median_ms
    m2 = time_launch(mine_call, flush).median_ms
    t2 = time_launch(torch_call, flush).median_ms
    return min(t1, t2), min(m1, m2)


def _name(dtype: Any) -> str:
    """autotile's name of a torch dtype (torch.float8_e4m3fn -> "float8_e4m3fn")."""
    return str(dtype).replace("torch.", "")


def _scaled(dtype: Any) -> bool:
    return _name(dtype) in dtypes.FLOAT8_DTYPES


def _operands(torch: Any, shape: tuple[int, ...], dtype: Any, generator: Any) -> Any:
    """A random tensor: uniform in [-0.5, 0.5) for the float types, all of int8's values for int8, [-4, 4)
    rounded for the 8-bit floats."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, device="cuda", dtype=dtype, generator=generator)
    if _scaled(dtype):
        return ((torch.rand(*shape, device="cuda", generator=generator) - 0.5) * 8).to(dtype)
    return torch.rand(*shape, device="cuda", dtype=dtype, generator=generator) - 0.5


def _out_dtype(torch: Any, dtype: Any) -> Any:
    """The result's torch dtype: int32 for int8 (torch._int_mm's and autotile's contract), bfloat16 for the
    8-bit floats (torch._scaled_mm's, as the benchmark calls it), else the inputs'."""
    return getattr(torch, dtypes.get(_name(dtype)).output_name)


SCALES = (0.5, 2.0)  # the 8-bit floats' per-tensor scales, A's and B's: not 1, so that both sides apply them


def _scales(torch: Any) -> tuple[Any, Any]:
    """SCALES as one-element float32 tensors on the GPU."""
    scale_a, scale_b = SCALES
    return torch.tensor([scale_a], device="cuda"), torch.tensor([scale_b], device="cuda")


def _torch_matmul(torch: Any, dtype: Any) -> Any:
    """The call a PyTorch user makes: torch.matmul(a, b, out=), torch._int_mm(a, b) for int8,
    torch._scaled_mm(a, b, scales, out_dtype=torch.bfloat16) for the 8-bit floats."""
    if dtype == torch.int8:
        return lambda a, b, out: torch._int_mm(a, b)
    if _scaled(dtype):
        sa, sb = _scales(torch)
        return lambda a, b, out: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return lambda a, b, out: torch.matmul(a, b, out=out)


def _autotile_matmul(torch: Any, dtype: Any) -> Any:
    """The autotile call of the same product: autotile.matmul, or autotile.scaled_matmul with the same
    scales for the 8-bit floats."""
    if _scaled(dtype):
        sa, sb = _scales(torch)
        return lambda a, b, out: scaled_matmul(a, b, sa, sb, out=out)
    return lambda a, b, out: matmul(a, b, out=out)


def _reference(torch: Any, dtype: Any, a: Any, b: Any) -> Any:
    """The float64 product (scaled for the 8-bit floats)."""
    ref = a.double() @ b.double()
    return ref * math.prod(SCALES) if _scaled(dtype) else ref


def _matmul_row(shape: tuple[int, ...], layout: str, dtype: Any, flush: Any, profile: bool,
                back_to_back: bool = False) -> dict[str, Any] | None:
    """One shape's row; None where PyTorch has no call for it (torch._int_mm refuses the shape). With
    `back_to_back`, a problem of under BACK_TO_BACK_BELOW_MS of torch's GPU time is also timed back to back
    (the row's "back_to_back": torch's time per call over autotile's)."""
    import torch

    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    x, w = _operands(torch, (M, K), dtype, g), _operands(torch, (N, K), dtype, g)
    b = w.T if layout == "nt" else w.T.contiguous()
    out_dtype = _out_dtype(torch, dtype)
    out_t, out_m = torch.empty(M, N, device="cuda", dtype=out_dtype), torch.empty(M, N, device="cuda", dtype=out_dtype)
    reference_call, mine = _torch_matmul(torch, dtype), _autotile_matmul(torch, dtype)
    try:
        out_t = reference_call(x, b, out_t)
    except (RuntimeError, ValueError) as exc:  # torch._int_mm's and torch._scaled_mm's shape and layout rules
        print(f"{layout} {shape}: no PyTorch call ({' '.join(str(exc).split())[:120]})", flush=True)
        return None
    torch_ms, mine_ms = _pair(lambda: reference_call(x, b, out_t), lambda: mine(x, b, out_m), flush)
    ref = _reference(torch, dtype, x, b)
    row = {"case": f"x @ W{'.T' if layout == 'nt' else ''}", "layout": layout, "shape": list(shape),
           "torch_ms": torch_ms, "autotile_ms": mine_ms, "ratio": torch_ms / mine_ms,
           "error": relative_error(out_m.double(), ref), "torch_error": relative_error(out_t.double(), ref),
           "runs": ops.selection_for("matmul", _name(dtype), layout, shape).explain(),
           "launch": launch_kind(what_runs(("matmul", layout, shape), _name(dtype)))}
    if back_to_back and torch_ms < BACK_TO_BACK_BELOW_MS:
        row["back_to_back"] = _back_to_back_ratio(torch, lambda: reference_call(x, b, out_t), lambda: mine(x, b, out_m))
    if profile:
        row["kernels"] = _kernels_launched(lambda: mine(x, b, out_m))
    return row


def _bmm_row(shape: tuple[int, ...], dtype: Any, flush: Any, back_to_back: bool = False) -> dict[str, Any]:
    """One batch's row against torch.bmm (`back_to_back`: as `_matmul_row`'s)."""
    import torch

    B, M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    a = torch.rand(B, M, K, device="cuda", dtype=dtype, generator=g) - 0.5
    b = torch.rand(B, K, N, device="cuda", dtype=dtype, generator=g) - 0.5
    out_t, out_m = torch.empty(B, M, N, device="cuda", dtype=dtype), torch.empty(B, M, N, device="cuda", dtype=dtype)
    first_call_s = _first_call_seconds(lambda: matmul(a, b, out=out_m), torch)
    torch_ms, mine_ms = _pair(lambda: torch.bmm(a, b, out=out_t), lambda: matmul(a, b, out=out_m), flush)
    ref = a.double() @ b.double()
    row = {"case": "bmm", "layout": "nn", "shape": list(shape), "torch_ms": torch_ms, "autotile_ms": mine_ms,
           "first_call_s": first_call_s, "ratio": torch_ms / mine_ms, "error": relative_error(out_m.double(), ref),
           "torch_error": relative_error(out_t.double(), ref),
           "runs": ops.selection_for("bmm", _name(dtype), "nn", shape).explain(),
           "launch": launch_kind(what_runs(("bmm", "nn", shape), _name(dtype))),
           "kernels": _kernels_launched(lambda: matmul(a, b, out=out_m))}
    if back_to_back and torch_ms < BACK_TO_BACK_BELOW_MS:
        row["back_to_back"] = _back_to_back_ratio(torch, lambda: torch.bmm(a, b, out=out_t),
                                                  lambda: matmul(a, b, out=out_m))
    return row


def _back_to_back_ratio(torch: Any, reference: Any, mine: Any) -> float:
    """torch's time per call over autotile's, each call enqueued BACK_TO_BACK_CALLS times with nothing between
    (the host's time included), the median of BACK_TO_BACK_ROUNDS rounds."""
    timed = time_calls({"torch": reference, "autotile": mine}, torch.cuda.synchronize, BACK_TO_BACK_CALLS,
                       BACK_TO_BACK_ROUNDS)
    return float(timed["torch"][1] / timed["autotile"][1])


def _first_call_seconds(call: Any, torch: Any) -> float:
    """Seconds from the first call of a problem to its synchronised result: selection, compiles, and the
    tuning at first call where it is on (the problem's later calls prepare nothing)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def host_overhead(calls: int = 2000, dtype: Any = None) -> dict[str, float]:
    """Microseconds of host time per call on 64x64x64 torch tensors of `dtype` (default float32; no
    synchronisation), x @ W.T."""
    import torch

    dtype = dtype or torch.float32
    g = torch.Generator(device="cuda").manual_seed(64)
    x, w = _operands(torch, (64, 64), dtype, g), _operands(torch, (64, 64), dtype, g)
    out = torch.empty(64, 64, device="cuda", dtype=_out_dtype(torch, dtype))
    if _scaled(dtype):
        sa, sb = _scales(torch)
        cases = {"torch._scaled_mm(x, w.T)": lambda: torch._scaled_mm(x, w.T, scale_a=sa, scale_b=sb,
                                                                      out_dtype=torch.bfloat16),
                 "autotile.scaled_matmul(x, w.T)": lambda: scaled_matmul(x, w.T, sa, sb),
                 "autotile.scaled_matmul(x, w.T, out=)": lambda: scaled_matmul(x, w.T, sa, sb, out=out)}
    elif dtype == torch.int8:
        cases = {"torch._int_mm(x, w.T)": lambda: torch._int_mm(x, w.T),
                 "autotile.matmul(x, w.T)": lambda: matmul(x, w.T),
                 "autotile.matmul(x, w.T, out=)": lambda: matmul(x, w.T, out=out)}
    else:
        cases = {"torch.matmul(x, w.T)": lambda: torch.matmul(x, w.T),
                 "autotile.matmul(x, w.T)": lambda: matmul(x, w.T),
                 "torch.matmul(x, w.T, out=)": lambda: torch.matmul(x, w.T, out=out),
                 "autotile.matmul(x, w.T, out=)": lambda: matmul(x, w.T, out=out)}
    result: dict[str, float] = {}
    for _ in range(3):  # the best of three rounds: the host is shared too
        for name, call in cases.items():
            for _ in range(100):
                call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            elapsed = (time.perf_counter() - start) / calls * 1e6
            torch.cuda.synchronize()
            result[name] = min(result.get(name, elapsed), elapsed)
    return result


def _markdown(rows: list[dict[str, Any]], random_rows: list[dict[str, Any]], overhead: dict[str, float],
              env: dict[str, Any]) -> str:
    lines = [f"## PyTorch comparison, {env['gpu']}, {env['date']}", "",
             f"torch {env['torch']}, CuPy {env['cupy']}, TF32 off in PyTorch"
             + (", tuning at first call on" if env.get("tune_at_first_call") else "")
             + ". Ratio = torch time / autotile time "
             "(above 1: autotile faster), CUDA events, L2 flushed, median.", "",
             "| case | shape | torch ms | autotile ms | ratio | error (torch's) | kernels autotile launched |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        kernels = ", ".join(r.get("kernels", [])) or "-"
        lines.append(f"| {r['case']} | {'x'.join(map(str, r['shape']))} | {r['torch_ms']:.4f} | "
                     f"{r['autotile_ms']:.4f} | {r['ratio']:.2f} | {r['error']:.1e} ({r['torch_error']:.1e}) | "
                     f"{kernels} |")
    decode = [r for r in random_rows if r.get("group") == "decode"]
    groups = (("`x @ W.T`", "random shapes (MxNxK log-uniform)",
               [r for r in random_rows if r["case"] != "bmm" and r.get("group") != "decode"]),
              ("`torch.bmm`", "random batched problems (batch 2-256, sides 32-2048, log-uniform)",
               [r for r in random_rows if r["case"] == "bmm"]),
              ("decode-size `x @ W.T` and `x @ W`", f"random shapes of M {DECODE_RANDOM['rows'][0]}-8",
               [r for r in decode if r["shape"][0] <= 8]),
              ("decode-size `x @ W.T` and `x @ W`", f"random shapes of M 9-{DECODE_RANDOM['rows'][1]}",
               [r for r in decode if r["shape"][0] > 8]),
              ("decode-size `x @ W.T` and `x @ W`", "random shapes of under 20 us of torch's GPU time",
               [r for r in decode if r["torch_ms"] < 0.020]))
    for what, drawn, group in groups:
        if not group:
            continue
        ratios = sorted(r["ratio"] for r in group)
        q = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
        geomean = statistics.geometric_mean(ratios)
        lines += ["", f"{what} on {len(ratios)} {drawn}, seed {env['seed']}: ratio min {ratios[0]:.2f}, p10 "
                  f"{q[0]:.2f}, median {statistics.median(ratios):.2f}, geomean {geomean:.2f}, p90 {q[-1]:.2f}, "
                  f"max {ratios[-1]:.2f}; at or above 1.0: {sum(r >= 1.0 for r in ratios)}, below 0.97: "
                  f"{sum(r < 0.97 for r in ratios)}."]
        firsts = sorted(r["first_call_s"] for r in group if "first_call_s" in r)
        if firsts:
            work = "selection, compiles" + (" and tuning at first call" if env.get("tune_at_first_call") else "")
            lines += ["", f"First call of each of them ({work}), to its synchronised result: median "
                      f"{statistics.median(firsts):.3f} s, max {firsts[-1]:.3f} s, total {sum(firsts):.1f} s."]
        chained = sorted(r["back_to_back"] for r in group if "back_to_back" in r)
        if chained:
            mean = statistics.geometric_mean(chained)
            lines += ["", f"Back to back ({BACK_TO_BACK_CALLS} calls enqueued with nothing between, the host's time "
                      f"included), the {len(chained)} of them under {BACK_TO_BACK_BELOW_MS * 1000:.0f} us of torch's "
                      f"GPU time: ratio min {chained[0]:.2f}, median {statistics.median(chained):.2f}, geomean "
                      f"{mean:.2f}; at or above 1.0: {sum(r >= 1.0 for r in chained)}, below 0.97: "
                      f"{sum(r < 0.97 for r in chained)}." + _by_launch(group)]
    if overhead:
        lines += ["", "Host time per call (64x64x64, no synchronisation): "
                  + "; ".join(f"{name} {us:.1f} us" for name, us in overhead.items()) + "."]
    return "\n".join(lines) + "\n"


# Issue 28's ranges (sizes log-uniform within them), which the bmm survey covers: batch 2-256, sides 32-2048,
# batch x M x N x K at most about 0.1 TFLOP (each shape times in milliseconds).
BMM_RANDOM, BMM_RANDOM_WORK = survey.BMM_RANGE, survey.MAX_BMM_WORK


def _by_launch(group: list[dict[str, Any]]) -> str:
    """The back-to-back ratios of `group`'s rows split by the kind of launch autotile made (a cuBLAS pick costs
    the host torch's call plus autotile's lookup, a generated kernel's launch less than torch's call), as a
    sentence; empty where the rows do not say (`launch`) or all made one kind."""
    kinds: dict[str, list[float]] = {}
    for r in group:
        if "back_to_back" in r and "launch" in r:
            kinds.setdefault(r["launch"], []).append(r["back_to_back"])
    if len(kinds) < 2:
        return ""
    parts = [f"{kind} {len(ratios)} (geomean {statistics.geometric_mean(ratios):.2f}, below 0.97: "
             f"{sum(r < 0.97 for r in ratios)})" for kind, ratios in sorted(kinds.items())]
    return " By what autotile ran: " + ", ".join(parts) + "."


def random_bmm_shapes(n: int, seed: int) -> list[tuple[int, int, int, int]]:
    """`n` batched problems (batch, M, N, K), each size drawn log-uniformly from BMM_RANDOM, a draw over
    BMM_RANDOM_WORK drawn again; deterministic in (n, seed)."""
    import numpy as np

    rng = np.random.default_rng([seed, 0xB33])
    shapes: list[tuple[int, int, int, int]] = []
    while len(shapes) < n:
        (blo, bhi), (lo, hi) = BMM_RANDOM["batch"], BMM_RANDOM["side"]
        batch = int(math.exp(rng.uniform(math.log(blo), math.log(bhi + 1))))
        m, n_, k = (int(math.exp(v)) for v in rng.uniform(math.log(lo), math.log(hi + 1), size=3))
        shape = (min(batch, bhi), min(m, hi), min(n_, hi), min(k, hi))
        if math.prod(shape) <= BMM_RANDOM_WORK:
            shapes.append(shape)
    return shapes


DECODE_RANDOM = {"rows": (1, 64), "side": (1024, 16384)}  # M, and N and K: log-uniform within them


def random_decode_shapes(n: int, seed: int) -> list[tuple[int, int, int]]:
    """`n` decode-size problems (M, N, K): M log-uniform in DECODE_RANDOM's rows, N and K in its sides;
    deterministic in (n, seed), and not the survey's (which draws from its own seed)."""
    import numpy as np

    rng = np.random.default_rng([seed, 0xDEC])
    (mlo, mhi), (lo, hi) = DECODE_RANDOM["rows"], DECODE_RANDOM["side"]
    shapes = []
    for _ in range(n):
        m = int(round(math.exp(rng.uniform(math.log(mlo), math.log(mhi)))))
        n_, k = (int(round(math.exp(v))) for v in rng.uniform(math.log(lo), math.log(hi), size=2))
        shapes.append((m, n_, k))
    return shapes


def main(argv: list[str] | None = None, prog: str = "python -m autotile.cli.bench_torch") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="three nt shapes and two batches")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="also N random nt shapes")
    parser.add_argument("--random-bmm", type=int, default=0, metavar="N",
                        help="also N random batched problems (batch 2-256, sides 32-2048) against torch.bmm")
    parser.add_argument("--random-decode", type=int, default=0, metavar="N",
                        help="also N random decode-size shapes (M 1-64, N and K 1024-16384), nt and nn in turn")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random shapes")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPE_NAMES))
    parser.add_argument("--out", default="bench-results", help="folder for torch.md and torch.json")
    args = parser.parse_args(argv)
    limits = gpu_or_error(parser.prog, torch=True)
    if limits is None:
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    flush = L2Flusher(limits.l2_bytes)
    env = {**bench.environment(limits), "torch": torch.__version__, "seed": args.seed, "dtype": args.dtype,
           "tune_at_first_call": first_call.enabled()}
    # against torch._int_mm or torch._scaled_mm: PyTorch has no batched int8 or 8-bit float matmul
    integer = dtype == torch.int8 or _scaled(dtype)
    rows = []
    for shape in (QUICK_NT if args.quick else NT_SHAPES):
        for layout in ("nt", "nn"):
            found = _matmul_row(shape, layout, dtype, flush, profile=layout == "nt")
            if found is not None:
                rows.append(found)
                print(f"{layout} {shape}: {found['ratio']:.2f}x  {found['runs']}", flush=True)
    for batch_shape in () if integer else (BMM_SHAPES[:2] if args.quick else BMM_SHAPES):
        rows.append(_bmm_row(batch_shape, dtype, flush))
        print(f"bmm {batch_shape}: {rows[-1]['ratio']:.2f}x  {rows[-1]['runs']}", flush=True)
    random_rows = []
    # torch._int_mm takes K and N in multiples of 8 only, torch._scaled_mm every side in multiples of 16: the
    # random sides are rounded up to them
    multiple = 16 if _scaled(dtype) else 8 if integer else 1
    for random_shape in bench.random_shapes("matmul", args.random, args.seed, multiple) if args.random else []:
        found = _matmul_row(random_shape, "nt", dtype, flush, profile=False, back_to_back=True)
        if found is not None:
            random_rows.append(found)
            chained = f" (back to back {found['back_to_back']:.2f}x)" if "back_to_back" in found else ""
            print(f"random nt {random_shape}: {found['ratio']:.2f}x{chained}  {found['runs']}", flush=True)
    for batch_shape in () if integer else random_bmm_shapes(args.random_bmm, args.seed):
        found = _bmm_row(batch_shape, dtype, flush, back_to_back=True)
        random_rows.append(found)
        chained = f" (back to back {found['back_to_back']:.2f}x)" if "back_to_back" in found else ""
        print(f"random bmm {batch_shape}: {found['ratio']:.2f}x{chained}  {found['runs']}", flush=True)
    for i, shape in enumerate(random_decode_shapes(args.random_decode, args.seed)):
        found = _matmul_row(shape, ("nt", "nn")[i % 2], dtype, flush, profile=False, back_to_back=True)
        if found is None:
            continue
        row = {**found, "group": "decode"}
        random_rows.append(row)
        print(f"decode {row['layout']} {shape}: {row['ratio']:.2f}x (torch {row['torch_ms'] * 1e3:.1f} us)  "
              f"{row['runs']}", flush=True)
    overhead = host_overhead(dtype=dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = _markdown(rows, random_rows, overhead, env)
    (out / "torch.md").write_text(text)
    (out / "torch.json").write_text(json.dumps({"environment": env, "rows": rows, "random": random_rows,
                                                "host_overhead_us": overhead}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
