"""Re-time the shipped tuned records of this GPU after a change to the kernels or to the compile options.

    python tools/retime.py [--cache cache] [--out DIR] [--rounds 3]

A template change that alters a config's source retires its record (the selection only trusts a record
whose `source_sha` is today's); so does a change of compile options (the record is then a fallback). Where
the change is not meant to change which config is best (issue 11's FP32 semantics: same tiles, same
pipeline), re-tuning every shipped shape is not needed to keep the shipped configs, but their timing must
be redone with the new kernel: for each record of this GPU, its config is verified against float64
(output poisoned), then timed with cuBLAS in the same run (CUDA events, L2 flushed, median of `--rounds`
interleaved rounds), and the record is written with the new times, hashes and options; the old ones are
kept under `environment.retimed_from`. cuBLAS runs where it is now faster (`implementation`), as after a
tuning. A record whose config fails verification is reported and left as it was. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=str(ROOT / "cache"), help="the shipped cache folder")
    parser.add_argument("--out", default=None, help="where to write the re-timed records (default: in place)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import cupy

    from autotile.cli import bench
    from autotile.codegen import build, kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.record import Record
    from autotile.runtime import timing
    from autotile.runtime.device import live_device
    from autotile.runtime.impl import Cublas, Generated

    device = live_device()
    folder = Path(args.cache) / device.fingerprint
    out_dir = Path(args.out) if args.out else folder
    out_dir.mkdir(parents=True, exist_ok=True)
    env_now = bench.environment(device)
    flush = timing.L2Flusher(cupy.cuda.Device().attributes["L2CacheSize"])
    rng = cupy.random.default_rng(20261122)
    print(f"{device.name}: re-timing {folder}", flush=True)
    for path in sorted(folder.glob("*.json")):
        old = Record.from_json(json.loads(path.read_text()))
        spec = kernels.get(old.kernel)
        key = ProblemKey(old.kernel, old.dtype, old.layout, tuple(old.shape))
        config = spec.space.config(old.config)
        source = spec.render(config, old.dtype, old.layout)
        runner, cublas = Generated(config, source).prepare(key), Cublas().prepare(key)
        inputs = spec.make_inputs(key.shape, key.dtype, key.layout, rng, cupy)
        out = cupy.full(spec.output_shape(key.shape), cupy.nan, dtype=key.dtype)
        runner.run(inputs, out)
        error = timing.relative_error(out, spec.reference(inputs))
        tolerance = kernels.tolerance(key.dtype, key.shape[-1])
        if not error <= tolerance:
            print(f"  {path.name}: error {error:.3g} > {tolerance:.3g}; left as it was", flush=True)
            continue
        ours: list[float] = []
        theirs: list[float] = []
        spreads: list[float] = []
        for _ in range(args.rounds):
            t = timing.time_launch(lambda r=runner, i=inputs, o=out: r.run(i, o), flush)
            ours.append(t.median_ms)
            spreads.append(t.spread)
            theirs.append(timing.time_launch(lambda c=cublas, i=inputs, o=out: c.run(i, o), flush).median_ms)
        time_ms, baseline_ms = statistics.median(ours), statistics.median(theirs)
        metric, unit = kernels.metric(key.kernel, key.shape, key.dtype, time_ms)
        env = dict(old.environment)
        env["retimed_from"] = {k: old.environment.get(k) for k in ("source_sha", "compiler", "compile_options", "date")}
        env["retimed_from"].update(time_ms=old.time_ms, baseline_ms=old.baseline_ms)
        env.update({k: env_now[k] for k in ("date", "driver", "cuda_runtime", "cupy", "compiler")})
        env.update(source_sha=kernels.source_hash(source), compile_options=list(build.COMPILE_OPTIONS),
                   spread_rounds_ms=ours, retimed=time.strftime("%Y-%m-%d"))
        env.pop("restamped_from", None)
        record = Record(kernel=old.kernel, dtype=old.dtype, layout=old.layout, shape=old.shape, compat=old.compat,
                        config=dict(old.config), time_ms=time_ms, spread=statistics.median(spreads), metric=metric,
                        metric_unit=unit, baseline_ms=baseline_ms, device=old.device, environment=env,
                        implementation="cublas" if baseline_ms < time_ms else "generated")
        (out_dir / path.name).write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
        print(f"  {'x'.join(map(str, key.shape)):>16} {key.kernel} {key.layout}: "
              f"{old.time_ms:.4f} -> {time_ms:.4f} ms, cuBLAS {baseline_ms:.4f} ms ({baseline_ms / time_ms:.2f}x), "
              f"runs {record.implementation}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
