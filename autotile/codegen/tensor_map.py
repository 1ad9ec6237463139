"""Tensor maps: the driver's descriptions of the tensor memory accelerator's (TMA) copies.

A Hopper kernel that copies tiles with `cp.async.bulk.tensor` takes, for each operand, a 128-byte
`CUtensorMap` that says where the matrix lies (address, extents, row stride) and which box one copy moves.
The driver encodes it on the host (`cuTensorMapEncodeTiled`, a pure function: no GPU work, no context
needed), and the kernel gets it by value as a `__grid_constant__` parameter, so a launch costs no copy to
the GPU. Here: when a matrix can be described at all, the encoding, and a small cache of encodings by
address (a model's weights come back at the same addresses call after call).

A batch of matrices (bmm) is one 3-D tensor: its matrices `batch_stride` elements apart, the batch the third
coordinate of every copy, so a block copies from its own matrix with the same map; an operand shared by the
whole batch (a batch stride of 0) is a batch of one, read at batch coordinate 0.
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
    input's index among the kernel's inputs (0: A, 1: B). `batch`: 0 for one matrix (a 2-D map), else the
    number of matrices of a batched launch (a 3-D map, each box one matrix's). `row_stride`: elements from
    one row to the next where that is not `inner` (0): rows that hold more than the map reads (the wgmma
    LOADER=presplit workspace: a row's big and small parts side by side, each its own map).
    """

    operand: int
    inner: int
    outer: int
    box_inner: int
    box_outer: int
    element_bytes: int = 4
    batch: int = 0
    row_stride: int = 0

    @property
    def row_elements(self) -> int:
        """Elements from one row to the next."""
        return self.row_stride or self.inner

    def describable(self, pointer: int, batch_stride: int = 0) -> bool:
        """Whether a tensor map can describe this matrix (or batch, its matrices `batch_stride` elements
        apart) at `pointer`: 16-byte aligned address, rows and matrices."""
        return (pointer % _ALIGNMENT == 0 and (self.row_elements * self.element_bytes) % _ALIGNMENT == 0
                and (batch_stride * self.element_bytes) % _ALIGNMENT == 0)


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


def dimensions(box: TensorBox, batch_stride: int = 0) -> tuple[list[int], list[int], list[int]]:
    """The map's extents (elements, innermost first), strides (bytes, of every dimension but the innermost)
    and box (elements): a matrix's two dimensions, and for a batched box a third, the batch (one matrix
    where the operand is shared: `batch_stride` 0)."""
    row_bytes = box.row_elements * box.element_bytes
    extents, strides, boxes = [box.inner, box.outer], [row_bytes], [box.box_inner, box.box_outer]
    if box.batch:
        count = box.batch if batch_stride else 1
        # a batch of one never steps to a second matrix: the matrix's own size (whole rows of 16-byte
        # multiples) is a stride the driver takes
        step = batch_stride * box.element_bytes if batch_stride else row_bytes * box.outer
        extents, strides, boxes = extents + [count], strides + [step], boxes + [1]
    return extents, strides, boxes


def encode(box: TensorBox, pointer: int, batch_stride: int = 0) -> bytes:
    """The 128-byte tensor map of the matrix (or batch, its matrices `batch_stride` elements apart) at
    device address `pointer`, as `box` describes it. Raises `TensorMapError` when the driver refuses
    (check `box.describable(pointer, batch_stride)` first)."""
    storage = (ctypes.c_uint8 * (MAP_BYTES + 64))()
    address = (ctypes.addressof(storage) + 63) & ~63  # the driver wants the map 64-byte aligned
    dims, byte_strides, box_sizes = dimensions(box, batch_stride)
    rank = len(dims)
    extents = (ctypes.c_uint64 * rank)(*dims)
    strides = (ctypes.c_uint64 * (rank - 1))(*byte_strides)  # the innermost is the element's size
    box_dims = (ctypes.c_uint32 * rank)(*box_sizes)
    element_strides = (ctypes.c_uint32 * rank)(*([1] * rank))
    status = _encoder()(address, _DATA_TYPES[box.element_bytes], rank, pointer, extents, strides, box_dims,
                        element_strides, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if status != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled refused {box} at 0x{pointer:x} (batch stride {batch_stride}): "
                             f"CUresult {status}")
    return ctypes.string_at(address, MAP_BYTES)


class TensorMapCache:
    """A kernel runner's tensor maps by the operands' addresses, the latest `capacity` sets kept: encoding
    costs microseconds of host time, a dictionary lookup well under one."""

    def __init__(self, boxes: tuple[TensorBox, ...], capacity: int = 16):
        self.boxes = boxes
        self.capacity = capacity
        self._maps: dict[tuple[tuple[int, int], ...], tuple[bytes, ...] | None] = {}
        self._lock = threading.Lock()

    def maps(self, pointers: tuple[int, ...], batch_strides: tuple[int, ...] = ()) -> tuple[bytes, ...] | None:
        """One map per box for the inputs at `pointers` (for a batched launch, their matrices
        `batch_strides` elements apart), or None where a box cannot describe its input (the kernel then
        loads through registers)."""
        key = tuple((pointers[box.operand], int(batch_strides[box.operand]) if box.batch and batch_strides else 0)
                    for box in self.boxes)
        with self._lock:
            if key in self._maps:
                return self._maps[key]
        if all(box.describable(p, stride) for box, (p, stride) in zip(self.boxes, key, strict=True)):
            maps: tuple[bytes, ...] | None = tuple(encode(box, p, stride)
                                                   for box, (p, stride) in zip(self.boxes, key, strict=True))
        else:
            maps = None
        with self._lock:
            if len(self._maps) >= self.capacity:
                self._maps.pop(next(iter(self._maps)))  # the oldest
            self._maps[key] = maps
        return maps


__all__ = ["MAP_BYTES", "TensorBox", "TensorMapCache", "TensorMapError", "dimensions", "encode"]
