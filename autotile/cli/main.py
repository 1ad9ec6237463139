"""The `autotile` command. The only module that prints; every command is a thin layer over the library."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, Sequence

from autotile.codegen import kernels, limits
from autotile.codegen.dtypes import DTYPE_NAMES
from autotile.codegen.problem import LAYOUT_ALIASES, LAYOUTS
from autotile.codegen.space import Problem
from autotile.errors import AutotileError, InvalidValueError
from autotile.runtime import device as device_mod


def _add_problem_options(p: argparse.ArgumentParser, with_device: bool = True,
                         layout_default: str = "row") -> None:
    """--dtype, --layout and (unless `with_device` is False) --device. `layout_default` ends the --layout
    help: what the command does without it, which differs between commands."""
    p.add_argument("--dtype", default="float32", choices=list(DTYPE_NAMES), help="element type")
    p.add_argument("--layout", choices=list(LAYOUTS), default=None,
                   help="storage of the operands. matmul, bmm: nn, nt, tn, tt (A then B; t: stored transposed, "
                        "as PyTorch's W.T; 'row' is nn's former name). matvec: row or col (A). "
                        f"Default: {layout_default}")
    if with_device:
        p.add_argument("--device", default=None, metavar="PROFILE",
                       help=f"offline device profile ({', '.join(limits.PROFILES)}); default: the live GPU, "
                            f"else {limits.DEFAULT_OFFLINE_PROFILE}")


def _parse_sets(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InvalidValueError(f"--set {item!r} must look like PARAM=VALUE")
        out[name.strip()] = value.strip()
    return out


def _layout(spec: kernels.KernelSpec, requested: str | None, config_name: str | None) -> str:
    layout = requested or spec.space.named_layouts.get(config_name or "", None) or spec.space.layouts[0]
    layout = LAYOUT_ALIASES.get(spec.name, {}).get(layout, layout)
    if layout not in spec.space.layouts:
        raise InvalidValueError(f"{spec.name} supports layout(s) {list(spec.space.layouts)}, not {layout!r}")
    return layout


def cmd_render(args: argparse.Namespace) -> int:
    spec = kernels.get(args.kernel)
    space = spec.space
    layout = _layout(spec, args.layout, args.config)
    problem = Problem(device_mod.resolve(args.device), args.dtype, layout)
    base = space.named(args.config) if args.config else space.default_config(layout, problem)
    config = space.with_overrides(base, _parse_sets(args.set or []))
    space.check(config, problem)
    sys.stdout.write(spec.render(config, args.dtype, layout))
    return 0


def cmd_space(args: argparse.Namespace) -> int:
    spec = kernels.get(args.kernel)
    space = spec.space
    dev = device_mod.resolve(args.device)
    if args.layout:
        args.layout = LAYOUT_ALIASES.get(spec.name, {}).get(args.layout, args.layout)
    if args.layout and args.layout not in space.layouts:
        raise InvalidValueError(f"{spec.name} supports layout(s) {list(space.layouts)}, not {args.layout!r}")
    layouts = [args.layout] if args.layout else list(space.layouts)
    print(f"{space.kernel}: {space.description}")
    print(f"\nparameters ({len(space.params)}):")
    for p in space.params.values():
        print(f"  {p.name:<14} {', '.join(str(c) for c in p.choices)}")
    print("\nderived quantities:")
    for name, expr in space.derived.items():
        print(f"  {name:<18} = {expr.text}")
    print("\nconstraints:")
    for c in space.constraints:
        tag = "device" if c.from_device else "space"
        print(f"  [{tag}] {c.name}: {c.expr.text}")
    print(f"\nnamed configs: {', '.join(space.named_configs)}")
    for layout in layouts:
        count = space.count(Problem(dev, args.dtype, layout))
        print(f"\n{dev.name} ({dev.arch}{'' if dev.live else ', offline profile'}), {args.dtype}, layout {layout}:")
        print(f"  {count.total:,} points, {count.feasible:,} feasible")
        for name, n in count.excluded_by.items():
            if n:
                print(f"  {n:>12,} excluded by {name}")
    return 0


def _limits_rows(d: limits.DeviceLimits) -> list[tuple[str, str]]:
    kib = lambda b: f"{b / 1024:g} KB"  # noqa: E731
    return [
        ("compute capability", f"{d.compute_capability[0]}.{d.compute_capability[1]} ({d.arch})"),
        ("SMs", str(d.sm_count)),
        ("threads per block / per SM", f"{d.max_threads_per_block} / {d.max_threads_per_sm}"),
        ("blocks per SM", str(d.max_blocks_per_sm)),
        ("shared memory: static per block", kib(d.static_smem_per_block)),
        ("shared memory: opt-in per block", kib(d.optin_smem_per_block)),
        ("shared memory: per SM (reserved per block)", f"{kib(d.smem_per_sm)} ({kib(d.reserved_smem_per_block)})"),
        ("registers per block / per SM", f"{d.regs_per_block} / {d.regs_per_sm}"),
        ("L2", f"{d.l2_bytes / 2**20:g} MB"),
        ("cache key", d.fingerprint),
    ]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _no_gpu_reason() -> str:
    """Why `live_devices` found nothing, in one line: CuPy missing, or the CUDA runtime's own error text
    (an old driver and a container without the GPU passed through look alike otherwise)."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except ImportError as exc:
        return f"CuPy is not installed: {_first_line(exc)}"
    except Exception as exc:  # CUDARuntimeError, or CuPy failing to load its CUDA libraries
        return _first_line(exc)
    return "the CUDA runtime reports no devices" if n == 0 else f"the CUDA runtime reports {n} device(s)"


