"""Per-GPU resource figures used by validity checks and the cost model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    """The resources of one GPU that decide which μGraphs are valid and how fast they run."""

    name: str
    shared_memory_per_block: int  # bytes a block may use (opt-in maximum)
    device_memory: int  # bytes
    multiprocessors: int
    max_threads_per_block: int = 1024
    memory_bandwidth: float = 3.0e12  # bytes / s (measured copy bandwidth)
    tensor_core_flops: float = 650e12  # dense fp16 flop / s
    launch_overhead: float = 4.3e-6  # seconds for one tiny kernel, timed as benchmarks are


H100 = GPUSpec(
    name="NVIDIA H100 80GB HBM3",
    shared_memory_per_block=227 * 1024,
    device_memory=80 * 1024**3,
    multiprocessors=132,
)

DEFAULT_GPU = H100
