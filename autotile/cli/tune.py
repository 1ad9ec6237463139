"""The commands around tuning: `autotile tune` (needs a GPU) and `autotile cache list|show|clear|compile`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from autotile.codegen import kernels
from autotile.codegen.dtypes import TENSOR_CORE_DTYPES
from autotile.codegen.problem import LAYOUT_ALIASES
from autotile.dispatch import precision
from autotile.errors import DeviceUnavailableError, InvalidValueError
from autotile.tuning import validate
from autotile.tuning.transfer import WARM_STARTS
from autotile.tuning.tuner import SAMPLERS


def add_commands(sub: Any, add_problem_options: Callable[..., None]) -> None:
    p = sub.add_parser("tune", help="search a kernel's space on this GPU and cache the fastest config")
    p.add_argument("kernel", help=f"one of {', '.join(kernels.KERNELS)}")
    p.add_argument("--shape", required=True, help="MxNxK for matmul, BATCHxMxNxK for bmm, MxK for matvec")
    add_problem_options(p, with_device=False, layout_default="nn (matmul, bmm), row (matvec)")
    p.add_argument("--trials", type=int, default=100, help="candidates to compile and run (default 100)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop drawing candidates, and waiting for compiles, after this long (default: no limit)")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe",
                   help="optuna sampler that draws the candidates (default tpe; grid walks the space in order)")
    p.add_argument("--seed", type=int, default=0,
                   help=f"seed of the sampler and of the inputs, 0..{validate.SEED_MAX} (default 0)")
    p.add_argument("--warm-starts", type=int, default=WARM_STARTS, metavar="N",
                   help=f"tpe: run N configs of other shapes and GPUs (the dispatch portfolio's and the cache's) "
                        f"after the seeds (default {WARM_STARTS}; 0: none)")
    p.add_argument("--storage", default=None,
                   help="optuna storage URL, e.g. sqlite:///tune.db to resume later (default: in memory)")
    p.add_argument("--study-name", default=None,
                   help="the study to create or, in --storage, resume (default: KERNEL-DTYPE-LAYOUT-SHAPE-DEVICE, "
                        "and -highest under --precision highest)")
    p.add_argument("--candidate-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a candidate silent this long is recorded as a hang and its worker replaced (default 60)")
    p.add_argument("--fix", action="append", metavar="PARAM=VALUE[,VALUE...]",
                   help="narrow the space: PARAM takes only these values (repeatable)")
    # Read as text and checked by validate.precision: argparse's own error for a bad choice is two lines.
    p.add_argument("--precision", default=None, metavar="{highest,high,medium}",
                   help="float32 matmul precision the winner must run under: highest searches IEEE FP32 (SIMT) "
                        "configs only, high and medium the FP32-level tf32x3 tensor-core configs too, emulated as "
                        "high (the int8 emulation is a library path, not tuned) (default: the process default, "
                        "$AUTOTILE_FLOAT32_MATMUL_PRECISION, else high)")
    p.add_argument("--no-cache", action="store_true", help="do not write the winner to the cache")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="write the study's report (plots and index.html; needs the report extra) to DIR at the end")
    add_scale_options(p)
    p.set_defaults(func=cmd_tune)

    b = sub.add_parser("batch", help="tune every problem of a YAML or CSV list, spread over GPUs (resumable)")
    b.add_argument("file", help="problems: YAML list of {kernel, shape, dtype, layout, trials} or CSV with that header")
    b.add_argument("--trials", type=int, default=100, help="trials per problem without its own (default 100)")
    b.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per problem: stop drawing candidates, and waiting for compiles, after this long "
                        "(default: no limit)")
    b.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="optuna sampler (default tpe)")
    b.add_argument("--seed", type=int, default=0, help=f"sampler and input seed, 0..{validate.SEED_MAX} (default 0)")
    b.add_argument("--storage", default=None,
                   help="where the batch and its problems' studies live: journal:PATH or a database URL "
                        "(default: a journal file under the cache root, named after the list)")
    b.add_argument("--study-name", default=None, help="the batch study's name (default: from the list and GPU)")
    b.add_argument("--candidate-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a candidate silent this long is recorded as a hang (default 60)")
    b.add_argument("--precision", default=None, metavar="{highest,high,medium}",
                   help="float32 matmul precision the winners must run under (default: high)")
    b.add_argument("--no-cache", action="store_true", help="do not write the winners to the cache")
    b.add_argument("--survey", action="store_true",
                   help="then rebuild the shape database of this GPU (autotile survey) for the kernels listed")
    b.add_argument("--shortlist", action="store_true",
                   help="instead of an optuna search per problem, time the shape database's short list of verified "
                        "candidates and cuBLAS, as tuning at first call does (seconds per problem; this process, "
                        "the current GPU; resumes by skipping problems tuned before)")
    add_scale_options(b)
    b.set_defaults(func=cmd_batch)

    c = sub.add_parser("cache", help="list, show or clear tuned configs; compile kernels ahead")
    csub = c.add_subparsers(dest="cache_command", required=True)
    device_help = "only this device key (as `autotile cache list` shows it)"
    q = csub.add_parser("list", help="one line per cached entry")
    q.add_argument("--device", default=None, help=device_help)
    q.add_argument("--shipped", action="store_true", help="include the configs shipped with autotile")
    q.set_defaults(func=cmd_cache_list)
    q = csub.add_parser("show", help="print entries in full (JSON)")
    q.add_argument("kernel", nargs="?", help=f"only this kernel ({', '.join(kernels.KERNELS)})")
    q.add_argument("--device", default=None, help=device_help)
    q.add_argument("--shipped", action="store_true", help="include the configs shipped with autotile")
    q.set_defaults(func=cmd_cache_show)
    q = csub.add_parser("clear", help="delete cached entries (the shipped ones stay)")
    q.add_argument("--device", default=None, help=device_help)
    q.add_argument("--kernel", default=None, help=f"only this kernel ({', '.join(kernels.KERNELS)})")
    q.add_argument("--compiled", action="store_true",
                   help="delete the compiled kernels instead (the compile cache; tuned configs stay)")
    q.set_defaults(func=cmd_cache_clear)
    q = csub.add_parser("compile", help="compile ahead, on the host (no GPU needed), the kernels a first tune or "
                                        "call starts with: each space's named configs and the shape database's "
                                        "candidates, into the compile cache; and, where torch is installed, the "
                                        "compiled lookup of repeated torch calls")
    q.add_argument("--device", default=None, metavar="PROFILE",
                   help="the GPU to compile for: an offline profile (h100, h200, a100...); default: the live GPU")
    q.add_argument("--kernel", action="append", default=None,
                   help=f"only this kernel ({', '.join(kernels.KERNELS)}; repeatable; default: all)")
    q.add_argument("--dtype", action="append", default=None, help="only this element type (repeatable; default: all)")
    q.add_argument("--layout", action="append", default=None, help="only this layout (repeatable; default: all)")
    q.add_argument("--shape", action="append", default=None,
                   help="also the configs as a tune of this shape runs them, fitted with a K split where their "
                        "tiles leave SMs idle (MxNxK for matmul, BATCHxMxNxK for bmm, MxK for matvec; repeatable)")
    q.add_argument("--threads", type=int, default=None,
                   help="parallel compiles (default: one per host core, at most 16)")
    q.set_defaults(func=cmd_cache_compile)


def add_scale_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", default=None, metavar="0,1,...|all",
                   help="one worker process per GPU listed, on one study (default: this process, on GPU 0); "
                        "without --storage the study is a journal file under the cache root")
    p.add_argument("--heartbeat-grace", type=float, default=60.0, metavar="SECONDS",
                   help="a trial whose worker (on another host) sent no heartbeat this long is failed and its "
                        "config run by another worker (default 60; a dead worker on this host is seen at once)")
    # Test support: what the workers time with, as MODULE:ATTRIBUTE (autotile.tuning.testing:ReplayBackend).
    p.add_argument("--backend", default=None, help=argparse.SUPPRESS)


def cmd_tune(args: argparse.Namespace) -> int:
    from autotile.tuning.api import tune

    spec = kernels.get(args.kernel)
    shape = spec.parse_shape(args.shape)
    layout = args.layout or spec.space.layouts[0]
    layout = LAYOUT_ALIASES.get(spec.name, {}).get(layout, layout)
    if layout not in spec.space.layouts:
        raise InvalidValueError(f"{spec.name} supports layout(s) {list(spec.space.layouts)}, not {layout!r}")
    # Every option is checked here, before the GPU: a bad value found by optuna or the worker would cost the
    # worker's start-up and the seeds' compile and timing first, and come back as a traceback.
    validate.count(args.trials, name="--trials", minimum=1)
    validate.seconds(args.timeout, name="--timeout", allow_none=True)
    validate.seconds(args.candidate_timeout, name="--candidate-timeout", allow_none=False)
    validate.seed(args.seed, name="--seed")
    validate.count(args.warm_starts, name="--warm-starts", minimum=0)
    validate.storage_url(args.storage, name="--storage")
    fix = validate.fix_items(args.fix or [], name="--fix")
    setting = validate.precision(args.precision, name="--precision")
    narrowed = spec.space.restricted(fix) if fix else spec.space  # unknown names and values fail here
    precision.restricted(narrowed, args.dtype, setting)  # and a --fix the precision leaves empty, before the GPU
    grace = validate.seconds(args.heartbeat_grace, name="--heartbeat-grace", allow_none=False)
    from autotile.tuning.gpu_workers import parse_devices

    # A list of GPUs is checked before the GPU is looked for ("all" needs the GPUs to count them).
    listed = args.devices is not None and args.devices.strip() != "all"
    devices = parse_devices(args.devices) if listed else None
    if args.backend is None:
        from autotile.runtime.device import live_device

        live_device()  # a clear one-line error here when there is no GPU
    if not listed:
        devices = parse_devices(args.devices)
    result = tune(args.kernel, shape, dtype=args.dtype, layout=layout, trials=args.trials, timeout=args.timeout,
                  sampler=args.sampler, seed=args.seed, storage=args.storage, study_name=args.study_name,
                  cache=None if args.no_cache else "default", progress=True,
                  candidate_timeout=args.candidate_timeout, fix=fix or None, precision=setting,
                  devices=devices, backend=args.backend, heartbeat_grace=grace, report=args.report,
                  warm_starts=args.warm_starts)
    print(format_result(result))
    status = report_saving(result)
    if getattr(result, "report_error", None):
        print(f"autotile: error: the report was not written: {result.report_error}", file=sys.stderr)
        return 1
    if getattr(result, "report_path", None):
        print(f"report: {result.report_path}")
    return status


def cmd_batch(args: argparse.Namespace) -> int:
    from autotile.tuning.batch import read_problems, run_batch, table
    from autotile.tuning.gpu_workers import parse_devices

    items = read_problems(args.file)
    validate.count(args.trials, name="--trials", minimum=1)
    timeout = validate.seconds(args.timeout, name="--timeout", allow_none=True)
    candidate_timeout = validate.seconds(args.candidate_timeout, name="--candidate-timeout", allow_none=False)
    grace = validate.seconds(args.heartbeat_grace, name="--heartbeat-grace", allow_none=False)
    validate.seed(args.seed, name="--seed")
    storage = validate.storage_url(args.storage, name="--storage")
    setting = validate.precision(args.precision, name="--precision")
    if args.shortlist:
        return _batch_shortlist(items, setting, args)
    if args.backend is None:
        from autotile.runtime.device import live_device

        live_device()
    devices = parse_devices(args.devices) or [0]
    options = {"timeout_s": timeout, "sampler": args.sampler, "seed": args.seed,
               "candidate_timeout_s": candidate_timeout, "precision": setting, "grace_s": grace}
    rows, seconds = run_batch(items, devices=devices, trials=args.trials, options=options, storage=storage,
                              study_name=args.study_name, backend=args.backend, cache=not args.no_cache,
                              cache_root=None, say=lambda m: print(m, flush=True))
    print()
    print(table(rows))
    done = sum(r.status == "done" for r in rows)
    print(f"\n{done} of {len(rows)} problems tuned in {seconds:.1f} s on {len(devices)} GPU(s)"
          + ("" if done == len(rows) else "; run the same command again to resume"))
    if args.survey and done:
        from autotile.tuning import survey

        names = sorted({r.item.key.kernel for r in rows} & set(survey.GRID))
        dtypes = sorted({r.item.key.dtype for r in rows})
        for dtype in dtypes:
            ns = argparse.Namespace(kernels=",".join(names), dtype=dtype, layouts="row,col", root=None, budget=None,
                                    random_shapes=None, check=False, device=None)
            if names and survey.run(ns) != 0:
                return 1
    return 0 if done == len(rows) else 1


def _batch_shortlist(items: list[Any], setting: str, args: argparse.Namespace) -> int:
    """`autotile batch --shortlist`: each problem timed as tuning at first call times it, in this process."""
    unused = [name for name, given in (("--devices", args.devices), ("--storage", args.storage),
                                       ("--study-name", args.study_name), ("--no-cache", args.no_cache),
                                       ("--survey", args.survey)) if given]
    if unused:
        raise InvalidValueError(f"--shortlist runs in this process on the current GPU and stores its winners: "
                                f"{', '.join(unused)} does not apply")
    import time

    from autotile.dispatch.cache import TuningCache
    from autotile.runtime.device import live_device
    from autotile.tuning.at_first_call import tune_listed

    started = time.monotonic()
    outcome = tune_listed([item.key for item in items], live_device(), TuningCache(), setting,
                          say=lambda line: print(line, flush=True))
    failed = [key for key, why in outcome.items() if why is not None]
    print(f"\n{len(items) - len(failed)} of {len(items)} problems tuned in {time.monotonic() - started:.1f} s"
          + ("" if not failed else f"; failed: {', '.join(map(str, failed))}"))
    return 0 if not failed else 1


def report_saving(result: Any) -> int:
    """Say what became of the cache write after the table, which is printed whatever happened: a tuning
    run is too costly to lose its result to an unwritable cache. Exit status 1 if it was not saved.

    The fields are read with getattr: libraries older than `saved_path`, `save_note` and `save_error`
    raise CacheError from the write instead (and the table is lost)."""
    note = getattr(result, "save_note", None)
    error = getattr(result, "save_error", None)
    saved = getattr(result, "saved_path", None)
    if note:  # the cache kept a faster entry it already had
        print(note)
    if error:
        why = " ".join(str(error).split())  # one line, whatever the error text held
        print(f"autotile: error: the result was not saved to {saved or 'the cache'}: {why}", file=sys.stderr)
        return 1
    if saved and not note:
        print(f"saved to {saved}")
    return 0


def format_result(r: Any) -> str:
    shape = "x".join(map(str, r.shape))
    unit = r.metric_unit
    setting = getattr(r, "precision", precision.DEFAULT)  # read with getattr: older libraries lack it
    lines = [f"\n{r.kernel} {shape} {r.dtype} layout {r.layout} on {r.environment.get('gpu', '?')}"
             + (f", precision {setting}" if setting != precision.DEFAULT else ""),
             f"{r.trials} candidates in {r.seconds:.1f} s ({r.trials_per_second:.2f} per second); "
             f"{r.pruned} infeasible draws pruned, {r.duplicates} repeats skipped; "
             f"failures: {', '.join(f'{n} {s}' for s, n in r.failures.items()) or 'none'}",
             "",
             f"{'':<4} {'time ms':>9} {'spread':>7} {unit:>10} {'x cuBLAS':>9}  config"]
    for f in r.finalists:
        m = kernels.metric(r.kernel, r.shape, r.dtype, f.median_ms)[0]
        ratio = f"{r.baseline_ms / f.median_ms:.2f}" if r.baseline_ms else "-"
        tag = "best" if f is r.best else (f.seed_name or "")
        lines.append(f"{tag[:4]:<4} {f.median_ms:>9.4f} {f.spread:>6.1%} {m:>10,.0f} {ratio:>9}  "
                     f"{f.seed_name + ': ' if f.seed_name else ''}{f.config.key()}")
    if r.baseline_ms:
        m = kernels.metric(r.kernel, r.shape, r.dtype, r.baseline_ms)[0]
        lines.append(f"{'cuBLAS':<6} {r.baseline_ms:>7.4f} {'':>7} {m:>10,.0f} {1.0:>9.2f}  {_cublas_routine(r.dtype)}")
    lines.append("")
    lines.append(f"best: {r.best.median_ms:.4f} ms, {r.metric:,.0f} {unit}"
                 + (f", {r.vs_baseline:.2f}x cuBLAS" if r.vs_baseline else "")
                 + (f", {r.vs_best_seed:.2f}x the best seed ({r.best_seed.seed_name})" if r.best_seed else ""))
    ahead = f"autotile cache compile --kernel {r.kernel} --dtype {r.dtype} --layout {r.layout} --shape {shape}"
    return "\n".join(lines + format_phases(getattr(r, "phases", None) or {}, ahead))


# From this share of a tune's wall time spent waiting for compiles, its report says how to compile ahead.
COMPILE_HINT_SHARE = 0.3


def format_phases(phases: dict[str, float], compile_ahead: str | None = None) -> list[str]:
    """Where the tune's wall time went: one line per phase (`tuner.PHASES`) with its share; none if unknown.
    Where waiting for compiles took COMPILE_HINT_SHARE of it or more, a last line names `compile_ahead`
    (the `autotile cache compile` command that builds such a tune's first kernels without a GPU)."""
    from autotile.tuning.tuner import PHASES

    total = sum(phases.values())
    if total <= 0:
        return []
    lines = ["", f"time: {total:.1f} s in all"]
    for key, words in PHASES:
        if key in phases:
            lines.append(f"  {words:<52} {phases[key]:>7.1f} s {phases[key] / total:>5.0%}")
    if compile_ahead and phases.get("compile", 0.0) >= COMPILE_HINT_SHARE * total:
        lines.append(f"compiles stay on disk for the next tunes; to build a tune's first ones ahead: {compile_ahead}")
    return lines


def _cache(args: argparse.Namespace) -> Any:
    from autotile.dispatch.cache import TuningCache

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


def _nothing_for(cache: Any, device: str | None, kernel: str | None, include_shipped: bool) -> str:
    """The line printed where a filter matched nothing. For a device key that has no entries (often a
    profile name, h100, typed for a key such as NVIDIA-H100-80GB-HBM3_sm_90) it lists the keys there are."""
    line = f"no cached {kernel + ' ' if kernel else ''}entries{f' for device {device!r}' if device else ''} " \
           f"under {cache.root}"
    if device:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unreadable files were reported once already
            devices = sorted({rec.device for _, rec in cache.entries(None, include_shipped=include_shipped)})
        if device not in devices:
            line += f"; device keys with entries: {', '.join(devices) or 'none'}"
    return line


def _skipped(cache: Any) -> str:
    """The closing line of a listing: how many files were skipped (each said on stderr, with its reason)."""
    n = len(getattr(cache, "problems", []))
    return f"{n} file{'s' if n != 1 else ''} skipped (not valid entries; the reasons are above)" if n else ""


def cmd_cache_list(args: argparse.Namespace) -> int:
    cache, entries = _entries(args)
    skipped = _skipped(cache)
    if not entries:
        print(_nothing_for(cache, args.device, None, args.shipped))
        if skipped:
            print(skipped)
        return 0
    # precision: the class the entry needs (highest: IEEE FP32 or float64; high: tf32x3), its cache slot.
    print(f"{'device':<34} {'kernel':<7} {'dtype':<8} {'lay':<4} {'shape':<18} {'ms':>9} {'metric':>16} "
          f"{'x cuBLAS':>9} {'runs':<9} precision")
    for _, rec in entries:
        ratio = f"{rec.baseline_ms / rec.time_ms:.2f}" if rec.baseline_ms else "-"
        print(f"{rec.device:<34} {rec.kernel:<7} {rec.dtype:<8} {rec.layout:<4} {'x'.join(map(str, rec.shape)):<18} "
              f"{rec.time_ms:>9.4f} {rec.metric:>9,.0f} {rec.metric_unit:<6} {ratio:>9} {rec.implementation:<9} "
              f"{rec.precision}")
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}" + (f"; {skipped}" if skipped else ""))
    return 0


