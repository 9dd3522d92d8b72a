"""A cost model of μGraphs without a GPU: a pure, cheap function of the graph (no codegen).

Per kernel it counts device-memory bytes, bytes requested through L2, floating-point work
(tensor cores or not), blocks against multiprocessors (waves), the length of a for-loop
iteration, register pressure and the size of the tiles loaded per iteration, and a launch
overhead, and turns them into one estimated time:

    seconds = launch + max(memory time, compute time, loop latency) · spills · large loads

- memory time: DRAM bytes at ``gpu.memory_bandwidth``, or the busiest block's bytes over its
  waves at one multiprocessor's share (an SM can draw ``sm_burst`` times its fair share), or
  L2 traffic at ``l2_bandwidth_ratio`` times DRAM bandwidth; whichever is slowest.
- compute time: flops at the tensor-core rate (fp16/bf16 ``tl.dot``, padded to 16) or at
  ``cuda_core_ratio`` of it, likewise bounded per multiprocessor.
- loop latency: per for-loop iteration per wave, ``iteration_latency``, plus
  ``chain_latency`` for each further operator on the iteration's longest dependent chain
  (dot → exp → dot in attention), plus ``reduction_latency`` for each matmul done as a
  broadcast product and a reduction (M, K or N of 1: no ``tl.dot``); one iteration in all
  for loops the code generator unrolls.
- register spills: the register tiles live in one iteration (values computed in the loop,
  broadcast products, accumulators; ``tl.dot`` operands stay in shared memory), or the
  largest register tile, per thread of the default launch, over
  ``register_elements_per_thread``, to the power ``spill_exponent``. Attention kernels held
  to 2 warps with 64-row tiles ran 30-160x slower than their siblings on the H100.
- large loads: the tiles loaded per iteration per thread over ``load_elements_per_thread``,
  to the power ``load_exponent`` (a few huge iterations pipeline worse than many moderate
  ones: 2-iteration GEMV loops ran 2x slower than 16-iteration ones of equal traffic).

Inputs replicated across blocks are read from DRAM once when they fit in L2, and re-read
through L2 otherwise.

The register and shared-memory figures are the model's own, not the lowered IR's
(:mod:`mugraph.codegen.lowered`), though both speak of the same kernel: the model leaves every
load that only feeds ``tl.dot`` out of the registers and pads to powers of two, the lowered
IR keeps such loads in registers unless a pipelined loop stages them and pads ``tl.dot``
dims to 16 (largest tile: 13 of the 65 known kernels differ, two estimates with them,
gated_mlp_b1 %3 30.3 -> 65.9 us); the model's ``smem`` is every block tensor's bytes, the
lowered IR's the pipelined stages' (all 65 differ, no known kernel's estimate with them).
Read from the lowered IR, 14 of 465 H100-timed candidates change estimate and the ranking
gets worse (mean Spearman 0.462 -> 0.448, pooled 0.710 -> 0.702; the two changed by ``smem``
move away from their measurement, lora_llama7b_b1 135 -> 169 us against 43 us measured), and
lowering costs about 560 us per kernel against the model's 150 us (2 cores):
``python tests/cost_snapshot.py --lowered --time``. Refitting the constants to the lowered
figures is future work; tests/golden/cost_estimates.json pins the estimates.

The constants (:class:`CostParams`) were fitted to measurements; the
fit and its held-out rank correlations are in benchmarks/RESULTS.md ("Ranking").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from mugraph.codegen.decisions import is_dot
from mugraph.codegen.padding import next_pow2
from mugraph.dtypes import DType
from mugraph.gpu import DEFAULT_GPU, GPUSpec
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.phase import Phase, block_phases

L2_BYTES = 50 * 1024**2  # H100 L2 capacity
SHARED_MEMORY_PER_SM = 228 * 1024
MAX_BLOCKS_PER_SM = 8
DOT_MIN = 16
_TORCH_LAUNCHES = {OpKind.RMS_NORM: 4, OpKind.RESHAPE: 0, OpKind.PERMUTE: 0}


@dataclass(frozen=True)
class CostParams:
    """The model's constants. The bandwidth and rate ratios are rough H100 figures; the
    latency, spill and load terms were fitted to 233 candidates timed on an H100
    (``benchmarks/bench_ranking.py``, ``benchmarks/ranking_fit.py``; benchmarks/RESULTS.md,
    "Ranking"). Rankings, not absolute times, are what the search uses."""

    l2_bandwidth_ratio: float = 2.5  # L2 bandwidth / DRAM bandwidth
    sm_burst: float = 3.0  # how many times its fair share of bandwidth one SM can draw
    cuda_core_ratio: float = 0.1  # non-tensor-core fp32 rate / tensor-core fp16 rate
    matmul_efficiency: float = 0.7  # fraction of peak tensor-core rate a good kernel reaches
    iteration_latency: float = 0.3e-6  # seconds per for-loop iteration pipelining leaves
    chain_latency: float = 0.1e-6  # seconds per further dependent operator of an iteration
    reduction_latency: float = 0.3e-6  # seconds per broadcast (not tl.dot) matmul an iteration
    register_elements_per_thread: int = 96  # values per thread before spills cost time
    spill_exponent: float = 3.0
    load_elements_per_thread: int = 256  # elements loaded per thread per iteration
    load_exponent: float = 1.0


DEFAULT_PARAMS = CostParams()


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


def estimate(graph, gpu: GPUSpec = DEFAULT_GPU, params: CostParams = DEFAULT_PARAMS) -> Cost:
    """Estimate the run time of kernel graph ``graph`` on ``gpu``."""
    kernels = []
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.INPUT:
            continue
        if op.kind is OpKind.CUSTOMIZED:
            ins = [graph.tensor_type(r) for r in op.inputs]
            kernels.append(_customized(op, ins, f"%{i} customized", gpu, params))
        else:
            kernels.append(_torch_op(graph, op, f"%{i} {op.kind.value}", gpu, params))
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


def _torch_op(graph, op: Op, label: str, gpu: GPUSpec, params: CostParams) -> KernelCost:
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
    rate = gpu.tensor_core_flops * (params.matmul_efficiency if tc else params.cuda_core_ratio)
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
        if is_dot(block, op) and a.dtype is not DType.float32:  # (not a tiny product)
            padded = [max(DOT_MIN, next_pow2(x)) for x in (m, k, n)]
            return 2.0 * batch * math.prod(padded), True
        return 2.0 * batch * m * k * n, False
    size = max(t.num_elements for t in [*op.outputs, *(block.tensor_type(r) for r in op.inputs)])
    if op.kind is OpKind.THREAD_GRAPH:
        return float(size * len(op.attr("program"))), False
    if op.kind is OpKind.FORLOOP_ACCUM and op.attr("acc") is AccumKind.RMS:
        return 2.0 * size, False
    return float(size), False


@dataclass(frozen=True)
class KernelFeatures:
    """What the cost of one custom kernel depends on, independent of the model's constants."""

    blocks: int
    loops: int
    unrolled: bool
    threads: int  # of the default launch
    per_block: float  # bytes one block reads and writes
    dram: float  # bytes to and from device memory
    written: float
    flops: float  # per block, all iterations
    tc_flops: float
    smem: int
    live_elements: int  # register-tile elements live in a for-loop iteration (padded)
    largest_tile: int  # the largest register tile (padded elements)
    loaded_elements: int  # elements of the tiles loaded per iteration (padded)
    chain: int  # dependent compute operators on the longest path of an iteration
    reductions: int  # broadcast (not tl.dot) matmuls in the loop


