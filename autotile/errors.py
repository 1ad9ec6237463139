"""The exceptions autotile raises: one root class, one subclass per kind of failure.

Every message names the value that was wrong and the limit or the choices it broke, in one line, so the
command-line interface can print it as it is (exit status 2) and a library caller can read it.
"""

from __future__ import annotations


class AutotileError(Exception):
    """Root of every error autotile raises on purpose."""


class UnknownNameError(AutotileError, KeyError):
    """An unknown kernel, named config, parameter, device profile or sampler."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidValueError(AutotileError, ValueError):
    """A value outside its choices, a malformed shape or option."""


class InfeasibleConfigError(AutotileError, ValueError):
    """A config that breaks a constraint of its search space or a limit of the device."""


class SpaceDefinitionError(AutotileError, ValueError):
    """A search-space file that is malformed: a bad expression, an unknown name, a missing field."""


class DeviceUnavailableError(AutotileError, RuntimeError):
    """CuPy or a CUDA GPU is needed and is not there."""


class CompileError(AutotileError, RuntimeError):
    """NVRTC or nvcc rejected a rendered kernel. Carries the source, the options and the compiler log."""

    def __init__(self, message: str, source: str = "", options: tuple[str, ...] = (), log: str = ""):
        super().__init__(message)
        self.source = source
        self.options = tuple(options)
        self.log = log

    def numbered_source(self) -> str:
        """The source with line numbers, to read next to the compiler log."""
        return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(self.source.splitlines(), 1))


class CublasError(AutotileError, RuntimeError):
    """A cuBLAS routine the library called directly returned an error status (named in the message)."""


class ArgumentError(AutotileError, TypeError):
    """A library call got arrays it cannot take: host arrays, wrong shapes, dtypes or layouts."""


class CacheError(AutotileError, RuntimeError):
    """A cache file that cannot be read or written."""


class StorageError(AutotileError, RuntimeError):
    """A study's storage that cannot be opened or read (a database server, a journal file, a sqlite file);
    the message names it (never its password) and what to check."""


class MissingDependencyError(AutotileError, ImportError):
    """An optional package a feature needs is not installed; the message says which extra installs it."""


def shown(value: object, limit: int = 60) -> str:
    """A value as an error line shows it: its repr, cut to `limit` characters (a junk value can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(text: str, limit: int = 300) -> str:
    """`text` (another library's message) as part of an error line: whitespace collapsed, cut to `limit`."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
