"""Batched wgmma_direct launches (bfloat16, float16, int8, the 8-bit floats) copy their tiles with the
tensor memory accelerator: 3-D tensor maps (rows, matrices), the batch the copies' third coordinate
(autotile/codegen/tensor_map.py); the tf32x3 wgmma kernels' batches still load through registers. Without
a GPU: the maps' dimensions, when a batch can be described, the cache of encodings, and the rendered
copies. With an sm_90 GPU (`gpu` marker): the direct kernels' copies (K-major and MN-major, a cluster's
multicast) batched with every matrix its own, with one operand shared by the whole batch, and with matrices
not 16 bytes apart (registers instead), each against a float64 reference with the output poisoned, on sides
that are not multiples of any tile; and a tf32x3 batch, through registers.
"""

from __future__ import annotations

import pytest

from autotile.codegen import kernels, tensor_map
from autotile.codegen.problem import ProblemKey
from autotile.codegen.tensor_map import TensorBox, TensorMapCache
from tests.direct_support import require_hopper

BMM, MATMUL = kernels.get("bmm"), kernels.get("matmul")


def test_a_batched_box_is_a_third_dimension_of_its_matrices():
    box = TensorBox(0, 200, 144, 32, 128, 4, batch=5)
    assert tensor_map.dimensions(box, 144 * 200) == ([200, 144, 5], [800, 144 * 200 * 4], [32, 128, 1])
    # an operand the batch shares is a batch of one
    assert tensor_map.dimensions(box, 0) == ([200, 144, 1], [800, 144 * 800], [32, 128, 1])
    one = TensorBox(0, 200, 144, 32, 128, 4)
    assert tensor_map.dimensions(one) == ([200, 144], [800], [32, 128])


def test_a_batch_is_described_only_where_its_matrices_lie_16_bytes_apart():
    box = TensorBox(0, 200, 144, 32, 128, 4, batch=5)
    assert box.describable(4096, 144 * 200) and box.describable(4096, 0)
    assert not box.describable(4096, 144 * 200 + 1)  # 4 bytes off
    assert TensorBox(0, 200, 144, 64, 128, 2, batch=5).describable(4096, 144 * 200 + 8)
    assert not TensorBox(0, 200, 144, 64, 128, 2, batch=5).describable(4096, 144 * 200 + 4)


def test_the_map_cache_encodes_per_address_and_batch_stride(monkeypatch):
    encoded = []

    def fake_encode(box, pointer, batch_stride=0):
        encoded.append((box.operand, pointer, batch_stride))
        return bytes(tensor_map.MAP_BYTES)

    monkeypatch.setattr(tensor_map, "encode", fake_encode)
    boxes = (TensorBox(0, 200, 144, 32, 128, 4, batch=5), TensorBox(1, 272, 200, 32, 32, 4, batch=5))
    cache = TensorMapCache(boxes)
    assert cache.maps((4096, 8192), (144 * 200, 0)) is not None
    assert cache.maps((4096, 8192), (144 * 200, 0)) is not None  # cached
    assert encoded == [(0, 4096, 144 * 200), (1, 8192, 0)]
    assert cache.maps((4096, 8192), (144 * 200, 200 * 272)) is not None  # another stride: encoded again
    assert len(encoded) == 4
    assert cache.maps((4096, 8192), (144 * 200 + 1, 0)) is None  # misaligned matrices: registers
    assert len(encoded) == 4


@pytest.mark.parametrize("name, dtype", [("direct-128x256-c2p", "bfloat16"), ("direct8-128x256-c2p", "int8")])
def test_batched_launches_copy_from_their_matrix_with_3d_maps(name, dtype):
    config = MATMUL.space.named(name)
    layout = "nt"
    batched = BMM.launch(config, (5, 144, 272, 208), dtype, layout)
    assert {box.batch for box in batched.tensor_maps} == {5}
    assert {box.batch for box in MATMUL.launch(config, (144, 272, 208), dtype, layout).tensor_maps} == {0}
    source = BMM.render(config, dtype, layout)
    assert "tma_load_3d" in source and "batch_a, bar" in source
    assert "tma_load_2d(dst" not in source and "tma_load_2d_multicast(dst" not in source
    assert "tma_load_3d" not in MATMUL.render(config, dtype, layout)


