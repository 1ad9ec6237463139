"""The shapes whose choice the near-rows floor rule changes, and (with a GPU) both choices timed on them.

`python tools/floor_probe.py DEVICE_DIR [--profile P] [--dtype D] [--count N] [--seed S] [--time]`: draws N
matmul shapes (M, N, K log-uniform in 16-16384, from seed S), asks the model of each shipped database of
DEVICE_DIR (for example cache/NVIDIA-H100-80GB-HBM3_sm_90; its float32 or `--dtype` matmul nn and nt
databases) for its choice under "high" with the rule (`model.FLOOR_NEAR_OCTAVES`) and without it, and prints
the shapes where the two differ, on the device profile P's limits (default h100). `--time` (needs that GPU)
then runs both choices and cuBLAS on each such shape: verified against float64 (output poisoned), CUDA
events, L2 flushed, median; x cuBLAS for each. How the rule was held out on the H200 (seed 13, 2026-11-28)
and checked on the H100 (2026-12-06).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def changed_choices(device_dir: Path, profile: str, dtype: str, count: int, seed: int) -> list[dict[str, Any]]:
    """The drawn shapes whose choice differs with and without the rule: layout, shape, both candidates'
    names and configs (None: cuBLAS), and the predicted speed-up of the choice with the rule."""
    from autotile.codegen.limits import PROFILES
    from autotile.dispatch import model as model_mod
    from autotile.dispatch.database import ShapeDatabase

    rng = np.random.default_rng(seed)
    shapes = [tuple(int(round(math.exp(v))) for v in rng.uniform(math.log(16), math.log(16384), 3))
              for _ in range(count)]
    saved = model_mod.FLOOR_NEAR_OCTAVES
    found = []
    try:
        for layout in ("nn", "nt"):
            path = device_dir / "database" / f"matmul-{dtype}-{layout}.json"
            if not path.exists():
                continue
            db = ShapeDatabase.from_json(json.loads(path.read_text()))
            model = model_mod.Model(db, PROFILES[profile], True)
            params = model_mod.params_of(db)
            for shape in shapes:
                if not model_mod._floor_from_near_rows("matmul", shape):
                    continue  # the rule does not apply
                model_mod.FLOOR_NEAR_OCTAVES = saved
                with_rule = model.choose(shape, params, setting="high")
                model_mod.FLOOR_NEAR_OCTAVES = math.inf
                without = model.choose(shape, params, setting="high")
                if with_rule and without and with_rule.candidate.name != without.candidate.name:
                    found.append({"layout": layout, "shape": shape, "predicted": with_rule.predicted,
                                  "with": (with_rule.candidate.name, with_rule.config),
                                  "without": (without.candidate.name, without.config)})
    finally:
        model_mod.FLOOR_NEAR_OCTAVES = saved
    return found


def time_both(cases: list[dict[str, Any]], dtype: str) -> None:
    """Each case's two choices and cuBLAS, verified and timed in one run; prints a row per case."""
    import cupy

    from autotile.codegen import dtypes, kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.timing import L2Flusher, relative_error, time_launch

    spec = kernels.get("matmul")
    flush = L2Flusher(cupy.cuda.Device().attributes["L2CacheSize"])
    rng = cupy.random.default_rng(1)
    print("| layout | M x N x K | with the rule | x cuBLAS | without | x cuBLAS | predicted |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    for case in cases:
        key = ProblemKey("matmul", dtype, case["layout"], tuple(case["shape"]))
        inputs = spec.make_inputs(key.shape, dtype, key.layout, rng, cupy)
        ref = spec.reference(inputs, dtype)
        out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.output_storage(dtype))
        ms: dict[str, float] = {}
        for name, config in [("cublas", None), case["with"], case["without"]]:
            if name in ms:
                continue
            runner = (Cublas() if config is None else Generated(config)).prepare(key)
            kernels.poison(out)
            runner.run(inputs, out)
            if not relative_error(out, ref) <= kernels.tolerance(dtype, key.shape[2]):
                ms[name] = math.nan  # wrong: shown as nan, never as a speed
                continue
            ms[name] = time_launch(lambda r=runner, i=inputs, o=out: r.run(i, o), flush, min_reps=5,
                                   target_ms=60.0).median_ms
        base = ms["cublas"]
        (w, _), (wo, _) = case["with"], case["without"]
        print(f"| {key.layout} | {'x'.join(map(str, key.shape))} | {w} | {base / ms[w]:.2f} | {wo} | "
              f"{base / ms[wo]:.2f} | {case['predicted']:.2f} |", flush=True)
        del inputs, ref, out
        cupy.get_default_memory_pool().free_all_blocks()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("device_dir", type=Path, help="a shipped device folder, e.g. cache/NVIDIA-H200_sm_90")
    parser.add_argument("--profile", default="h100", help="the device profile whose limits the model uses")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--time", action="store_true", help="time both choices on the GPU")
    args = parser.parse_args()
    cases = changed_choices(args.device_dir, args.profile, args.dtype, args.count, args.seed)
    for case in cases:
        print(case["layout"], "x".join(map(str, case["shape"])), case["with"][0], "instead of", case["without"][0],
              f"(predicted {case['predicted']:.2f}x)")
    if args.time and cases:
        time_both(cases, args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
