"""The commands around search efficiency: `autotile sweep` (record every config of a sub-space; needs a GPU,
except with --count) and `autotile search-bench` (replay the samplers over the recorded sweeps; CPU only)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any, Callable

from autotile.codegen import kernels
from autotile.codegen.problem import ProblemKey, canonical_layout
from autotile.errors import InvalidValueError
from autotile.runtime import device as device_mod
from autotile.tuning import validate
from autotile.tuning.transfer import WARM_STARTS


def add_commands(sub: Any, add_problem_options: Callable[..., None]) -> None:
    p = sub.add_parser("sweep", help="time every feasible config of a sub-space on this GPU into a sweep file "
                                     "(resumable; --count: only count them, no GPU)")
    p.add_argument("kernel", help=f"one of {', '.join(kernels.KERNELS)}")
    p.add_argument("--shape", required=True, help="MxNxK for matmul, BATCHxMxNxK for bmm, MxK for matvec")
    p.add_argument("--vary", required=True, metavar="P1,P2,...",
                   help="the parameters that take every choice of the space")
    p.add_argument("--base", default=None, metavar="CONFIG",
                   help="the named config the other parameters take their values from (default: the built-in "
                        "default of the layout)")
    p.add_argument("--fix", action="append", metavar="PARAM=VALUE[,VALUE...]",
                   help="a parameter's values, overriding --base (repeatable)")
    add_problem_options(p, layout_default="nn (matmul, bmm), row (matvec)")
    p.add_argument("--out", default=None, help="the sweep file to write or resume (NAME.jsonl.gz)")
    p.add_argument("--count", action="store_true",
                   help="print the feasible configs per device profile (h100 and h200, or --device) and exit")
    p.add_argument("--compile-threads", type=int, default=12, help="parallel compiles on the host (default 12)")
    p.set_defaults(func=cmd_sweep)

    b = sub.add_parser("search-bench", help="replay every sampler over the recorded sweeps: how close to the "
                                            "optimum each gets in 20, 40 and 100 trials (CPU only)")
    b.add_argument("--sweeps", default=None, metavar="DIR", help="folder of sweep files (default: sweeps/)")
    b.add_argument("--samplers", default=None, metavar="S1,S2", help="samplers to compare (default: all)")
    b.add_argument("--seeds", type=int, default=20, help="seeds per sampler and sweep (default 20)")
    b.add_argument("--budgets", default="20,40,100", help="trial budgets to report (default 20,40,100)")
    b.add_argument("--jobs", type=int, default=0, help="processes (default: one per CPU core)")
    b.add_argument("--no-seeds", action="store_true",
                   help="replay without the space's named configs (seeds and starting points) first: the sampler "
                        "alone, as on a shape no named config was picked for")
    b.add_argument("--warm-starts", default=None, metavar="N",
                   help="warm starts from the shipped records a tpe replay takes (default: the tuner's, "
                        f"{WARM_STARTS}; 0: none)")
    b.add_argument("--compile-bound", action="store_true",
                   help="replay tunes that wait for their compiles throughout (a cold compile cache): the "
                        "tuner asks for batches ahead, before the results of the ones before are in")
    b.add_argument("--ahead", default=None, metavar="N",
                   help="with --compile-bound: batches asked for ahead (default: the tuner's, 1)")
    b.set_defaults(func=cmd_search_bench)


def _subspace(args: argparse.Namespace) -> tuple[ProblemKey, Any]:
    from autotile.tuning.sweep import SubSpace

    spec = kernels.get(args.kernel)
    shape = spec.parse_shape(args.shape)
    layout = canonical_layout(spec.name, args.layout or spec.space.layouts[0])
    if layout not in spec.space.layouts:
        raise InvalidValueError(f"{spec.name} supports layout(s) {list(spec.space.layouts)}, not {layout!r}")
    vary = [v.strip() for v in args.vary.split(",") if v.strip()]
    if not vary:
        raise InvalidValueError(f"--vary {args.vary!r} names no parameter")
    fix = validate.fix_items(args.fix or [], name="--fix")
    sub = SubSpace.of(spec.name, vary, base=args.base, fix=fix, layout=layout)
    return ProblemKey(spec.name, args.dtype, layout, shape), sub


def cmd_sweep(args: argparse.Namespace) -> int:
    from autotile.tuning.sweep import plan, record

    key, sub = _subspace(args)
    if args.count:
        profiles = [args.device] if args.device else ["h100", "h200"]
        for name in profiles:
            limits = device_mod.resolve(name)
            print(f"{key} on {limits.name} ({name}), varying {','.join(sub.varying)}: "
                  f"{len(plan(sub, limits, key.dtype, key.layout))} feasible configs")
        return 0
    if not args.out:
        raise InvalidValueError("--out FILE is needed to record a sweep (or --count to count its configs)")
    validate.count(args.compile_threads, name="--compile-threads", minimum=1)
    from autotile.codegen.limits import DeviceLimits
    from autotile.runtime.device import live_device
    from autotile.runtime.worker import IsolatedRunner, Setup
    from autotile.tuning.tuner import TuneOptions, Tuner

    live_device()  # one clear line where there is no GPU
    tuner = Tuner(key, TuneOptions(), space=sub.space())
    command = "autotile " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} configs, {time.monotonic() - started:.0f} s", end="", file=sys.stderr, flush=True)

    with IsolatedRunner(Setup(key, compile_threads=args.compile_threads, compile_deadline=False)) as runner:
        limits = DeviceLimits.from_json(runner.environment["limits"])
        sweep = record(args.out, sub, key, limits, runner, tuner.candidate, command=command, progress=progress)
    print(file=sys.stderr)
    statuses: dict[str, int] = {}
    for _, row in sweep.rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    print(f"{args.out}: {len(sweep.rows)} configs of {key} on {limits.name} ({statuses}); fastest "
          f"{sweep.best_ms() * 1000:.1f} us, cuBLAS {sweep.header['baseline']['median_ms'] * 1000:.1f} us")
    return 0


def cmd_search_bench(args: argparse.Namespace) -> int:
    from autotile.tuning import search_bench

    budgets = tuple(validate.count(b, name="--budgets", minimum=1) for b in args.budgets.split(","))
    validate.count(args.seeds, name="--seeds", minimum=1)
    if args.jobs < 0:
        raise InvalidValueError(f"--jobs must be 0 (one per CPU core) or a positive number of processes, "
                                f"got {args.jobs}")
    samplers = tuple(s.strip() for s in args.samplers.split(",")) if args.samplers else None
    warm_starts = WARM_STARTS if args.warm_starts is None else validate.count(args.warm_starts, name="--warm-starts",
                                                                               minimum=0)
    if args.ahead is not None and not args.compile_bound:
        raise InvalidValueError(f"--ahead {args.ahead} goes with --compile-bound (a replay that is not compile-bound "
                                "never asks ahead)")
    ahead = None if args.ahead is None else validate.count(args.ahead, name="--ahead", minimum=1)
    results = search_bench.run(args.sweeps, samplers=samplers, seeds=args.seeds, budgets=budgets,
                               jobs=args.jobs or None, named_first=not args.no_seeds, warm_starts=warm_starts,
                               compile_bound=args.compile_bound, ahead=ahead)
    print(search_bench.format_table(results, budgets))
    return 0


__all__ = ["add_commands"]
