"""The emulation benchmark, `python -m autotile.cli.bench_emulation` (needs a GPU): float64 and float32
matmul emulated on the int8 tensor cores (precision="emulated") against cuBLAS (DGEMM, SGEMM) and, for
float32, autotile's own tf32x3 kernels ("high"), in one run: time (CUDA events, L2 flushed, median), the
phases of the emulation, whether the library's rule (`autotile.library.emulation.pays`) picks it, and the
error of each against the exact product on sampled elements (each product split exactly, the sum
correctly rounded by `math.fsum`), on three kinds of inputs: normal (standard normal), wide ((u - 1/2)
e^(2 z): exponents spread over tens of binades within each row) and cancelling (A = [X X],
B = [Y; -Y (1 + 1e-6 Z)]: every C_ij a million times smaller than (|A||B|)_ij).

Writes a Markdown table (`emulation.md`) and the rows as JSON (`emulation.json`) in `--out`."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib
from typing import Any

import numpy as np

from autotile.cli import gpu_or_error

KINDS = ("normal", "wide", "cancel")
PHASES = ("statistics", "residues", "int8 products", "rebuild", "fix-up")
BACK_TO_BACK = 10  # calls timed back to back, between two events


def _inputs(cupy: Any, kind: str, shape: tuple[int, int, int], dtype: str, seed: int) -> tuple[Any, Any]:
    m, n, k = shape
    g = cupy.random.default_rng(seed)
    if kind == "normal":
        a, b = g.standard_normal((m, k)), g.standard_normal((k, n))
    elif kind == "wide":
        a = (g.random((m, k)) - 0.5) * cupy.exp(2 * g.standard_normal((m, k)))
        b = (g.random((k, n)) - 0.5) * cupy.exp(2 * g.standard_normal((k, n)))
    else:
        half = k // 2
        x, y = g.standard_normal((m, half)), g.standard_normal((half, n))
        a = cupy.concatenate([x, x, g.standard_normal((m, k - 2 * half))], axis=1)
        b = cupy.concatenate([y, -y * (1 + 1e-6 * g.standard_normal((half, n))),
                              g.standard_normal((k - 2 * half, n)) * 1e-6], axis=0)
    return a.astype(dtype), b.astype(dtype)


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p + e == a b exactly (Dekker's product; no overflow in these inputs)."""
    p = a * b

    def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = 134217729.0 * x  # 2^27 + 1
        hi = c - (c - x)
        return hi, x - hi

    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def sampled_errors(outs: list[Any], a: Any, b: Any, samples: int, seed: int) -> list[float]:
    """For each output: ||out - C|| / ||C|| over `samples` random elements, C exact (rounded once)."""
    import cupy

    m, n = outs[0].shape
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, m, samples), rng.integers(0, n, samples)
    a_rows = cupy.asnumpy(a[cupy.asarray(rows), :]).astype(np.float64)
    b_cols = cupy.asnumpy(b[:, cupy.asarray(cols)]).astype(np.float64).T
    exact = np.array([math.fsum(np.concatenate(_two_product(a_rows[t], b_cols[t]))) for t in range(samples)])
    norm = float(np.linalg.norm(exact))
    errors = []
    for out in outs:
        got = cupy.asnumpy(out[cupy.asarray(rows), cupy.asarray(cols)]).astype(np.float64)
        errors.append(float(np.linalg.norm(got - exact)) / norm)
    return errors


