"""A quick device-memory-traffic estimate used to rank candidates when no better cost model or
GPU profile is at hand: bytes each kernel moves, at the GPU's bandwidth scaled by how many
multiprocessors its blocks occupy, plus a launch overhead per kernel."""

from __future__ import annotations

from mugraph.gpu import DEFAULT_GPU, GPUSpec
from mugraph.ir.ops import OpKind


def traffic_estimate(graph, gpu: GPUSpec = DEFAULT_GPU) -> float:
    """Estimated seconds for ``graph`` (a KernelGraph)."""
    total = 0.0
    for op in graph.ops:
        if op.kind is OpKind.INPUT:
            continue
        if op.kind is OpKind.CUSTOMIZED:
            block = op.attr("graph")
            moved = 0
            for bop in block.input_ops:
                tile = bop.outputs[0].num_bytes
                loops = block.forloop_range if bop.attr("forloop_dim") >= 0 else 1
                moved += tile * block.num_blocks * loops
            moved += sum(t.num_bytes for t in op.outputs)
            occupancy = min(1.0, block.num_blocks / gpu.multiprocessors)
        else:
            moved = sum(graph.tensor_type(r).num_bytes for r in op.inputs)
            moved += sum(t.num_bytes for t in op.outputs)
            occupancy = 1.0
        total += gpu.launch_overhead + moved / (gpu.memory_bandwidth * max(occupancy, 1e-3))
    return total
