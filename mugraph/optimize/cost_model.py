"""A cost model of μGraphs without a GPU: a pure, cheap function of the graph (no codegen).

Per kernel it counts device-memory bytes, bytes requested through L2, floating-point work
(tensor cores or not), blocks against multiprocessors (waves), and a launch overhead, and turns
them into one estimated time:

    seconds = launch + max(memory time, compute time, loop latency)

- memory time: DRAM bytes at ``gpu.memory_bandwidth``, or the busiest block's bytes over its
  waves at one multiprocessor's share (an SM can draw ``SM_BURST`` times its fair share), or
  L2 traffic at ``L2_BANDWIDTH_RATIO`` times DRAM bandwidth; whichever is slowest.
- compute time: flops at the tensor-core rate (fp16/bf16 ``tl.dot``, padded to 16) or at
  ``CUDA_CORE_RATIO`` of it, likewise bounded per multiprocessor.
- loop latency: ``ITERATION_LATENCY`` per for-loop iteration per wave (a dependent chain of
  loads that pipelining only partly hides); one in all for loops the code generator unrolls.
- register spills: when the largest register-resident tile (a computed value, or the
  product a broadcast matmul materializes; ``tl.dot`` operands stay in shared memory) holds
  more than ``REGISTER_ELEMENTS_PER_THREAD`` float32 values per thread of the default launch,
  the kernel's time is multiplied by the excess. On the H100, broadcast matmuls holding 512
  and 1024 values per thread ran 3.7x and 5.6x slower than their siblings of equal traffic
  (benchmarks/RESULTS.md, second run); attention tiles spilled at far fewer values (a 70x
  slowdown at 128), which this term does not try to model.

Inputs replicated across blocks are read from DRAM once when they fit in L2, and re-read
through L2 otherwise. The constants are rough H100 figures; rankings, not absolute times, are
what the search uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mugraph.codegen.padding import next_pow2
from mugraph.dtypes import DType
from mugraph.gpu import DEFAULT_GPU, GPUSpec
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.phase import Phase, block_phases

L2_BYTES = 50 * 1024**2  # H100 L2 capacity
L2_BANDWIDTH_RATIO = 2.5  # L2 bandwidth / DRAM bandwidth
SM_BURST = 3.0  # how many times its fair share of bandwidth one SM can draw
CUDA_CORE_RATIO = 0.1  # non-tensor-core fp32 rate / tensor-core fp16 rate
MATMUL_EFFICIENCY = 0.7  # fraction of peak tensor-core rate a good kernel reaches
SHARED_MEMORY_PER_SM = 228 * 1024
MAX_BLOCKS_PER_SM = 8
ITERATION_LATENCY = 0.15e-6  # seconds per for-loop iteration that pipelining does not hide
REGISTER_ELEMENTS_PER_THREAD = 256  # float32 tile elements per thread before spills cost time
DOT_MIN = 16
_TORCH_LAUNCHES = {OpKind.RMS_NORM: 4, OpKind.RESHAPE: 0}


@dataclass(frozen=True)
class KernelCost:
    """The estimate of one kernel (a customized operator or a PyTorch operator)."""

    label: str
    dram_bytes: float
    l2_bytes: float
    flops: float
    tensor_core_flops: float
    blocks: int
    waves: int
    launches: int
    seconds: float


@dataclass(frozen=True)
class Cost:
    """The estimate of a whole kernel graph; ``seconds`` is what candidates are ranked by."""

    seconds: float
    dram_bytes: float
    flops: float
    tensor_core_flops: float
    launches: int
    kernels: tuple[KernelCost, ...] = field(default=())

    def __lt__(self, other: Cost) -> bool:
        return self.seconds < other.seconds

    def summary(self) -> str:
        return (
            f"{self.seconds * 1e6:.1f} us est, {self.launches} launches, "
            f"{self.dram_bytes / 1e6:.2f} MB, {self.flops / 1e9:.2f} GFLOP "
            f"({self.tensor_core_flops / max(self.flops, 1):.0%} on tensor cores)"
        )


def estimate(graph, gpu: GPUSpec = DEFAULT_GPU) -> Cost:
    """Estimate the run time of kernel graph ``graph`` on ``gpu``."""
    kernels = []
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.INPUT:
            continue
        if op.kind is OpKind.CUSTOMIZED:
            ins = [graph.tensor_type(r) for r in op.inputs]
            kernels.append(_customized(op, ins, f"%{i} customized", gpu))
        else:
            kernels.append(_torch_op(graph, op, f"%{i} {op.kind.value}", gpu))
    return Cost(
        seconds=sum(k.seconds for k in kernels),
        dram_bytes=sum(k.dram_bytes for k in kernels),
        flops=sum(k.flops for k in kernels),
        tensor_core_flops=sum(k.tensor_core_flops for k in kernels),
        launches=sum(k.launches for k in kernels),
        kernels=tuple(kernels),
    )


# ---- pre-defined operators (PyTorch) ---------------------------------------------------------


def _matmul_flops(a_dims, b_dims, out_dims) -> float:
    return 2.0 * math.prod(out_dims) * a_dims[-1]


def _torch_op(graph, op: Op, label: str, gpu: GPUSpec) -> KernelCost:
    ins = [graph.tensor_type(r) for r in op.inputs]
    out = op.outputs[0]
    launches = _TORCH_LAUNCHES.get(op.kind, 1)
    moved = 0.0 if launches == 0 else sum(t.num_bytes for t in ins) + out.num_bytes
    tc = 0.0
    if op.kind is OpKind.MATMUL:
        flops = _matmul_flops(ins[0].dims, ins[1].dims, out.dims)
        tc = flops if out.dtype is not DType.float32 else 0.0
    else:
        flops = float(out.num_elements) * (3 if op.kind is OpKind.RMS_NORM else 1)
    rate = gpu.tensor_core_flops * (MATMUL_EFFICIENCY if tc else CUDA_CORE_RATIO)
    if op.kind is OpKind.RMS_NORM:
        moved *= 2  # composed of several passes
    busy = max(moved / gpu.memory_bandwidth, flops / rate) if launches else 0.0
    seconds = launches * gpu.launch_overhead + busy
    blocks = max(1, math.ceil(out.num_elements / 4096))
    waves = max(1, math.ceil(blocks / (gpu.multiprocessors * MAX_BLOCKS_PER_SM)))
    return KernelCost(label, moved, moved, flops, tc, blocks, waves, launches, seconds)


# ---- graph-defined operators -------------------------------------------------------------------


def _block_flops(block: BlockGraph) -> tuple[float, float]:
    """(all flops, tensor-core flops) of one block over all its iterations."""
    phases = block_phases(block)
    total = tc = 0.0
    for op, phase in zip(block.ops, phases, strict=True):
        if op.kind in Group.BOUNDARY:
            continue
        times = block.forloop_range if phase is Phase.LOOP or op.kind in Group.ACCUMULATOR else 1
        flops, on_tc = _block_op_flops(block, op)
        total += flops * times
        tc += flops * times if on_tc else 0.0
    return total, tc


def _block_op_flops(block: BlockGraph, op: Op) -> tuple[float, bool]:
    if op.kind is OpKind.MATMUL:
        a = block.tensor_type(op.inputs[0])
        b = block.tensor_type(op.inputs[1])
        m, k, n = a.dims[-2], a.dims[-1], b.dims[-1]
        batch = math.prod(op.outputs[0].dims[:-2])
        if min(m, k, n) > 1 and a.dtype is not DType.float32:
            padded = [max(DOT_MIN, next_pow2(x)) for x in (m, k, n)]
            return 2.0 * batch * math.prod(padded), True
        return 2.0 * batch * m * k * n, False
    size = max(t.num_elements for t in [*op.outputs, *(block.tensor_type(r) for r in op.inputs)])
    if op.kind is OpKind.THREAD_GRAPH:
        return float(size * len(op.attr("program"))), False
    if op.kind is OpKind.FORLOOP_ACCUM and op.attr("acc") is AccumKind.RMS:
        return 2.0 * size, False
    return float(size), False


def _customized(op: Op, ins, label: str, gpu: GPUSpec) -> KernelCost:
    block: BlockGraph = op.attr("graph")
    blocks = block.num_blocks
    loops = block.forloop_range
    per_block = 0.0
    dram = 0.0
    for bop, dtensor in zip(block.input_ops, ins, strict=True):
        tile = bop.outputs[0].num_bytes * (loops if bop.attr("forloop_dim") >= 0 else 1)
        per_block += tile
        requested = tile * blocks
        dram += requested if dtensor.num_bytes > L2_BYTES else min(requested, dtensor.num_bytes)
    written = sum(t.num_bytes for t in op.outputs)
    per_block += written / blocks
    dram += written
    l2 = per_block * blocks
    flops, tc = _block_flops(block)
    smem = max(1, _shared_bytes(block))
    per_sm = max(1, min(MAX_BLOCKS_PER_SM, SHARED_MEMORY_PER_SM // smem))
    waves = max(1, math.ceil(blocks / (gpu.multiprocessors * per_sm)))
    # the busiest multiprocessor runs this many blocks, at its share of the GPU's rates
    busiest = math.ceil(blocks / gpu.multiprocessors)
    sm_bw = gpu.memory_bandwidth / gpu.multiprocessors * SM_BURST
    memory = max(
        dram / gpu.memory_bandwidth,
        l2 / (gpu.memory_bandwidth * L2_BANDWIDTH_RATIO),
        per_block * busiest / sm_bw,
    )
    tc_rate = gpu.tensor_core_flops * MATMUL_EFFICIENCY
    cc_rate = gpu.tensor_core_flops * CUDA_CORE_RATIO
    compute = (tc / tc_rate + (flops - tc) / cc_rate) * gpu.multiprocessors * busiest
    # an unrolled loop (the code generator's default for short loops without a matmul, see
    # mugraph.codegen.triton_gen.auto_unroll) issues all its loads at once: one latency
    from mugraph.codegen.triton_gen import auto_unroll

    latency = waves * (1 if auto_unroll(block) else loops) * ITERATION_LATENCY
    seconds = gpu.launch_overhead + max(memory, compute, latency) * spill_factor(block)
    return KernelCost(label, dram, l2, flops * blocks, tc * blocks, blocks, waves, 1, seconds)


def _shared_bytes(block: BlockGraph) -> int:
    return sum(t.num_bytes for op in block.ops for t in op.outputs)


def spill_factor(block: BlockGraph) -> float:
    """How much slower register spills make the kernel: 1 while its largest register tile
    fits ``REGISTER_ELEMENTS_PER_THREAD`` values per thread, then the excess."""
    from mugraph.runtime.compiled import default_launch

    threads = default_launch(block).num_warps * 32
    excess = _register_tile_elements(block) / (threads * REGISTER_ELEMENTS_PER_THREAD)
    return max(1.0, excess)


def _register_tile_elements(block: BlockGraph) -> int:
    """Elements of the largest tile the kernel holds in registers (padded to powers of two):
    every computed value, and the [M, K, N] product of a matmul with M, K or N equal to 1;
    loaded tiles that only feed ``tl.dot`` stay in shared memory and do not count, nor do
    the data-movement operators of ``_NOT_IN_REGISTERS``."""
    dot_only = _dot_only_inputs(block)
    largest = 1
    for i, op in enumerate(block.ops):
        if op.kind in _NOT_IN_REGISTERS or i in dot_only:
            continue
        for t in op.outputs:
            largest = max(largest, _padded_elements(t.dims))
        if op.kind is OpKind.MATMUL:
            if not _is_dot(block, op):
                a, b = (block.tensor_type(r).dims for r in op.inputs)
                largest = max(largest, _padded_elements((*a, b[-1])))
    return largest


# outputs are stored; concats feeding a matmul are split into its parts, others go
# through scratch memory, as do reshapes that are not reinterpretations (codegen.triton_gen)
_NOT_IN_REGISTERS = frozenset({OpKind.BLOCK_OUTPUT, OpKind.CONCAT, OpKind.RESHAPE})


def _dot_only_inputs(block: BlockGraph) -> set[int]:
    """Positions of the block inputs whose every consumer is a matmul lowered to tl.dot."""
    uses = block.uses()
    return {
        i for i, op in enumerate(block.ops)
        if op.kind is OpKind.BLOCK_INPUT and uses.get(i)
        and all(_is_dot(block, block.ops[c]) for c, _ in uses[i])
    }


def _is_dot(block: BlockGraph, op: Op) -> bool:
    from mugraph.codegen.triton_gen import lowers_to_dot

    return op.kind is OpKind.MATMUL and lowers_to_dot(block, *op.inputs[:2])


def _padded_elements(dims) -> int:
    return math.prod(next_pow2(d) for d in dims)