def _customized(op: Op, ins, label: str, gpu: GPUSpec, params: CostParams) -> KernelCost:
    f = kernel_features(op.attr("graph"), tuple(ins), tuple(op.outputs))
    seconds, waves = kernel_seconds(f, gpu, params)
    return KernelCost(label, f.dram, f.per_block * f.blocks, f.flops * f.blocks,
                      f.tc_flops * f.blocks, f.blocks, waves, 1, seconds)


@lru_cache(maxsize=4096)
def kernel_features(block: BlockGraph, ins: tuple, outs: tuple) -> KernelFeatures:
    """The features of the kernel made from ``block`` reading device tensors ``ins`` and
    writing ``outs`` (TensorTypes)."""
    from mugraph.codegen.decisions import auto_unroll
    from mugraph.runtime.compiled import default_launch

    blocks = block.num_blocks
    loops = block.forloop_range
    per_block = 0.0
    dram = 0.0
    for bop, dtensor in zip(block.input_ops, ins, strict=True):
        tile = bop.outputs[0].num_bytes * (loops if bop.attr("forloop_dim") >= 0 else 1)
        per_block += tile
        requested = tile * blocks
        dram += requested if dtensor.num_bytes > L2_BYTES else min(requested, dtensor.num_bytes)
    written = float(sum(t.num_bytes for t in outs))
    per_block += written / blocks
    dram += written
    flops, tc = _block_flops(block)
    live, loaded, chain, reductions = _loop_profile(block)
    return KernelFeatures(
        blocks=blocks, loops=loops, unrolled=auto_unroll(block),
        threads=default_launch(block).num_warps * 32, per_block=per_block, dram=dram,
        written=written, flops=flops, tc_flops=tc, smem=max(1, _shared_bytes(block)),
        live_elements=live, largest_tile=_register_tile_elements(block),
        loaded_elements=loaded, chain=chain, reductions=reductions,
    )


