"""What a GPU allows a kernel: `DeviceLimits`, and the offline profiles of the GPUs autotile knows.

The limits are plain numbers (bytes, threads, registers) so that the constraint model can be evaluated on
a machine without a GPU, against the profile of the GPU one plans to run on. Reading them off the live GPU
is the runtime's job (`autotile.runtime.device`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from autotile.errors import UnknownNameError

KiB = 1024


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """Per-block and per-SM resource limits of one GPU. Sizes in bytes, counts in threads/blocks/registers."""

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    static_smem_per_block: int  # the 48 KB a kernel may declare statically
    optin_smem_per_block: int  # dynamic shared memory after cudaFuncAttributeMaxDynamicSharedMemorySize
    smem_per_sm: int
    reserved_smem_per_block: int  # taken by the system from the SM's pool for every resident block (sm_80+)
    regs_per_block: int
    regs_per_sm: int
    max_regs_per_thread: int = 255
    warp_size: int = 32
    l2_bytes: int = 0
    live: bool = False  # read from a GPU (True) or an offline profile (False)

    @property
    def arch(self) -> str:
        """The nvcc/NVRTC target name, for example ``sm_90``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def fingerprint(self) -> str:
        """A filename-safe key that names the GPU model and its architecture, for cache files."""
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.name).strip("-")
        return f"{slug}_{self.arch}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceLimits:
        """The limits from `dataclasses.asdict` output that went through JSON or pickle (a list for a tuple)."""
        values = dict(data)
        values["compute_capability"] = tuple(values["compute_capability"])
        return cls(**values)

    def as_names(self) -> dict[str, int]:
        """The limits under the names that search-space expressions use."""
        return {
            "max_threads_per_block": self.max_threads_per_block,
            "max_threads_per_sm": self.max_threads_per_sm,
            "max_blocks_per_sm": self.max_blocks_per_sm,
            "static_smem_per_block": self.static_smem_per_block,
            "optin_smem_per_block": self.optin_smem_per_block,
            "smem_per_sm": self.smem_per_sm,
            "reserved_smem_per_block": self.reserved_smem_per_block,
            "regs_per_block": self.regs_per_block,
            "regs_per_sm": self.regs_per_sm,
            "max_regs_per_thread": self.max_regs_per_thread,
            "warp_size": self.warp_size,
            "sm_count": self.sm_count,
            "cc": self.compute_capability[0] * 10 + self.compute_capability[1],
        }


def _profile(name: str, cc: tuple[int, int], sms: int, threads_sm: int, blocks_sm: int, optin: int,
             smem_sm: int, reserved: int, l2: int) -> DeviceLimits:
    return DeviceLimits(name=name, compute_capability=cc, sm_count=sms, max_threads_per_block=1024,
                        max_threads_per_sm=threads_sm, max_blocks_per_sm=blocks_sm,
                        static_smem_per_block=48 * KiB, optin_smem_per_block=optin, smem_per_sm=smem_sm,
                        reserved_smem_per_block=reserved, regs_per_block=64 * KiB, regs_per_sm=64 * KiB,
                        l2_bytes=l2)


# Figures from the CUDA C Programming Guide's table of compute-capability limits and the vendors' data
# sheets. The P100 is the seeds' case: 48 KB per block and no opt-in above it.
PROFILES: dict[str, DeviceLimits] = {
    "p100": _profile("Tesla P100", (6, 0), 56, 2048, 32, 48 * KiB, 64 * KiB, 0, 4 * 1024 * KiB),
    "v100": _profile("Tesla V100", (7, 0), 80, 2048, 32, 96 * KiB, 96 * KiB, 0, 6 * 1024 * KiB),
    "a100": _profile("NVIDIA A100", (8, 0), 108, 2048, 32, 163 * KiB, 164 * KiB, 1 * KiB, 40 * 1024 * KiB),
    "l4": _profile("NVIDIA L4", (8, 9), 58, 1536, 24, 99 * KiB, 100 * KiB, 1 * KiB, 48 * 1024 * KiB),
    "h100": _profile("NVIDIA H100 80GB HBM3", (9, 0), 132, 2048, 32, 227 * KiB, 228 * KiB, 1 * KiB,
                     50 * 1024 * KiB),
    "h200": _profile("NVIDIA H200", (9, 0), 132, 2048, 32, 227 * KiB, 228 * KiB, 1 * KiB, 60 * 1024 * KiB),
}

DEFAULT_OFFLINE_PROFILE = "h100"


def profile(name: str) -> DeviceLimits:
    """The offline profile called `name` (case-insensitive)."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise UnknownNameError(
            f"unknown device profile {name!r}; known profiles: {', '.join(PROFILES)}") from None
