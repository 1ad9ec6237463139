"""One event, "the tuned records changed", so that what memoizes selections can forget them.

The tuning layer announces it after it writes the cache; the library (`autotile.library.calls`) listens,
and drops its prepared calls so that the next call selects again. The library never imports the tuner.
"""

from __future__ import annotations

import threading
from typing import Callable

_listeners: list[Callable[[], None]] = []
_lock = threading.Lock()


def on_records_changed(listener: Callable[[], None]) -> None:
    """Call `listener` (no arguments) whenever tuned records were written in this process."""
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def records_changed() -> None:
    """Tell every listener that tuned records were written."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener()


__all__ = ["on_records_changed", "records_changed"]
