"""Covering sets of compiled kernels: the tests that compile a grid of kernels (named configs in every layout,
batched and not, on several profiles) keep every case of one part of it (each named config in nn, say) and,
of the rest, only as many as cover everything the whole grid covered.

`covering` chooses them greedily and deterministically: the case that adds the most of what is not covered
yet, the first in the list's order on a tie, until the kept cases cover what all of them did. What a case
covers is the test's to say (`coverage`): typically each value of each of its config's parameters, alone
and paired with the case's layout, batching and profile, so that every parameter value is still compiled in
every layout, batched and not, and on every profile where the whole grid compiled it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def config_coverage(config: Mapping[str, Any], **where: Hashable) -> set[tuple]:
    """Each value of each parameter of `config`, alone and paired with each of `where` (layout="tn",
    batched=True, ...), and the combination of `where`'s values."""
    out: set[tuple] = {("where", *sorted(where.items()))}
    for name, value in config.items():
        out.add(("value", name, value))
        out |= {(key, at, name, value) for key, at in where.items()}
    return out


def covering(cases: Iterable[T], keep: Callable[[T], bool], coverage: Callable[[T], set]) -> list[T]:
    """The cases `keep` says to keep, and the fewest others (greedily) that with them cover everything
    `coverage` says all the cases cover; in the order of `cases`."""
    cases = list(cases)
    covers = [coverage(c) for c in cases]
    whole = set().union(*covers)
    kept = {i for i, c in enumerate(cases) if keep(c)}
    covered = set().union(*(covers[i] for i in kept))
    while covered != whole:
        best = max((i for i in range(len(cases)) if i not in kept), key=lambda i: len(covers[i] - covered))
        kept.add(best)  # max() returns the first of the largest: deterministic
        covered |= covers[best]
    return [c for i, c in enumerate(cases) if i in kept]