def bench_case(shape: tuple[int, int, int], dtype: str, kind: str, flush: Any, samples: int = 64,
               seed: int = 0, bits: int | None = None, residue_epilogue: bool | None = None,
               batched_products: bool | None = None,
               int8_config: str | None = None, fewer_moduli: bool | None = None,
               sampled_magnitudes: bool | None = None) -> dict[str, Any]:
    """One problem: times (ms), the emulation's phases (ms), the errors, the rule's choice. `int8_config`: a
    named int8 matmul config the products run instead of the library's selection."""
    import cupy

    from autotile.library import calls, emulation
    from autotile.library.api import matmul
    from autotile.library.plan import plan_matmul
    from autotile.runtime.operands import as_framework, framework_by_type
    from autotile.runtime.timing import back_to_back_ms, time_launch

    m, n, k = shape
    a, b = _inputs(cupy, kind, shape, dtype, seed)
    framework = framework_by_type(a, b)
    op_a, op_b = as_framework(framework, a, "A"), as_framework(framework, b, "B")
    plan = plan_matmul(op_a.shape, op_a.strides, op_b.shape, op_b.strides)
    emulated, native = cupy.empty((m, n), dtype), cupy.empty((m, n), dtype)
    op_c = as_framework(framework, emulated, "out")
    gemm = calls._int8_gemm(framework, op_a.device) if int8_config is None else _forced_gemm(framework, int8_config)

    def emulate(events: list[Any] | None = None, report: dict[str, int] | None = None) -> None:
        stream = cupy.cuda.get_current_stream().ptr
        emulation.run(framework, op_a, op_b, op_c, plan.layout, shape, stream, gemm, events, report, bits,
                      residue_epilogue, batched_products, fewer_moduli, sampled_magnitudes)

    t_emulated = time_launch(emulate, flush, min_reps=5, target_ms=300.0).median_ms
    events: list[Any] = []
    guard: dict[str, int] = {}
    emulate(events, guard)
    phases = [cupy.cuda.get_elapsed_time(s, e) for s, e in zip(events, events[1:], strict=False)]
    t_back_to_back = back_to_back_ms(emulate, BACK_TO_BACK)  # as a model's layers run it: no flush
    t_native = time_launch(lambda: cupy.matmul(a, b, out=native), flush, min_reps=5, target_ms=300.0).median_ms
    outs = [emulated, native]
    row: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "inputs": kind, "emulated_ms": t_emulated,
                           "back_to_back_ms": t_back_to_back,
                           "cublas_ms": t_native, "phases_ms": dict(zip(PHASES, phases, strict=True)),
                           "picked": calls.emulation_pays("matmul", dtype, plan.layout, shape, op_a.device),
                           "guard": guard,
                           **_scheme_ran(dtype, shape[2], bits, guard),
                           "int8_kernel": gemm((m, emulation.aligned_n(n), emulation.aligned_k(k)))
                           .prepared.selection.explain()}
    if dtype == "float32":
        high = cupy.empty((m, n), dtype)
        row["high_ms"] = time_launch(lambda: matmul(a, b, out=high, precision="high"), flush,
                                     min_reps=5, target_ms=300.0).median_ms
        outs.append(high)
    errors = sampled_errors(outs, a, b, samples, seed + 1)
    row["emulated_error"], row["cublas_error"] = errors[0], errors[1]
    if dtype == "float32":
        row["high_error"] = errors[2]
    row["speedup"] = t_native / t_emulated
    return row


def _scheme_ran(dtype: str, k: int, bits: int | None, guard: dict[str, int]) -> dict[str, int]:
    """The moduli and beta the call ran with: the type's scheme, or its scheme of one modulus fewer where the
    call chose it (`guard`: `emulation.run`'s report)."""
    from autotile.codegen.emulation import fewer, scheme

    s = scheme(dtype, k, bits)
    f = fewer(s) if guard.get("fewer_moduli") else None
    ran = s if f is None else f
    return {"moduli": ran.count, "beta": ran.beta}


def _forced_gemm(framework: Any, name: str) -> Any:
    """What `calls._int8_gemm` gives, running the named int8 config ("cublas": cuBLAS's int8 GEMM) on every
    shape (prepared once per shape)."""
    import cupy

    from autotile.codegen import kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import Selection
    from autotile.library import calls
    from autotile.runtime.cublas import CublasCall
    from autotile.runtime.impl import Cublas, Generated

    config = None if name == "cublas" else kernels.get("matmul").space.named(name)
    prepared: dict[tuple[int, int, int], Any] = {}

    def gemm(shape: tuple[int, int, int]) -> Any:
        if shape not in prepared:
            key = ProblemKey("matmul", "int8", "nt", shape)
            if config is None:  # cuBLAS's int8 GEMM, called on pointers as the library calls it
                selection = Selection(None, "forced (--int8-config)", None, None, "cublas")
                runner = Cublas().prepare(key)
                direct = CublasCall(key, cupy.cuda.Device().id)
                made = calls._Prepared(runner, selection, direct=direct)
            else:
                forced = Selection(config, "forced (--int8-config)", None)
                made = calls._Prepared(Generated(config).prepare(key), forced)
            prepared[shape] = calls._Int8Products(made, shape, framework.allocate)
        return prepared[shape]

    return gemm


