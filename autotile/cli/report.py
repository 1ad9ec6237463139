"""The tables of benchmark runs: `python -m autotile.cli.report RESULTS.json [...]` (no GPU needed).

Reads the results.json (or random.json) files that `python -m autotile.cli.bench` writes and prints their
tables (`autotile.tuning.bench_results`); every file is read before anything is printed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from autotile.tuning.bench_results import _is_random, _load, _read, random_markdown, summary_markdown


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autotile.cli.report",
                                     description=(__doc__ or "").splitlines()[0])
    # nargs="*" and a check of our own: argparse's "required" error would print the usage line too.
    parser.add_argument("paths", nargs="*", metavar="RESULTS.json",
                        help="results.json of python -m autotile.cli.bench, or random.json of its --random mode "
                             "(all random.json files given make one table, printed last)")
    args = parser.parse_args(argv)
    if not args.paths:
        print(f"autotile.cli.report: error: no results file given; usage: {parser.prog} RESULTS.json "
              "[RESULTS.json ...]",
              file=sys.stderr)
        return 2
    tables = []
    randoms: list[dict[str, Any]] = []
    try:  # every file is read before any table is printed: no half report, then an error
        for path in args.paths:
            results = _load(path, _read(path))
            try:
                if _is_random(results):
                    random_markdown([results])  # checked here, printed with the others after the loop
                    randoms.append(results)
                else:
                    tables.append(summary_markdown(results))
            except (KeyError, TypeError, ValueError, StopIteration) as exc:  # a value of the wrong kind
                raise ValueError(f"{path}: cannot make the tables ({type(exc).__name__}: {exc})") from None
        if randoms:
            tables.append(random_markdown(randoms))
    except ValueError as exc:
        print(f"autotile.cli.report: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        for table in tables:
            print(table)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (head, less) stopped early; nor may the flush at exit complain
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