def kernel_seconds(f: KernelFeatures, gpu: GPUSpec, params: CostParams) -> tuple[float, int]:
    """(estimated seconds, waves) of a kernel with features ``f``."""
    per_sm = max(1, min(MAX_BLOCKS_PER_SM, SHARED_MEMORY_PER_SM // f.smem))
    waves = max(1, math.ceil(f.blocks / (gpu.multiprocessors * per_sm)))
    # the busiest multiprocessor runs this many blocks, at its share of the GPU's rates
    busiest = math.ceil(f.blocks / gpu.multiprocessors)
    sm_bw = gpu.memory_bandwidth / gpu.multiprocessors * params.sm_burst
    memory = max(
        f.dram / gpu.memory_bandwidth,
        f.per_block * f.blocks / (gpu.memory_bandwidth * params.l2_bandwidth_ratio),
        f.per_block * busiest / sm_bw,
    )
    tc_rate = gpu.tensor_core_flops * params.matmul_efficiency
    cc_rate = gpu.tensor_core_flops * params.cuda_core_ratio
    compute = (f.tc_flops / tc_rate + (f.flops - f.tc_flops) / cc_rate) * (
        gpu.multiprocessors * busiest)
    # an unrolled loop (the code generator's default for short loops without a matmul, see
    # mugraph.codegen.triton_gen.auto_unroll) issues all its loads at once: one latency
    iteration = (params.iteration_latency + params.chain_latency * max(0, f.chain - 1)
                 + params.reduction_latency * f.reductions)
    latency = waves * (1 if f.unrolled else f.loops) * iteration
    slowdown = spill_factor_of(f, params) * load_factor_of(f, params)
    return gpu.launch_overhead + max(memory, compute, latency) * slowdown, waves


def spill_factor_of(f: KernelFeatures, params: CostParams) -> float:
    """Register spills: 1 while the register tiles live in an iteration (or the largest
    tile) fit ``register_elements_per_thread`` values per thread, then the excess to the
    power ``spill_exponent``."""
    held = max(f.live_elements, f.largest_tile) / f.threads
    return max(1.0, held / params.register_elements_per_thread) ** params.spill_exponent


def load_factor_of(f: KernelFeatures, params: CostParams) -> float:
    """Large tiles loaded per iteration: 1 while they fit ``load_elements_per_thread`` per
    thread, then the excess to the power ``load_exponent`` (few, huge loads pipeline badly)."""
    per_thread = f.loaded_elements / f.threads
    return max(1.0, per_thread / params.load_elements_per_thread) ** params.load_exponent


_CHAIN_KINDS = Group.ELEMENTWISE | {OpKind.MATMUL, OpKind.THREAD_GRAPH}


def _loop_profile(block: BlockGraph) -> tuple[int, int, int, int]:
    """(live register elements, loaded elements, dependent chain length, broadcast matmuls)
    of one for-loop iteration (of the whole body when there is no loop)."""
    phases = block_phases(block)
    dot_only = _dot_only_inputs(block)
    live = loaded = reductions = 0
    depth: dict[int, int] = {}
    for i, op in enumerate(block.ops):
        phase = phases[i]
        if op.kind is OpKind.BLOCK_INPUT:
            if phase is Phase.LOOP or block.forloop_range == 1:
                loaded += sum(_loaded_elements(t.dims) for t in op.outputs)
            if phase is Phase.LOOP and i not in dot_only:
                live += sum(_padded_elements(t.dims) for t in op.outputs)
            continue
        if op.kind in _NOT_IN_REGISTERS:
            continue
        in_loop = phase is Phase.LOOP or op.kind in Group.ACCUMULATOR
        if in_loop:
            live += sum(_padded_elements(t.dims) for t in op.outputs)
        if op.kind is OpKind.MATMUL and phase is Phase.LOOP and not is_dot(block, op):
            reductions += 1
            a, b = (block.tensor_type(r).dims for r in op.inputs)
            live += _padded_elements((*a, b[-1]))
        before = max((depth.get(r.op, 0) for r in op.inputs), default=0)
        counts = phase is Phase.LOOP and op.kind in _CHAIN_KINDS
        depth[i] = before + (1 if counts else 0)
    return live, loaded, max(depth.values(), default=0), reductions


def _loaded_elements(dims) -> int:
    return math.prod(max(DOT_MIN, next_pow2(d)) if d > 1 else 1 for d in dims)


def _shared_bytes(block: BlockGraph) -> int:
    return sum(t.num_bytes for op in block.ops for t in op.outputs)


def spill_factor(block: BlockGraph, params: CostParams = DEFAULT_PARAMS) -> float:
    """How much slower register spills make the kernel made from ``block`` (see
    :func:`spill_factor_of`)."""
    ins = tuple(op.attr("dtensor") for op in block.input_ops)
    outs = tuple(block.tensor_type(op.inputs[0]) for op in block.output_ops)
    return spill_factor_of(kernel_features(block, ins, outs), params)


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
            if not is_dot(block, op):
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
        and all(is_dot(block, block.ops[c]) for c, _ in uses[i])
    }


def _padded_elements(dims) -> int:
    return math.prod(next_pow2(d) for d in dims)