def cmd_devices(args: argparse.Namespace) -> int:
    live = device_mod.live_devices()
    if live:
        for i, d in enumerate(live):
            print(f"GPU {i}: {d.name}")
            for k, v in _limits_rows(d):
                print(f"  {k:<44} {v}")
        return 0
    print(f"no CUDA GPU visible ({_no_gpu_reason()}); offline profiles:")
    for key, d in limits.PROFILES.items():
        print(f"\n{key}: {d.name}")
        for k, v in _limits_rows(d):
            print(f"  {k:<44} {v}")
    return 0


def cmd_report_study(args: argparse.Namespace) -> int:
    from autotile.tuning import study_report

    study_report.require_matplotlib()
    if (args.storage is None) != (args.study_name is None):
        raise InvalidValueError("--storage and --study-name name a study together: give both, or neither with --bench")
    if args.study_name is None and args.bench is None:
        raise InvalidValueError("nothing to report: give --storage and --study-name, or --bench, or both")
    study = study_report.load_study(args.storage, args.study_name) if args.study_name is not None else None
    print(study_report.write_report(study, args.out, bench=args.bench))
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors in one line (its own print the usage block first): a bad option is one
    line and exit status 2, as every other bad input is. `--help` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from autotile.version import __version__

    parser = OneLineParser(
        prog="autotile", description="Generate, tune and cache CUDA matmul/matvec kernels.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="print the CUDA source of one config")
    p.add_argument("kernel", help=f"one of {', '.join(kernels.KERNELS)}")
    p.add_argument("--config", help="a named config of the space (default: the built-in default)")
    p.add_argument("--set", action="append", metavar="PARAM=VALUE", help="override one parameter (repeatable)")
    _add_problem_options(p, layout_default="the --config's layout, else the first (nn, row)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("space", help="print a search space and how many configs the device allows")
    p.add_argument("kernel", help=f"one of {', '.join(kernels.KERNELS)}")
    _add_problem_options(p, layout_default="every layout the kernel supports")
    p.set_defaults(func=cmd_space)

    p = sub.add_parser("devices", help="show the live GPUs' limits, or the offline profiles")
    p.set_defaults(func=cmd_devices)

    from autotile.cli import tune as cli_tune  # the GPU-side commands live apart; importing them touches no GPU

    cli_tune.add_commands(sub, _add_problem_options)

    from autotile.cli import sweep as cli_sweep

    cli_sweep.add_commands(sub, _add_problem_options)

    p = sub.add_parser("report-study", help="plots and an HTML page of a tuning study (any optuna storage), "
                                            "and the roofline of a benchmark run")
    p.add_argument("--storage", default=None, help="the study's storage: journal:PATH or an optuna RDB URL")
    p.add_argument("--study-name", default=None, help="the study's name (as `autotile tune` printed or was given)")
    p.add_argument("--bench", default=None, metavar="RESULTS.json",
                   help="results.json of python -m autotile.cli.bench: adds its roofline (alone: the roofline only)")
    p.add_argument("--out", required=True, metavar="DIR", help="the report folder (created; files replaced)")
    p.set_defaults(func=cmd_report_study)

    from autotile.tuning import survey

    p = sub.add_parser("survey", help="time a portfolio of configs and cuBLAS over a grid of shapes (the shape "
                                      "database the selection model learns from)")
    survey.add_arguments(p)
    p.set_defaults(func=survey.run)
    for name, (module, help_text) in BENCHMARKS.items():  # listed in --help; `main` runs them before parsing
        sub.add_parser(name, help=f"{help_text} (python -m {module}; `autotile {name} --help`)", add_help=False)
    return parser


# The benchmarks (each needs a GPU): `autotile NAME ARGS` runs `python -m MODULE ARGS`, its arguments passed on
# as they are (each module parses its own; `autotile NAME --help` shows them).
BENCHMARKS = {
    "bench": ("autotile.cli.bench", "time kernels against cuBLAS and the GPU's ceilings on fixed and random shapes"),
    "bench-torch": ("autotile.cli.bench_torch", "autotile's calls against PyTorch's on torch tensors (GPU time, L2 "
                                                "flushed, and back to back)"),
    "overhead": ("autotile.cli.overhead", "the host's microseconds per call against torch's and CuPy's, enqueued "
                                          "and back to back"),
    "bench-emulation": ("autotile.cli.bench_emulation", "the float64/float32 emulation on int8 tensor cores "
                                                        "against DGEMM/SGEMM"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in BENCHMARKS:
        import importlib

        module = importlib.import_module(BENCHMARKS[args[0]][0])
        return int(module.main(args[1:], prog=f"autotile {args[0]}") or 0)
    parser = build_parser()
    return _dispatch(parser.parse_args(args))


def autotune_main(argv: Sequence[str] | None = None) -> int:
    """`autotune`: `autotile tune` under the name this project's users asked for (same options, same help)."""
    parser = build_parser()
    tune = _subparsers(parser).choices["tune"]
    tune.prog = "autotune"
    return _dispatch(tune.parse_args(argv))


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError("the parser has no subcommands")


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except AutotileError as exc:
        print(f"autotile: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotile: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (head, less) stopped early; nor may the flush at exit complain
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
