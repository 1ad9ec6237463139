"""The switch for tuning at first call, and the slot the tuning layer plugs its tuner into.

Tuning at first call (off by default) times a few verified candidates the first time the library meets an
untuned shape, and stores the winner (`autotile.tuning.at_first_call`). The library only asks this module
whether it is on and, if so, calls the registered tuner: the call path never imports the tuning layer.
`autotile/__init__.py` registers a tuner that imports the tuning code when it is first used.

On with ``AUTOTILE_TUNE_AT_FIRST_CALL=1`` in the environment, or `autotile.tune_at_first_call(True)`
(which wins over the environment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from autotile.environment import env_flag

if TYPE_CHECKING:
    from autotile.codegen.limits import DeviceLimits
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import Selection

ENV_VAR = "AUTOTILE_TUNE_AT_FIRST_CALL"
_enabled: bool | None = None  # None: as the environment says


class FirstCallTuner(Protocol):
    """Times candidates for `key` on `device` under the precision `setting`, stores the winner in `cache`
    and returns it; returns `fallback` (after a warning) where tuning fails."""

    def __call__(self, key: ProblemKey, device: DeviceLimits, cache: Any, fallback: Selection,
                 setting: str) -> Selection: ...


_tuner: FirstCallTuner | None = None


def tune_at_first_call(enabled: bool | None = True) -> None:
    """Switch tuning at first call on or off for this process (None: back to the environment variable)."""
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    """Whether the first call on an untuned shape tunes it."""
    if _enabled is not None:
        return _enabled
    return env_flag(ENV_VAR)


def register_tuner(tuner: FirstCallTuner | None) -> None:
    """Plug in what runs when tuning at first call is on (None unplugs it)."""
    global _tuner
    _tuner = tuner


def tuner() -> FirstCallTuner | None:
    """The registered first-call tuner, if any."""
    return _tuner


__all__ = ["ENV_VAR", "FirstCallTuner", "enabled", "register_tuner", "tune_at_first_call", "tuner"]
