"""`ProblemKey`: what one call or one tuning run computes (kernel, dtype, layout, shape), as one value.

The same key names a tuning study, a cache entry and a library call, so the four facts travel together
and in one order everywhere. Shapes are checked once, here: positive integers that fit the generated
kernels' 32-bit indices.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Sequence

from .errors import InvalidValueError, UnknownNameError

# Each kernel's dimensions, in the order a shape lists them.
KERNEL_DIMS: dict[str, tuple[str, ...]] = {"matmul": ("M", "N", "K"), "matvec": ("M", "K")}
DTYPES = ("float32", "float64")
# matvec: row, col; matmul: nn, nt, tn, tt (A, then B; t: stored transposed)
LAYOUTS = ("row", "col", "nn", "nt", "tn", "tt")
MAX_DIM = 2**31 - 1  # the kernels index with 32-bit ints

_SEPARATORS = re.compile(r"[x×X,]")
_ASCII_DIGITS = re.compile(r"[0-9]+")


def _dims(kernel: str) -> tuple[str, ...]:
    try:
        return KERNEL_DIMS[kernel]
    except KeyError:
        raise UnknownNameError(f"unknown kernel {kernel!r}; kernels: {', '.join(KERNEL_DIMS)}") from None


def _check_dim(kernel: str, shape: object, value: int) -> int:
    if value < 1:
        raise InvalidValueError(f"{kernel} shape {shape}: every size must be at least 1, got {value}")
    if value > MAX_DIM:
        raise InvalidValueError(f"{kernel} shape {shape}: size {value} exceeds {MAX_DIM} (2**31 - 1), the "
                                "32-bit index range of the generated kernels")
    return value


def parse_shape(kernel: str, shape: str | Sequence[int]) -> tuple[int, ...]:
    """'4096x4096x4096' or (4096, 4096, 4096) -> (4096, 4096, 4096), checked: as many sizes as the kernel
    has dimensions, each an integer (no bool, no float, ASCII digits only) from 1 to 2**31 - 1."""
    dims = _dims(kernel)
    example = "x".join(["1024"] * len(dims))
    if isinstance(shape, str):
        parts = [p.strip() for p in _SEPARATORS.split(shape.strip())]
        # str.isdigit() accepts superscripts such as '²', which int() then rejects: ASCII digits only.
        if len(parts) != len(dims) or not all(_ASCII_DIGITS.fullmatch(p) for p in parts):
            raise InvalidValueError(f"{kernel} shape {shape!r} must be {'x'.join(dims)} with positive integers, "
                                    f"for example {example}")
        values: list[int] = [int(p) for p in parts]
    else:
        if isinstance(shape, (bytes, bytearray)) or not isinstance(shape, Sequence):
            raise InvalidValueError(f"{kernel} shape {shape!r} must be a string like {example} or a tuple of ints")
        values = []
        item: object
        for item in shape:
            # bool is an int subclass and a float would be truncated silently: both are mistakes.
            if isinstance(item, bool):
                raise InvalidValueError(f"{kernel} shape {tuple(shape)!r}: {item!r} is not a size")
            try:
                values.append(operator.index(item))  # type: ignore[arg-type]  # ints and NumPy ints, never floats
            except TypeError:
                raise InvalidValueError(f"{kernel} shape {tuple(shape)!r}: {item!r} is not an integer") from None
        if len(values) != len(dims):
            raise InvalidValueError(f"{kernel} shape {tuple(shape)!r} must have {len(dims)} sizes "
                                    f"({'x'.join(dims)})")
    text = shape if isinstance(shape, str) else tuple(values)
    return tuple(_check_dim(kernel, repr(text), v) for v in values)


@dataclasses.dataclass(frozen=True)
class ProblemKey:
    """One problem: a kernel, its element type, the storage order of A, and the shape (MxNxK or MxK)."""

    kernel: str
    dtype: str
    layout: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        _dims(self.kernel)
        if self.dtype not in DTYPES:
            raise InvalidValueError(f"dtype {self.dtype!r} is not supported; choose one of {list(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise InvalidValueError(f"layout {self.layout!r} is not supported; choose one of {list(LAYOUTS)}")
        object.__setattr__(self, "shape", parse_shape(self.kernel, self.shape))

    @classmethod
    def of(cls, kernel: str, shape: str | Sequence[int], dtype: str = "float32", layout: str = "row"
           ) -> ProblemKey:
        """A key from user input: the shape may be text ('4096x4096x4096') or a sequence."""
        return cls(kernel, dtype, layout, parse_shape(kernel, shape))

    @property
    def shape_text(self) -> str:
        """'4096x4096x4096'."""
        return "x".join(map(str, self.shape))

    def with_shape(self, shape: Sequence[int]) -> ProblemKey:
        return dataclasses.replace(self, shape=tuple(shape))

    def __str__(self) -> str:
        return f"{self.kernel} {self.dtype} {self.layout} {self.shape_text}"

    def to_json(self) -> dict[str, object]:
        return {"kernel": self.kernel, "dtype": self.dtype, "layout": self.layout, "shape": list(self.shape)}
