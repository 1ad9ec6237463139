"""The padded plan: a large float32, bfloat16, float16 or int8 matmul whose operands' rows do not start 16-byte
aligned (an odd K or N: most sizes that are not multiples of 16 bytes' elements; for the 16-bit types, C's
rows too) computed on zero-padded copies whose rows do, so that it runs the kernels of aligned rows (TMA
wgmma, 16-byte copies) instead of copies of one element at a time, or, for the 16-bit types and int8, cuBLAS
on aligned rows (it runs theirs several times slower unaligned).

A call copies A and B into buffers of the padded shape (`autotile.codegen.padding`: each operand's contiguous
dimension rounded up to 16 bytes, K the same for both, zeros in what was added), runs the library's choice
for the padded shape on them, and copies C's columns back where N grew. All on the caller's stream, the
buffers from the inputs' framework, no synchronisation. A repeated call of one signature runs a `PaddedCall`
prepared by its first: one allocation for the buffers, three launches (the copies, the product, C's columns
back), their parameters packed once.

Where it pays (`applies`, then `pays`): the copies read and write A, B and C once more, so the padded shape's
product must be faster by more than they cost. Every first call of an unaligned problem of at least MIN_VOLUME
multiply-adds weighs the two selections (`autotile.library.calls.padded_plan`). The plan runs where the
problem is as large as where it was measured to pay on every shape (RULES, per dtype), and, for one
matrix, where the padded shape's predicted time (its tuned record's, or the shape database's model's) plus
the copies' (`copy_ms`: their bytes at the bandwidth they reach) is under the predicted time of what the call
runs as it is by MARGIN. On an H100 (2026-11-27, `tools/pad_probe.py --all`, every shape also timed through
the plan; the constants were set on these runs), on 48 random matmul shapes with N or K odd (seeds 1 and 2),
the rule took 20 and reached a geomean of 1.180x cuBLAS against 1.188 for the better of the two on every
shape (1.040 without the plan); on an H200, 1.120 against 1.125 (1.033 without) on 24 held-out shapes.
Batches of the 16-bit types weigh it on the predictions too, float32's and int8's at the measured sizes only
(BATCH_NOTE). float32 only where the setting allows the tf32x3 kernels (what its aligned shapes run). Each
type's rule and where it was measured: RULES's notes.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotile.codegen import dtypes
from autotile.codegen import padding as shapes_mod
from autotile.dispatch import precision as precision_mod

if TYPE_CHECKING:
    from autotile.dispatch.select import Selection

# batch x M x N x K below which the plan is not weighed: there the copies' launches are a good part of the
# time and the predictions' errors (25-35% on such shapes) larger than what the plan can win
MIN_VOLUME = 2**28


@dataclasses.dataclass(frozen=True)
class MeasuredSizes:
    """Sizes from which the plan was measured to pay on every shape tried: M and N, K, the volume (batch x M x
    N x K) and the product's flops per byte the copies move (`copies`) at least these; there it is taken
    whatever the predictions say."""

    min_side: int
    min_k: int
    min_volume: int
    min_flops_per_byte: float = 0.0

    def holds(self, layout: str, shape: tuple[int, ...], dtype: str) -> bool:
        *_, m, n, k = shape
        if min(m, n) < self.min_side or k < self.min_k or math.prod(shape) < self.min_volume:
            return False
        return not self.min_flops_per_byte or 2 * math.prod(shape) >= self.min_flops_per_byte * copies(
            layout, shape, dtype)[0]


@dataclasses.dataclass(frozen=True)
class DtypeRule:
    """What the plan knows of one element type: where it was measured to pay whatever the predictions say
    (`measured`), and whether a batch under those sizes takes it on the predictions as one matrix does
    (`batches_predicted`). Where cuBLAS runs the type's rows slowly unless they start 16-byte aligned
    (`autotile.codegen.dtypes.Dtype.cublas_aligned_rows`), the padded shape's cuBLAS is itself worth padding
    for, and, where C's rows are among those, C's rows are padded too."""

    measured: MeasuredSizes
    batches_predicted: bool = False


# float32: H100 and H200, 2026-11-27: 1.41-1.75x cuBLAS on random shapes with N or K odd, seeds 1 and 2 of
# tools/pad_probe.py. The predictions of the call as it is can be optimistic there (on an H200, 2053x2051x2049
# predicted 1.17x cuBLAS without the plan, measured 1.03x). cuBLAS's SGEMM runs unaligned rows at the aligned
# speed.
_FLOAT32 = DtypeRule(MeasuredSizes(1024, 512, 2**33))
# The 16-bit types: H100, 2026-11-28, tools/pad_probe.py --dtype bfloat16 --all (nn: 20 shapes, seed 1; nt: 28,
# seeds 2 and 4) and the random shapes of `python -m autotile.cli.bench_torch --dtype bfloat16 --random 40
# --seed 11`: how much the plan wins is how much slower cuBLAS runs the rows as they are (80-300 TFLOP/s,
# against 600-800 aligned; the H100's bfloat16 database, 2026-11-25: 112-220 TFLOP/s on such shapes of 16 GFLOP
# and more) against what the copies cost. Forced on every shape, it ran 1.36-3.27x torch.matmul on every
# matrix whose product has at least 107 flops per byte copied (300 TFLOP/s at the copies' 2.8 TB/s) and 2^30
# multiply-adds; under that it lost on some (737x4278x297 nt 0.89x, 3005x1375x481 nt 0.87x), and on batches of
# small matrices (24x1209x372x268 0.55x, 80x434x212x668 0.66x). float16 runs bfloat16's kernels and cuBLAS's at
# the same rate. Back to back (a model's layer: the longer of the host's time per call and the GPU's), the
# padded call's 30-32 us of host time lost on the smaller of those (bfloat16 1332x1414x701 nt 0.94x,
# 729x1720x955 0.76x torch.matmul, while 1.85x and 1.80x on the GPU; tools/pad_probe.py --max-side 2048, seed
# 6): from 2^31 multiply-adds, 1.01-1.35x back to back as well. C's rows are padded too: cuBLAS's 16-bit GEMMs
# run unaligned rows of C slowly as well (83-200 TFLOP/s on nt shapes of an odd N). Batches: BATCH_NOTE.
_SIXTEEN_BIT = DtypeRule(MeasuredSizes(256, 256, 2**31, min_flops_per_byte=107.0), batches_predicted=True)
# int8 (H100, 2026-11-28, tools/pad_probe.py --dtype int8 --all, 16 nt shapes with K or N an odd multiple of 8,
# against torch._int_mm): cuBLAS's int8 GEMM runs rows that are not 16-byte aligned up to 3x slower too
# (3120x568x6776: 133 us, 40 on the padded shape). Forced, the plan ran 1.35-1.61x on every shape of K at
# least 512 and at least 1000 flops per byte copied; under that 0.81-1.66x (487x7984x5048 0.84x, 1258x704x280
# 0.81x), and 0.96x at K = 360 (2448x3944x360). C is int32: rows of a multiple of 8 elements, the sizes
# torch._int_mm takes, are aligned already, and cuBLAS takes no other.
_INT8 = DtypeRule(MeasuredSizes(256, 512, 2**31, min_flops_per_byte=1000.0))
RULES = {"float32": _FLOAT32, "bfloat16": _SIXTEEN_BIT, "float16": _SIXTEEN_BIT, "int8": _INT8}
# What the copies cost on the GPU (`copy_ms`): on an H100 (2026-11-27, `tools/pad_probe.py --all`, 47 shapes),
# the copies' time fits 3.0e9 bytes per ms and 1.6 us per launch; a little slower here, to be safe
COPY_BYTES_PER_MS = 2.8e9  # bytes read and written per millisecond
COPY_LAUNCH_MS = 0.0025  # each copy kernel's launch and tail
# BATCH_NOTE: batches of the 16-bit types take the plan on predictions as one matrix does
# (`DtypeRule.batches_predicted`); float32's and int8's at the measured sizes only. On 120 random float32 batches
# of issue 28 (H100 and H200, 2026-11-27) the predictions took 4, two of them at 0.80x and 0.92x cuBLAS (small
# padded batches ran 1.35-1.5x slower than the model predicted), and forced on 40 (H200, 2026-11-28,
# `tools/pad_probe.py --bmm --all`, seed 3) the plan won on 3 only (float32's padded batches run through
# registers: its wgmma kernels' 3-D tensor maps are not shipped). The 16-bit types' padded batches run cuBLAS
# on aligned rows or the wgmma_direct kernels' 3-D tensor maps: forced on the same 40 bfloat16 batches (H200,
# 2026-11-28) the plan ran 1.15-3.08x the call as it is on 16 of the 20 it applied to (cuBLAS runs unaligned
# 16-bit batches at 25-100 TFLOP/s). Weighed on the predictions (the model's cuBLAS times learned from rows
# aligned as the problem's: `autotile.dispatch.model.REFERENCE_KIND_DISTANCE`) it reached 1.183x cuBLAS on those
# 40 (1.027 without the plan, 1.186 the better of the two on every batch), and 1.066 on 40 held out (seed 11;
# 1.017 without, 1.077 the better), where one batch it took ran 0.78x (135x115x314x187: cuBLAS's time
# predicted 1.7x too long).
# The plan's predicted time must be this much shorter than the call's as it is (on the runs above, 0.1 and
# 0.15 reach the same geomean on single matrices, within 0.001; 0.2 and more leave winners out).
MARGIN = 0.15
# The host's time per repeated padded call (a lookup, one allocation, three launches), in ms: back to back, a
# call takes the longer of this and its GPU time. Measured 31-32 us on an H100 and an H200 (2026-11-27,
# `python -m autotile.cli.overhead`, 2053x2051x2049), against 10-11 us for a call without copies.
HOST_MS = 0.032
DTYPES = tuple(RULES)
THREADS = 256  # per block of the copy kernels
PAD_SLOTS = 8  # parameters of one operand's copy in `autotile_pad`
BUFFER_ALIGN_BYTES = 256  # each padded buffer's start in the call's one allocation (tensor maps need 16)

_lock = threading.Lock()
_kernels: dict[tuple[str, int], dict[str, Any]] = {}
_enabled = True
_on_toggle: list[Callable[[], None]] = []  # told when `enabled` changes (the library's memoized calls)


def on_toggle(listener: Callable[[], None]) -> None:
    """Call `listener` (no arguments) whenever `enabled` turns the plan on or off: `autotile.library.calls`
    forgets its memoized calls then, as a signature memoized one way would otherwise stay so."""
    with _lock:
        if listener not in _on_toggle:
            _on_toggle.append(listener)


def enabled(on: bool | None = None) -> bool:
    """Whether the library takes the padded plan where it pays (True unless turned off); `on` sets it for
    the process first (the benchmark's tools compare with and without)."""
    global _enabled
    if on is not None and bool(on) != _enabled:
        _enabled = bool(on)
        with _lock:
            listeners = list(_on_toggle)
        for listener in listeners:
            listener()
    return _enabled


def applies(dtype: str, setting: str, kernel: str, layout: str, shape: tuple[int, ...]) -> bool:
    """Whether the padded plan is weighed for a matmul ("matmul" or "bmm") of `shape` ((batch,) M, N, K) in
    `layout`, `dtype` (one of DTYPES), under the precision `setting`: some rows not 16-byte aligned
    (`misaligned`), for float32 tf32x3 allowed (what its aligned shapes run), the volume at least
    MIN_VOLUME. Cheap: every first call asks."""
    if not _enabled or dtype not in DTYPES or kernel not in ("matmul", "bmm"):
        return False
    if dtype == "float32" and not precision_mod.allows(setting, precision_mod.MATH_CLASS["tf32x3"]):
        return False
    if math.prod(shape) < MIN_VOLUME:
        return False
    return misaligned(dtype, kernel, layout, shape)


def misaligned(dtype: str, kernel: str, layout: str, shape: tuple[int, ...]) -> bool:
    """Whether some operand's rows (or, for the types whose C cuBLAS wants aligned, C's) in `layout` on `shape`
    do not start 16-byte aligned, the arrays taken to start aligned as allocators give them."""
    # imported here: `import autotile` loads this module, and the model's (the tuning cache's filelock) only
    # where a call is this large
    from autotile.dispatch.model import cublas_rows_aligned

    return not cublas_rows_aligned(kernel, dtype, layout, shape)


def plan(layout: str, shape: tuple[int, ...], dtype: str) -> shapes_mod.PaddedShape:
    """The padded problem the plan runs (`autotile.codegen.padding.padded`): C's rows aligned too where
    cuBLAS wants them so (`_align_c`)."""
    return shapes_mod.padded(layout, shape, dtypes.get(dtype).size, align_c=_align_c(dtype))


def _align_c(dtype: str) -> bool:
    """Whether the plan pads C's rows too: cuBLAS runs the type's unaligned rows of C slowly as well."""
    return "c" in dtypes.get(dtype).cublas_aligned_rows


def copy_ms(layout: str, shape: tuple[int, ...], dtype: str, batch_strides: tuple[int, ...] = ()) -> float:
    """What the plan's copies take on the GPU, in milliseconds: the bytes they read and write (`copies`) at
    COPY_BYTES_PER_MS, and COPY_LAUNCH_MS per launch."""
    moved, launches = copies(layout, shape, dtype, batch_strides)
    return moved / COPY_BYTES_PER_MS + launches * COPY_LAUNCH_MS


def copies(layout: str, shape: tuple[int, ...], dtype: str, batch_strides: tuple[int, ...] = ()) -> tuple[int, int]:
    """The bytes the plan's copies read and write, and their launches (one for the operands' copies, one for
    C's). `batch_strides` as `PaddedCall`'s (a stride of 0: one matrix shared by the batch, copied once)."""
    size, out_size = dtypes.get(dtype).size, dtypes.itemsize(dtypes.get(dtype).output_name)
    padded = plan(layout, shape, dtype)
    *batch_dims, m, n, _k = shape
    batch = math.prod(batch_dims)
    strides = batch_strides or (1, 1)
    moved, launches = 0, 0
    for copy, stride in ((padded.a, strides[0]), (padded.b, strides[1])):
        if copy.needed:
            moved += (batch if stride else 1) * (copy.rows * copy.cols + copy.elements) * size
            launches = 1  # both operands' copies in one launch
    *_, mp, np_, _kp = padded.shape
    if (mp, np_) != (m, n):  # C written padded, its columns (or rows) copied back
        moved += batch * (m * np_ + m * n) * out_size
        launches += 1
    return moved, launches


def pays(direct: Selection, padded: Selection, layout: str, shape: tuple[int, ...], dtype: str) -> bool:
    """Whether the padded plan is faster than the call as it is, from the two problems' selections
    (`autotile.dispatch.select.Selection`): `direct`, what the call of `shape` would run, and `padded`, what
    the padded shape runs. The padded shape's choice must be what the padding is for (a generated kernel its
    tuned record or the shape database's model picked, its own or borrowed from another layout; cuBLAS only
    for the types whose rule says cuBLAS wants aligned rows; never a fallback that knows nothing of the
    shape); then either the problem is as large as the sizes measured to pay (`RULES[dtype].measured`) and
    the call as it is does not run a kernel that reads rows of any alignment at full speed (`reads_any_rows`),
    or, for one matrix or a batch of a type whose rule takes batches on predictions (`batches_predicted`), where
    both choices have a predicted time, the padded shape's plus the copies' (`copy_ms`), or the host's time
    per call (HOST_MS) where that is longer, is under the direct choice's by MARGIN."""
    if padded.step not in ("exact", "model"):
        return False
    rule = RULES[dtype]
    cublas_wants_aligned = bool(dtypes.get(dtype).cublas_aligned_rows)
    if padded.config is None and not (cublas_wants_aligned and padded.implementation == "cublas"):
        return False
    if rule.measured.holds(layout, shape, dtype) and not reads_any_rows(direct):
        return True
    # batches: on predictions where the type's rule says so (BATCH_NOTE); a choice borrowed from another
    # layout or from one matrix has no predicted time
    if len(shape) == 4 and not rule.batches_predicted:
        return False
    if direct.predicted_ms is None or padded.predicted_ms is None:
        return False
    # the copies as if no operand were shared by the batch (a shared one is copied once: cheaper)
    planned = max(padded.predicted_ms + copy_ms(layout, shape, dtype), HOST_MS)
    return planned * (1 + MARGIN) < direct.predicted_ms


def reads_any_rows(direct: Selection) -> bool:
    """Whether the call as it is runs a generated kernel that reads rows of any alignment at full speed: the
    tf32x3 kernels that split each operand once (LOADER=presplit) into an aligned workspace of their own, so
    the plan's copies buy them nothing, whatever the measured sizes say (which were measured before they
    existed): there the predictions decide. On an H200 (2026-11-28, `tools/pad_probe.py --seed 40 --max-side
    12000`) the two shapes the measured sizes took ran the same presplit config padded and as they were:
    2418x2668x2433 1.55x cuBLAS padded, 1.64x as it was; 2986x7367x2800 2.23x against 2.45x."""
    return direct.config is not None and direct.config.get("LOADER") == "presplit"


def padded_shape(layout: str, shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """The shape the padded plan runs (`autotile.codegen.padding.padded`)."""
    return plan(layout, shape, dtype).shape


def _copy_kernels(dtype: str, device: int) -> dict[str, Any]:
    """The copy kernels on `device` (current), compiled once."""
    found = _kernels.get((dtype, device))
    if found is not None:
        return found
    from autotile.codegen.build import compile_kernel

    source = shapes_mod.render(dtype)
    made = {name: compile_kernel(source, name) for name in shapes_mod.KERNEL_NAMES}
    with _lock:
        return _kernels.setdefault((dtype, device), made)


class PaddedCall:
    """The padded plan of one problem, prepared once: the copies' launches (parameters packed once, as the
    library's repeated calls do) and the padded product's launch; a call allocates the padded buffers and
    enqueues it all on its stream. `layout`, `shape` ((batch,) M, N, K) and `batch_strides` (each
    operand's, in elements; 0 for one matrix shared by the batch) as the call's plan has them, C's
    matrices packed; `prepared` runs the padded shape (the library's `_Prepared` for it); `allocate` as
    `Framework.allocate`, the inputs' framework's."""

    def __init__(self, layout: str, shape: tuple[int, ...], batch_strides: tuple[int, ...], dtype: str,
                 device: int, prepared: Any, allocate: Any):
        from autotile.runtime.impl import ParameterBlock

        self.size = dtypes.get(dtype).size
        out_dtype = dtypes.get(dtype).output_name  # int8's products are int32
        self.out_size = dtypes.itemsize(out_dtype)
        self.dtype, self.allocate = dtype, allocate
        padded = plan(layout, shape, dtype)
        self.batch = shape[0] if len(shape) == 4 else 1
        strides = batch_strides if len(shape) == 4 else (0, 0)
        kernels = _copy_kernels(dtype, device)
        *_, self.m, self.n, _k = shape
        *_, self.mp, self.np_, _kp = padded.shape
        # One allocation per call holds every padded buffer, each at `_place`'s offset (bytes) in it
        self.total_bytes = 0
        # The operands' copies, one launch for both (`autotile_pad`): each job's operand index (0: A, 1: B)
        # and its buffer's offset in bytes in the call's allocation
        self.jobs: list[tuple[int, int]] = []
        parameters = ParameterBlock(("ptr", "ptr", "int32", "int32", "int32", "int32", "int64", "int32") * 2)
        threads = counts = 0  # of the copy kernel, per matrix
        padded_strides = []
        for operand, (copy, stride) in enumerate(((padded.a, strides[0]), (padded.b, strides[1]))):
            if not copy.needed:
                padded_strides.append(stride)
                continue
            count = self.batch if stride else 1
            first_slot = PAD_SLOTS * len(self.jobs)
            values = (copy.rows, copy.cols, copy.padded_rows, copy.padded_cols, stride, count)
            for slot, value in enumerate(values, first_slot + 2):
                parameters.set(slot, value)
            self.jobs.append((operand, self._place(count * copy.elements * self.size)))
            threads = max(threads, shapes_mod.copy_threads(copy.padded_rows, copy.padded_cols, self.size))
            counts = max(counts, count)
            padded_strides.append(copy.elements if stride else 0)
        self.pad = (kernels["autotile_pad"], (-(-threads // THREADS), len(self.jobs), counts), parameters)
        self.padded_strides = tuple(padded_strides) if len(shape) == 4 else ()
        self.c_padded = (self.mp, self.np_) != (self.m, self.n)
        self.out_nbytes = self.batch * self.mp * self.np_ * self.out_size
        self.c_offset = self._place(self.out_nbytes) if self.c_padded else 0
        self.unpad: tuple[Any, tuple[int, int, int], Any] | None = None
        if self.np_ != self.n:  # C's rows grew: each matrix's first m rows, the first n of each row's np_
            parameters = ParameterBlock(("ptr", "ptr", "int32", "int32", "int32", "int64"))
            for slot, value in enumerate((self.m, self.n, self.np_, self.mp * self.np_), 2):
                parameters.set(slot, value)
            threads = shapes_mod.unpad_threads(self.m, self.n, self.np_, self.out_size)
            unpad = _copy_kernels(out_dtype, device)["autotile_unpad"]
            self.unpad = (unpad, (-(-threads // THREADS), 1, self.batch), parameters)
        runner = prepared.runner
        if prepared.direct is None and hasattr(runner, "bound_launch"):
            self.product = runner.bound_launch(self.padded_strides, self.out_nbytes, dtype, allocate)
        else:  # cuBLAS, or a test's stand-in
            def product(a_ptr: int, b_ptr: int, out_ptr: int, stream_ptr: int) -> None:
                prepared.call_pointers((a_ptr, b_ptr), out_ptr, self.out_nbytes, dtype, stream_ptr, allocate,
                                       self.padded_strides)
            self.product = product

    def _place(self, nbytes: int) -> int:
        """A buffer of `nbytes` bytes in the call's allocation: its offset in bytes (a multiple of 256)."""
        offset = -(-self.total_bytes // BUFFER_ALIGN_BYTES) * BUFFER_ALIGN_BYTES
        self.total_bytes = offset + nbytes
        return offset

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, stream_ptr: int) -> None:
        """C = A B on the stream `stream_ptr` of the operands' device (current): the copies, the padded
        product, C's columns back; the buffers from one `allocate`, returned to it once all is enqueued."""
        owner, base = self.allocate(-(-self.total_bytes // self.size), self.dtype, stream_ptr)
        base = int(base)
        pointers = [a_ptr, b_ptr]
        if self.jobs:
            kernel, grid, parameters = self.pad
            with parameters.lock:
                for job, (operand, offset) in enumerate(self.jobs):
                    parameters.set(PAD_SLOTS * job, pointers[operand])
                    parameters.set(PAD_SLOTS * job + 1, base + offset)
                kernel.launch_packed(grid, (THREADS, 1, 1), 0, stream_ptr, parameters)
            for operand, offset in self.jobs:
                pointers[operand] = base + offset
        out = base + self.c_offset if self.c_padded else c_ptr
        self.product(pointers[0], pointers[1], int(out), stream_ptr)
        if self.unpad is not None:
            kernel, grid, parameters = self.unpad
            with parameters.lock:
                parameters.set(0, out)
                parameters.set(1, c_ptr)
                kernel.launch_packed(grid, (THREADS, 1, 1), 0, stream_ptr, parameters)
        elif self.c_padded:  # only M grew (A stored K x M): each matrix's first m rows are its first m n elements
            import cupy

            row = self.m * self.n * self.out_size
            cupy.cuda.runtime.memcpy2DAsync(c_ptr, row, int(out), self.mp * self.n * self.out_size, row, self.batch,
                                            cupy.cuda.runtime.memcpyDeviceToDevice, stream_ptr)
        del owner  # back to the framework's pool on this stream: later work on it is ordered after ours


def forget() -> None:
    """Drop the compiled copy kernels (tests)."""
    with _lock:
        _kernels.clear()


__all__ = ["DtypeRule", "MARGIN", "MIN_VOLUME", "MeasuredSizes", "PaddedCall", "RULES",
           "applies", "copies", "copy_ms", "enabled", "forget", "misaligned", "on_toggle", "padded_shape", "pays",
           "plan"]