def test_tf32x3_batches_still_load_through_registers():
    """The tf32x3 wgmma template renders a batch's copies as before (2-D maps it is never given): its boxes
    stay 2-D, so the runner encodes none and passes the flag 0."""
    config = MATMUL.space.named("wgmma-128-tma")
    launch = BMM.launch(config, (5, 144, 272, 208), "float32", "nn")
    assert launch.tensor_maps and {box.batch for box in launch.tensor_maps} == {0}
    assert "tma_load_3d" not in BMM.render(config, "float32", "nn")


def test_the_runner_copies_a_batch_with_maps_only_where_its_boxes_are_3d(monkeypatch):
    """A batched runner encodes maps (and passes the flag 1) for the direct kernels' 3-D boxes, never for the
    tf32x3 kernels' 2-D ones, whose kernel offsets its pointers by the batch and copies through registers."""
    from autotile.runtime.impl import KernelRunner

    monkeypatch.setattr(tensor_map, "encode", lambda box, pointer, batch_stride=0: bytes(tensor_map.MAP_BYTES))

    class StubKernel:  # what the runner's constructor touches of a compiled kernel
        max_dynamic_shared_size_bytes = 1 << 20

    batch, m, n, k = SHAPE
    for name, dtype, copies in (("direct-128x256-c2p", "bfloat16", True), ("wgmma-128-tma", "float32", False)):
        launch = BMM.launch(MATMUL.space.named(name), SHAPE, dtype, "nn")
        runner = KernelRunner(StubKernel(), launch, BMM.size_args(SHAPE), batched=True)
        assert runner.uses_tensor_maps((4096, 8192), (m * k, k * n)) == copies, name
        assert not runner.uses_tensor_maps((4096, 8192), (m * k + 1, k * n)), name  # misaligned matrices


# -- on the GPU ------------------------------------------------------------------------------------------

# (config, dtype, layout): each TMA template, K-major and MN-major copies, a cluster's multicast
GPU_CASES = [("direct-128x256-c2p", "bfloat16", "nn"), ("direct-128-pps", "float16", "nt"),
             ("direct-128x256-c2ps", "bfloat16", "tn"), ("direct8-128x256-c2p", "int8", "nt"),
             ("wgmma-128-tma-p2", "float32", "nn")]
# every side a multiple of 16 elements (rows of 16-byte multiples in every type), none a multiple of a tile
SHAPE = (5, 144, 272, 208)


def _with_gap(x, xp):
    """`x` (batch x R x C, contiguous) copied into matrices one element further apart than they are long:
    a batch stride no tensor map can describe."""
    batch, rows, cols = x.shape
    flat = xp.zeros((batch, rows * cols + 1), dtype=x.dtype)
    flat[:, :rows * cols] = x.reshape(batch, rows * cols)
    view = flat[:, :rows * cols].reshape(batch, rows, cols)
    assert view.strides[0] == (rows * cols + 1) * x.itemsize
    return view


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_batched_tma_matches_float64(case):
    require_hopper()
    import cupy

    from autotile.codegen import dtypes
    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import relative_error

    name, dtype, layout = case
    config = MATMUL.space.named(name)
    rng = cupy.random.default_rng(17)
    a, b = BMM.make_inputs(SHAPE, dtype, layout, rng, cupy)
    runner = Generated(config).prepare(ProblemKey("bmm", dtype, layout, SHAPE))
    batch, m, n, k = SHAPE
    result = dtypes.get(dtype).output_name  # int8's products: int32
    output_storage = dtypes.DTYPES[result].storage if result in dtypes.DTYPES else result
    direct = config["MATH"] == "wgmma_direct"
    variants = {"own matrices": (a, b, direct), "B shared": (a, b[2], direct)}
    if layout[0] == "n":  # A stored M x K: its matrices one element apart more than they are long
        variants["A's matrices misaligned"] = (_with_gap(a, cupy), b, False)
    for what, (x, y, maps) in variants.items():
        out = cupy.empty((batch, m, n), dtype=output_storage)
        kernels.poison(out)
        runner.run((x, y), out)
        strides = tuple(int(s) for s in kernels.batch_strides((x, y)))
        assert runner.uses_tensor_maps((int(x.data.ptr), int(y.data.ptr)), strides) == maps, what
        ref = BMM.reference((x, y))
        if dtype == "int8":
            assert bool(cupy.array_equal(out.astype("float64"), ref)), what
        else:
            assert relative_error(out, ref) <= kernels.tolerance(dtype, k), what