def random_shapes(count: int, seed: int, low: int = 1024, high: int = 16384,
                  multiple: int = 1) -> list[tuple[int, int, int]]:
    """`count` shapes, each side log-uniform in [low, high], drawn at run time from `seed`, then rounded up to
    a multiple of `multiple` (the sizes frameworks pad to)."""
    rng = np.random.default_rng(seed)
    sides = -(-np.exp(rng.uniform(math.log(low), math.log(high), (count, 3))).astype(int) // multiple) * multiple
    return [(int(x), int(y), int(z)) for x, y, z in sides]


def markdown(rows: list[dict[str, Any]], device: str) -> str:
    lines = [f"Emulated matmul (precision=\"emulated\") on {device}: time in ms (CUDA events, L2 flushed, median), "
             "speedup = cuBLAS time / emulated time, errors ||C - exact|| / ||exact|| on sampled elements.", "",
             "| dtype | M x N x K | inputs | moduli, beta | emulated | back to back | cuBLAS | speedup | picked | "
             "autotile high | error emulated | error cuBLAS | error high | "
             "phases (stats, residues, int8, rebuild, fix-up) | guard failed (runs of 32, whole tiles) | "
             "int8 residue epilogue | int8 products in one call | int8 products |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- |"]
    for r in rows:
        phases = ", ".join(f"{v:.2f}" for v in r["phases_ms"].values())
        high = f"{r['high_ms']:.2f}" if "high_ms" in r else "-"
        high_err = f"{r['high_error']:.1e}" if "high_error" in r else "-"
        lines.append(f"| {r['dtype']} | {'x'.join(map(str, r['shape']))} | {r['inputs']} | "
                     f"{r['moduli']}, {r['beta']} | {r['emulated_ms']:.2f} | "
                     f"{r.get('back_to_back_ms', math.nan):.2f} | "
                     f"{r['cublas_ms']:.2f} | {r['speedup']:.2f}x | {'yes' if r['picked'] else 'no'} | {high} | "
                     f"{r['emulated_error']:.1e} | {r['cublas_error']:.1e} | {high_err} | {phases} | "
                     f"{r['guard']['failed_runs']}, {r['guard']['whole_tiles']} of {r['guard']['tiles']} | "
                     f"{'yes' if r['guard'].get('residue_epilogue') else 'no'} | "
                     f"{'yes' if r['guard'].get('batched_products') else 'no'} | {r.get('int8_kernel', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, prog: str = "python -m autotile.cli.bench_emulation") -> int:
    parser = argparse.ArgumentParser(prog=prog,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    parser.add_argument("--sizes", nargs="*", type=int, default=[4096, 8192, 16384], help="square problems n^3")
    parser.add_argument("--inputs", nargs="+", default=["normal"], choices=list(KINDS))
    parser.add_argument("--random", type=int, default=0, metavar="N", help="also N random shapes (normal inputs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bits", type=int, default=None,
                        help="bits each scaled operand keeps (default: the type's mantissa, 53 or 24)")
    parser.add_argument("--residue-epilogue", nargs="+", choices=["on", "off"], default=None,
                        help="time the int8 products leaving as int8 residues (on), as int32 sums (off), or both "
                             "(default: the library's setting, autotile.library.emulation.RESIDUE_EPILOGUE)")
    parser.add_argument("--batched-products", nargs="+", choices=["on", "off"], default=None,
                        help="time the int8 products as one batched call (on: cuBLAS's batched GEMM where cuBLAS "
                             "runs them, the same kernel batched where a generated one does), one call each (off), "
                             "or both (default: the library's setting, autotile.library.emulation.BATCHED_PRODUCTS)")
    parser.add_argument("--fewer-moduli", nargs="+", choices=["on", "off"], default=None,
                        help="let the call choose one modulus fewer where its inputs allow (on), never (off), or "
                             "time both (default: the library's setting, autotile.library.emulation.FEWER_MODULI)")
    parser.add_argument("--sampled-magnitudes", nargs="+", choices=["on", "off"], default=None,
                        help="the guard's magnitudes over every fourth element of K first (on), the full product "
                             "always (off), or both (default: autotile.library.emulation.SAMPLED_MAGNITUDES)")
    parser.add_argument("--int8-config", nargs="+", default=None, metavar="NAME",
                        help="named int8 matmul configs the products run instead of the library's selection "
                             "('library': the selection; 'cublas': cuBLAS's int8 GEMM), each timed")
    parser.add_argument("--multiple", type=int, default=1, metavar="Q",
                        help="round every side of the random shapes up to a multiple of Q")
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    if gpu_or_error(parser.prog) is None:
        return 2
    import cupy

    from autotile.runtime.timing import L2Flusher

    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    flush = L2Flusher(int(cupy.cuda.Device().attributes["L2CacheSize"]))
    cases = [((s, s, s), d, kind) for d in args.dtype for s in args.sizes for kind in args.inputs]
    drawn = random_shapes(args.random, args.seed, multiple=args.multiple)
    cases += [(shape, d, "normal") for d in args.dtype for shape in drawn]
    epilogues = [None] if args.residue_epilogue is None else [v == "on" for v in args.residue_epilogue]
    batching = [None] if args.batched_products is None else [v == "on" for v in args.batched_products]
    configs = [None if name == "library" else name for name in args.int8_config or ["library"]]
    fewer = [None] if args.fewer_moduli is None else [v == "on" for v in args.fewer_moduli]
    sampling = [None] if args.sampled_magnitudes is None else [v == "on" for v in args.sampled_magnitudes]
    rows = []
    for (shape, dtype, kind), epilogue, batched, config, fewer_moduli, sampled in itertools.product(
            cases, epilogues, batching, configs, fewer, sampling):
        rows.append(bench_case(shape, dtype, kind, flush, seed=args.seed, bits=args.bits, residue_epilogue=epilogue,
                               batched_products=batched, int8_config=config, fewer_moduli=fewer_moduli,
                               sampled_magnitudes=sampled))
        print(json.dumps(rows[-1]), flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "emulation.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    table = markdown(rows, device)
    (out / "emulation.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