def cmd_cache_show(args: argparse.Namespace) -> int:
    if args.kernel is not None:
        kernels.get(args.kernel)  # an unknown kernel is an error naming the known ones, not an empty listing
    cache, entries = _entries(args)
    shown = [(path, rec) for path, rec in entries if args.kernel is None or rec.kernel == args.kernel]
    if not shown:
        print(_nothing_for(cache, args.device, args.kernel, args.shipped))
    for path, rec in shown:
        print(f"# {path}")
        print(json.dumps(rec.to_json(), indent=2))
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    if args.compiled:
        from autotile.codegen import compile_cache

        if args.device or args.kernel:
            raise InvalidValueError("--compiled clears every compiled kernel: it takes no --device or --kernel")
        folder = compile_cache.root()
        if folder is None:
            print(f"the compile cache is off ({compile_cache.ENV_VAR}={compile_cache.OFF}): nothing to remove")
            return 0
        n = compile_cache.clear(folder)
        print(f"removed {n} compiled kernel{'' if n == 1 else 's'} from {folder}")
        return 0
    if args.kernel is not None:
        kernels.get(args.kernel)  # a typo must not read as "removed 0 entries"
    cache = _cache(args)
    n = cache.clear(args.device, args.kernel)
    if n == 0 and args.device:
        print("removed nothing: " + _nothing_for(cache, args.device, args.kernel, include_shipped=False))
        return 0
    print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {cache.root}")
    return 0


