"""One launch of a named config (or of PyTorch's own call) for Nsight Compute to profile (needs a GPU).

`python tools/ncu_launch.py NAME DTYPE [--size N] [--layout nt]` launches the named matmul config three
times on random N x N x N inputs (default 8192, layout nt); `--torch` launches PyTorch's call on the same
problem instead (torch.matmul; torch._int_mm for int8). Profile the third launch, for example the tensor
pipe's share of the cycles as docs/performance.md quotes it:

    ncu --clock-control none -k regex:autotile --launch-skip 2 --launch-count 1 \\
        --metrics gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \\
        python tools/ncu_launch.py direct-128x256-c2ps bfloat16

(`-k regex:.` with `--torch`: its launches are the inputs' two random fills, then the products.)
"""

from __future__ import annotations

import argparse

TORCH_DTYPES = ("bfloat16", "float16", "int8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/ncu_launch.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("name", help="a named matmul config (ignored with --torch)")
    parser.add_argument("dtype", help="bfloat16, float16, int8, float8_e4m3fn, float8_e5m2, float32 or float64")
    parser.add_argument("--size", type=int, default=8192, help="N of the N x N x N problem (default 8192)")
    parser.add_argument("--layout", default="nt", choices=("nn", "nt", "tn", "tt"))
    parser.add_argument("--torch", action="store_true", help=f"PyTorch's call instead ({', '.join(TORCH_DTYPES)})")
    args = parser.parse_args(argv)
    n = args.size
    if args.torch:
        import torch

        if args.dtype not in TORCH_DTYPES:
            parser.error(f"--torch takes {', '.join(TORCH_DTYPES)}, not {args.dtype}")
        if args.dtype == "int8":
            a = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
            b = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
            for _ in range(3):
                torch._int_mm(a, b.T)
        else:
            a = torch.randn(n, n, device="cuda", dtype=getattr(torch, args.dtype))
            b = torch.randn(n, n, device="cuda", dtype=getattr(torch, args.dtype))
            for _ in range(3):
                torch.matmul(a, b.T)
        torch.cuda.synchronize()
        return 0

    import cupy

    from autotile.codegen import dtypes, kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated

    spec = kernels.get("matmul")
    key = ProblemKey("matmul", args.dtype, args.layout, (n, n, n))
    inputs = spec.make_inputs(key.shape, args.dtype, args.layout, cupy.random.default_rng(1), cupy)
    result = dtypes.get(args.dtype).output_name
    storage = dtypes.DTYPES[result].storage if result in dtypes.DTYPES else result  # int8's products: int32
    out = cupy.empty(spec.output_shape(key.shape), dtype=storage)
    runner = Generated(spec.space.named(args.name)).prepare(key)
    for _ in range(3):
        runner.run(inputs, out)
    cupy.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
