"""Where the templates, search spaces and shipped cache are (inside the installed wheel, or in the source tree), and
where the user's cache root is."""

from __future__ import annotations

import os
from pathlib import Path

from autotile.errors import UnknownNameError

CACHE_DIR_ENV = "AUTOTILE_CACHE_DIR"  # the user cache root: tuned records, studies' journals, compiled kernels
_PACKAGE = Path(__file__).resolve().parent.parent  # autotile/


def _data_dir(name: str) -> Path:
    # A wheel carries them as autotile/_data/<name>; a source checkout (or an editable install) has them
    # at the repository's top level, next to the package.
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"autotile's {name}/ folder is missing from {_PACKAGE}; reinstall autotile")


def templates_dir() -> Path:
    return _data_dir("templates")


def search_spaces_dir() -> Path:
    return _data_dir("search_spaces")


def shipped_cache_dir() -> Path | None:
    """The read-only tuned configs that ship with autotile (None if the folder is absent)."""
    try:
        return _data_dir("cache")
    except FileNotFoundError:
        return None


def user_cache_root() -> Path:
    """The user's cache root: ``$AUTOTILE_CACHE_DIR`` if set, else the platform's user cache folder (for
    example ~/.cache/autotile). Tuned records live in its device folders, compiled kernels in `compiled/`."""
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:
        return Path(os.path.expanduser(env))
    import platformdirs

    return Path(platformdirs.user_cache_dir("autotile"))


def kernel_names() -> list[str]:
    return sorted(p.stem for p in search_spaces_dir().glob("*.yaml"))


def search_space_path(kernel: str) -> Path:
    path = search_spaces_dir() / f"{kernel}.yaml"
    if not path.is_file():
        raise UnknownNameError(f"unknown kernel {kernel!r}; kernels: {', '.join(kernel_names())}")
    return path
