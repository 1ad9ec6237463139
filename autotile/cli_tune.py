"""The commands around tuning: `autotile tune` (needs a GPU) and `autotile cache list|show|clear`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from . import kernels
from .errors import InvalidValueError
from .tuner import SAMPLERS


def add_commands(sub: Any, add_problem_options: Callable[..., None]) -> None:
    p = sub.add_parser("tune", help="search a kernel's space on this GPU and cache the fastest config")
    p.add_argument("kernel")
    p.add_argument("--shape", required=True, help="MxNxK for matmul, MxK for matvec")
    add_problem_options(p, with_device=False)
    p.add_argument("--trials", type=int, default=100, help="candidates to compile and run (default 100)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="stop searching after this long")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--storage", default=None,
                   help="optuna storage URL, e.g. sqlite:///tune.db to resume later (default: in memory)")
    p.add_argument("--study-name", default=None)
    p.add_argument("--candidate-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a candidate silent this long is recorded as a hang and its worker replaced")
    p.add_argument("--fix", action="append", metavar="PARAM=VALUE[,VALUE...]",
                   help="narrow the space: PARAM takes only these values (repeatable)")
    p.add_argument("--no-cache", action="store_true", help="do not write the winner to the cache")
    p.set_defaults(func=cmd_tune)

    c = sub.add_parser("cache", help="list, show or clear tuned configs")
    csub = c.add_subparsers(dest="cache_command", required=True)
    q = csub.add_parser("list", help="one line per cached entry")
    q.add_argument("--device", default=None, help="only this device key")
    q.add_argument("--shipped", action="store_true", help="include the configs shipped with autotile")
    q.set_defaults(func=cmd_cache_list)
    q = csub.add_parser("show", help="print entries in full (JSON)")
    q.add_argument("kernel", nargs="?")
    q.add_argument("--device", default=None)
    q.add_argument("--shipped", action="store_true")
    q.set_defaults(func=cmd_cache_show)
    q = csub.add_parser("clear", help="delete cached entries (the shipped ones stay)")
    q.add_argument("--device", default=None)
    q.add_argument("--kernel", default=None)
    q.set_defaults(func=cmd_cache_clear)


def cmd_tune(args: argparse.Namespace) -> int:
    from .api import tune

    spec = kernels.get(args.kernel)
    shape = spec.parse_shape(args.shape)
    layout = args.layout or "row"
    if layout not in spec.space.layouts:
        raise InvalidValueError(f"{spec.name} supports layout(s) {list(spec.space.layouts)}, not {layout!r}")
    if args.trials < 1:
        raise InvalidValueError(f"--trials must be at least 1, got {args.trials}")
    fix = {}
    for item in args.fix or []:
        name, sep, values = item.partition("=")
        if not sep or not values:
            raise InvalidValueError(f"--fix {item!r} must look like PARAM=VALUE or PARAM=V1,V2")
        fix[name.strip()] = [v.strip() for v in values.split(",")]
    if fix:
        spec.space.restricted(fix)  # unknown names and values fail here, before the GPU is touched
    from .device import live_device

    live_device()  # a clear one-line error here when there is no GPU
    result = tune(args.kernel, shape, dtype=args.dtype, layout=layout, trials=args.trials, timeout=args.timeout,
                  sampler=args.sampler, seed=args.seed, storage=args.storage, study_name=args.study_name,
                  cache=None if args.no_cache else "default", progress=True,
                  candidate_timeout=args.candidate_timeout, fix=fix or None)
    print(format_result(result))
    return 0


def format_result(r: Any) -> str:
    shape = "x".join(map(str, r.shape))
    unit = r.metric_unit
    lines = [f"\n{r.kernel} {shape} {r.dtype} layout {r.layout} on {r.environment.get('gpu', '?')}",
             f"{r.trials} candidates in {r.seconds:.1f} s ({r.trials_per_second:.2f} per second); "
             f"{r.pruned} infeasible draws pruned, {r.duplicates} repeats skipped; "
             f"failures: {', '.join(f'{n} {s}' for s, n in r.failures.items()) or 'none'}",
             "",
             f"{'':<4} {'time ms':>9} {'spread':>7} {unit:>10} {'x cuBLAS':>9}  config"]
    for i, f in enumerate(r.finalists):
        m = kernels.metric(r.kernel, r.shape, r.dtype, f.median_ms)[0]
        ratio = f"{r.baseline_ms / f.median_ms:.2f}" if r.baseline_ms else "-"
        tag = "best" if f is r.best else (f.seed_name or "")
        lines.append(f"{tag[:4]:<4} {f.median_ms:>9.4f} {f.spread:>6.1%} {m:>10,.0f} {ratio:>9}  "
                     f"{f.seed_name + ': ' if f.seed_name else ''}{f.config.key()}")
    if r.baseline_ms:
        m = kernels.metric(r.kernel, r.shape, r.dtype, r.baseline_ms)[0]
        lines.append(f"{'cuBLAS':<6} {r.baseline_ms:>7.4f} {'':>7} {m:>10,.0f} {1.0:>9.2f}  cupy.matmul")
    lines.append("")
    lines.append(f"best: {r.best.median_ms:.4f} ms, {r.metric:,.0f} {unit}"
                 + (f", {r.vs_baseline:.2f}x cuBLAS" if r.vs_baseline else "")
                 + (f", {r.vs_best_seed:.2f}x the best seed ({r.best_seed.seed_name})" if r.best_seed else ""))
    return "\n".join(lines)


def _cache(args: argparse.Namespace) -> Any:
    from .cache import TuningCache

    return TuningCache()


def _report_problems(cache: Any) -> None:
    for problem in getattr(cache, "problems", []):
        print(f"autotile: warning: {problem}", file=sys.stderr)


def _entries(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The cache and its entries; unreadable files are reported on stderr (once each), not raised."""
    import warnings

    cache = _cache(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entries = cache.entries(args.device, include_shipped=args.shipped)
    _report_problems(cache)
    return cache, entries


def cmd_cache_list(args: argparse.Namespace) -> int:
    cache, entries = _entries(args)
    if not entries:
        print(f"no cached entries under {cache.root}")
        return 0
    print(f"{'device':<34} {'kernel':<7} {'dtype':<8} {'lay':<4} {'shape':<18} {'ms':>9} {'metric':>16} {'x cuBLAS':>9}")
    for path, rec in entries:
        ratio = f"{rec.baseline_ms / rec.time_ms:.2f}" if rec.baseline_ms else "-"
        print(f"{rec.device:<34} {rec.kernel:<7} {rec.dtype:<8} {rec.layout:<4} {'x'.join(map(str, rec.shape)):<18} "
              f"{rec.time_ms:>9.4f} {rec.metric:>9,.0f} {rec.metric_unit:<6} {ratio:>9}")
    return 0


def cmd_cache_show(args: argparse.Namespace) -> int:
    _, entries = _entries(args)
    for path, rec in entries:
        if args.kernel and rec.kernel != args.kernel:
            continue
        print(f"# {path}")
        print(json.dumps(rec.to_json(), indent=2))
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    n = cache.clear(args.device, args.kernel)
    print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {cache.root}")
    return 0