def cmd_cache_compile(args: argparse.Namespace) -> int:
    from autotile.codegen import dtypes
    from autotile.codegen.limits import PROFILES, profile
    from autotile.runtime.device import live_device
    from autotile.tuning import precompile

    if args.threads is not None:
        validate.count(args.threads, name="--threads", minimum=1)
    for name in args.kernel or ():
        kernels.get(name)  # an unknown kernel: one line naming the known ones
    for name in args.dtype or ():
        dtypes.get(name)
    if args.device is not None:
        limits = profile(args.device)
    else:
        try:
            limits = live_device()
        except DeviceUnavailableError as exc:
            raise DeviceUnavailableError(f"{exc}; name the GPU to compile for with --device "
                                         f"({', '.join(PROFILES)})") from None
    asked = args.kernel or list(kernels.KERNELS)
    shapes = []
    for text in args.shape or ():
        # a shape is the kernels' whose dimensions it has (matmul MxNxK, bmm BATCHxMxNxK, matvec MxK)
        fits = [name for name in asked if len(text.split("x")) == len(kernels.get(name).dims)]
        if not fits:
            raise InvalidValueError(f"--shape {text!r} is a shape of none of the kernels asked for "
                                    f"({', '.join(asked)}): MxNxK for matmul, BATCHxMxNxK for bmm, MxK for matvec")
        shapes.append(kernels.get(fits[0]).parse_shape(text))
    folder = precompile.cache_folder()
    todo = precompile.jobs(limits, _cache(args), args.kernel, args.dtype, args.layout, shapes)
    archs = ", ".join(sorted({job.arch for job in todo})) or "-"
    print(f"{len(todo)} kernels for {limits.name} ({archs}) into {folder}")
    bar = _progress_bar(len(todo))
    summary = precompile.compile_all(todo, args.threads, progress=None if bar is None else lambda done, _: bar.update())
    if bar is not None:
        bar.close()
    for job, message in summary.failed:
        print(f"autotile: warning: {job.kernel} {job.dtype} {job.layout} {job.origin} did not compile: {message}",
              file=sys.stderr)
    print(f"compiled {summary.compiled}, already compiled {summary.cached}, failed {len(summary.failed)} "
          f"in {summary.seconds:.1f} s")
    from autotile.runtime import torch_lookup

    print(torch_lookup.build_ahead())  # not a failure where it cannot be built: the Python lookup serves
    return 1 if summary.failed else 0


def _progress_bar(total: int) -> Any:
    """A tqdm bar on a terminal, else None (a log gets the summary line only)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="kernel", dynamic_ncols=True)


def _cublas_routine(dtype: str) -> str:
    """What the baseline called (`autotile.runtime.impl.CublasRunner`): cublasGemmEx for the types the tensor
    cores take as they are, CuPy's matmul for the others."""
    return "cublasGemmEx" if dtype in TENSOR_CORE_DTYPES else "cupy.matmul"
