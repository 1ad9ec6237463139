"""The live GPUs: their `DeviceLimits` read through CuPy, and the choice between a live GPU and a profile."""

from __future__ import annotations

from typing import Any

from autotile.codegen.limits import DEFAULT_OFFLINE_PROFILE, PROFILES, DeviceLimits, profile
from autotile.errors import DeviceUnavailableError


def live_device(device_id: int | None = None) -> DeviceLimits:
    """The limits of a live GPU, read through CuPy. Raises `DeviceUnavailableError` without one."""
    try:
        import cupy
        from cupy.cuda import runtime
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise DeviceUnavailableError(f"CuPy is not installed ({exc}); install autotile[cuda12]") from None
    try:
        if device_id is None:
            device_id = cupy.cuda.Device().id
        props: dict[str, Any] = runtime.getDeviceProperties(device_id)
    except Exception as exc:
        raise DeviceUnavailableError(f"no usable CUDA GPU: {exc}") from None
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceLimits(
        name=name,
        compute_capability=(int(props["major"]), int(props["minor"])),
        sm_count=int(props["multiProcessorCount"]),
        max_threads_per_block=int(props["maxThreadsPerBlock"]),
        max_threads_per_sm=int(props["maxThreadsPerMultiProcessor"]),
        max_blocks_per_sm=int(props.get("maxBlocksPerMultiProcessor", 32)),
        static_smem_per_block=int(props["sharedMemPerBlock"]),
        optin_smem_per_block=int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"])),
        smem_per_sm=int(props["sharedMemPerMultiprocessor"]),
        reserved_smem_per_block=int(props.get("reservedSharedMemPerBlock", 0)),
        regs_per_block=int(props["regsPerBlock"]),
        regs_per_sm=int(props["regsPerMultiprocessor"]),
        warp_size=int(props.get("warpSize", 32)),
        l2_bytes=int(props.get("l2CacheSize", 0)),
        live=True,
    )


def live_devices() -> list[DeviceLimits]:
    """Every visible GPU, or an empty list when there is none (or no CuPy)."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return []
    return [live_device(i) for i in range(count)]


def resolve(device: str | DeviceLimits | None) -> DeviceLimits:
    """A `DeviceLimits` from a profile name, an instance, or None (the live GPU, else the default profile)."""
    if isinstance(device, DeviceLimits):
        return device
    if device:
        return profile(device)
    try:
        return live_device()
    except DeviceUnavailableError:
        return PROFILES[DEFAULT_OFFLINE_PROFILE]


def stream_is_capturing(stream_ptr: int) -> bool:
    """Whether the CUDA stream `stream_ptr` is being captured into a graph (where no memory may be allocated
    but from the capturing framework's pool, and whatever is enqueued is recorded rather than run)."""
    import cupy

    return bool(cupy.cuda.runtime.streamIsCapturing(stream_ptr))
