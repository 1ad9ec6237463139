"""Tensor maps: the driver's descriptions of the tensor memory accelerator's (TMA) copies.

A Hopper kernel that copies tiles with `cp.async.bulk.tensor` takes, for each operand, a 128-byte
`CUtensorMap` that says where the matrix lies (address, extents, row stride) and which box one copy moves.
The driver encodes it on the host (`cuTensorMapEncodeTiled`, a pure function: no GPU work, no context
needed), and the kernel gets it by value as a `__grid_constant__` parameter, so a launch costs no copy to
the GPU. Here: when a matrix can be described at all, the encoding, and a small cache of encodings by
address (a model's weights come back at the same addresses call after call).
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading

from autotile.errors import AutotileError

MAP_BYTES = 128  # sizeof(CUtensorMap); its alignment is 64
_ALIGNMENT = 16  # bytes: the global address and every row stride of a tensor map

# CUDA's enums (cuda.h), as the driver takes them.
# CU_TENSOR_MAP_DATA_TYPE_UINT8, _UINT16, _FLOAT32, _FLOAT64 by element size: the copies move raw words, no
# conversion
_DATA_TYPES = {1: 0, 2: 1, 4: 7, 8: 8}
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3  # rows of 128 bytes, 16-byte chunk XOR row mod 8: what the kernels read back
_L2_PROMOTION_256B = 3
_OOB_FILL_ZEROS = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: elements outside the matrix read as zeros


class TensorMapError(AutotileError):
    """The driver refused to encode a tensor map, or no CUDA driver is loaded."""


@dataclasses.dataclass(frozen=True)
class TensorBox:
    """One operand's TMA copies as a kernel issues them, in elements of `element_bytes` bytes.

    The matrix as it is stored: rows of `inner` contiguous elements, `outer` rows, each row right after
    the previous one (a row stride of `inner`). Each copy moves a box of `box_inner` x `box_outer`
    elements (box_inner x element_bytes bytes wide: 128 for the 128-byte swizzle). `operand` is the
    input's index among the kernel's inputs (0: A, 1: B).
    """

    operand: int
    inner: int
    outer: int
    box_inner: int
    box_outer: int
    element_bytes: int = 4

    def describable(self, pointer: int) -> bool:
        """Whether a tensor map can describe this matrix at `pointer`: 16-byte aligned address and rows."""
        return pointer % _ALIGNMENT == 0 and (self.inner * self.element_bytes) % _ALIGNMENT == 0


_driver_lock = threading.Lock()
_encode_function: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]


def _encoder() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """cuTensorMapEncodeTiled from the CUDA driver library, loaded once."""
    global _encode_function
    with _driver_lock:
        if _encode_function is None:
            try:
                library = ctypes.CDLL("libcuda.so.1")
            except OSError as error:
                raise TensorMapError(f"no CUDA driver library to encode tensor maps with: {error}") from None
            function = library.cuTensorMapEncodeTiled
            function.restype = ctypes.c_int
            function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                 ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            _encode_function = function
        return _encode_function


def encode(box: TensorBox, pointer: int) -> bytes:
    """The 128-byte tensor map of the matrix at device address `pointer`, as `box` describes it.
    Raises `TensorMapError` when the driver refuses (check `box.describable(pointer)` first)."""
    storage = (ctypes.c_uint8 * (MAP_BYTES + 64))()
    address = (ctypes.addressof(storage) + 63) & ~63  # the driver wants the map 64-byte aligned
    extents = (ctypes.c_uint64 * 2)(box.inner, box.outer)
    row_stride = (ctypes.c_uint64 * 1)(box.inner * box.element_bytes)  # bytes; the innermost is the element's size
    box_dims = (ctypes.c_uint32 * 2)(box.box_inner, box.box_outer)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    status = _encoder()(address, _DATA_TYPES[box.element_bytes], 2, pointer, extents, row_stride, box_dims,
                        element_strides, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if status != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled refused {box} at 0x{pointer:x}: CUresult {status}")
    return ctypes.string_at(address, MAP_BYTES)


class TensorMapCache:
    """A kernel runner's tensor maps by the operands' addresses, the latest `capacity` sets kept: encoding
    costs microseconds of host time, a dictionary lookup well under one."""

    def __init__(self, boxes: tuple[TensorBox, ...], capacity: int = 16):
        self.boxes = boxes
        self.capacity = capacity
        self._maps: dict[tuple[int, ...], tuple[bytes, ...] | None] = {}
        self._lock = threading.Lock()

    def maps(self, pointers: tuple[int, ...]) -> tuple[bytes, ...] | None:
        """One map per box for the inputs at `pointers`, or None where a box cannot describe its input
        (the kernel then loads through registers)."""
        key = tuple(pointers[box.operand] for box in self.boxes)
        with self._lock:
            if key in self._maps:
                return self._maps[key]
        if all(box.describable(p) for box, p in zip(self.boxes, key, strict=True)):
            maps: tuple[bytes, ...] | None = tuple(encode(box, p) for box, p in zip(self.boxes, key, strict=True))
        else:
            maps = None
        with self._lock:
            if len(self._maps) >= self.capacity:
                self._maps.pop(next(iter(self._maps)))  # the oldest
            self._maps[key] = maps
        return maps


__all__ = ["MAP_BYTES", "TensorBox", "TensorMapCache", "TensorMapError", "encode"]
