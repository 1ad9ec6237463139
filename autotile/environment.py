"""The package's switches read from the environment: one parser, so that every variable takes the same words
and a typo is an error naming it, never a feature silently left on or off."""

from __future__ import annotations

import os

from autotile.errors import InvalidValueError, shown

TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable `name`: true/false, 1/0, yes/no, on/off (any case, blanks around
    ignored); unset or empty: `default`. Anything else is an `InvalidValueError` naming the variable and the
    value."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise InvalidValueError(f"{name}={shown(raw, 40)} is not a boolean; use 1/0, true/false, yes/no or on/off")


__all__ = ["FALSE_WORDS", "TRUE_WORDS", "env_flag"]
