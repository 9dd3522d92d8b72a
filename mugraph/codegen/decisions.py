"""The code generator's decisions about a block graph, as pure functions of it (and of the
codegen options): which leading dims the register tiles leave out, which products are
``tl.dot``, which reshapes only reinterpret, whether a for-loop is unrolled, which inputs are
streamed, which accumulators add up a matrix-vector product, which dots are chained.

The lowering (:mod:`mugraph.codegen.lowered`) applies them to a kernel and states the result
as data; the Triton emitter (:mod:`mugraph.codegen.triton_gen`) reads that data; the launch
defaults (:mod:`mugraph.codegen.launch`) and the cost model consult the same functions. None of
them computes a Triton text.
"""

from __future__ import annotations

from dataclasses import dataclass

from mugraph.codegen.padding import (  # noqa: F401 - shape rules, re-exported here
    TINY_PRODUCT_K,
    TINY_PRODUCT_MACS,
    lowers_to_dot,
    next_pow2,
    reshape_groups,
    reshape_is_reinterpretation,
    reshape_pads_rows,
    split_matmul_parts,
)
from mugraph.errors import UnsupportedError
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.phase import Phase, block_phases
from mugraph.ir.tensor import TensorRef

LOOP = Phase.LOOP


@dataclass(frozen=True)
class CodegenOptions:
    """Choices that change the generated source but never what it computes.

    max_tile_elements: the largest padded register tile accepted (UnsupportedError beyond).
    dot_min_dim: the smallest padded M, K, N of a ``tl.dot`` (16 on NVIDIA GPUs).
    hoist_invariants: compute for-loop-invariant values once before the loop (True) or
        recompute them in every iteration (False: less register pressure).
    unroll: unroll the for-loop completely (``tl.static_range``): every iteration's loads
        can be issued before the first is used. For short loops over small tiles (the
        combination of partial sums), where one memory latency per iteration would dominate;
        long loops over large tiles are better pipelined by Triton (``num_stages``). None:
        :func:`auto_unroll` decides.
    interpret: emit for Triton's CPU interpreter (no bf16 ``tl.dot``).
    index64: 64-bit address arithmetic (tensors spanning 2**31 elements or more).
    stable_exp: subtract the running row maximum inside a softmax-shaped for-loop's exp
        (:mod:`mugraph.codegen.stable_exp`): the same real function, without overflow.
    defer_reductions: an accumulator that reduces its tile's last dim (sum, mean, rms) adds
        whole tiles in the loop and reduces once after it, when the tile has at most
        ``DEFER_MAX_ELEMENTS`` elements: no cross-thread reduction (and its barrier) per
        iteration. (On an H100, RMSNorm+Linear at suite sizes: 35.8 µs with the reduction in
        the loop, 28.1 µs without any; benchmarks/probe_variants.py.)
    gemv_form: how a for-loop accumulates a matrix-vector product (a matmul with one row,
        M = 1, computed in the loop and used only by an accumulator): ``"broadcast"`` sums
        each iteration's product over K in the loop (a cross-thread reduction per
        iteration); ``"defer"`` adds the unreduced [K, N] products and reduces over K once
        after the loop; ``"dot"`` pads the row to ``dot_min_dim`` zero rows and accumulates
        ``tl.dot`` results (tensor cores), reducing the rows after the loop. All three
        compute the same sums (in float32, in different orders).
    stream_loads: an input tile that no other block reads (:func:`streamed_input`) is
        loaded with the evict-first L2 policy: a tensor streamed through once (weights,
        the KV cache, partial sums) does not push out of L2 what is there, and lines other
        kernels left dirty are not written back to make room for it.
    split_mixed_loads: a for-loop input tile read both by a ``tl.dot`` and by another
        operator (RMSNorm's sum of squares beside X @ W) is loaded a second time, with its
        own L2 policy, for the other operator (:func:`mixed_dot_loads`). With one load, Triton
        3.6 pipelined the tile for the dot and read the other use from a buffer the next
        stage was refilling: on an H100 a 512-row norm + projection tiled 64 x 128 (K tiles
        of 64 or 128, 2-4 stages, 4 or 8 warps) gave wrong elements that changed from run
        to run (benchmarks/RESULTS.md, fourteenth session).
    chain_launches: a kernel whose outputs only the next kernel reads (partial sums and the
        kernel combining them) runs with it in one launch (:mod:`mugraph.codegen.chained`).
        Read by the compiled program, not by a kernel's code generation. Off by default: on
        the H100 it was more than 1% slower on 18 of the 28 suite rows and more than 1%
        faster on none (falcon b8 14.9 -> 22.0 us; benchmarks/RESULTS.md, sixth session).
    align_reshapes: a reshape whose padded tiles do not line up (a value padded to 16 rows
        for a ``tl.dot`` viewed as twice the rows of half the width, RoPE's halves) gets a
        larger first-dim padding where that makes it a ``tl.reshape`` of registers, instead
        of a round trip through the block's scratch in global memory
        (:func:`mugraph.codegen.padding.padded_shapes`).
    """

    max_tile_elements: int = 1 << 17
    dot_min_dim: int = 16
    hoist_invariants: bool = True
    unroll: bool | None = None
    interpret: bool = False
    index64: bool = False
    stable_exp: bool = True
    defer_reductions: bool = True
    gemv_form: str = "broadcast"
    stream_loads: bool = True
    split_mixed_loads: bool = True
    chain_launches: bool = False
    align_reshapes: bool = True

    def __post_init__(self) -> None:
        if self.gemv_form not in GEMV_FORMS:
            raise UnsupportedError(
                f"CodegenOptions: gemv_form {self.gemv_form!r} is not one of {GEMV_FORMS}")


GEMV_FORMS = ("broadcast", "defer", "dot")
DEFER_MAX_ELEMENTS = 4096  # largest per-iteration tile an accumulator keeps whole
# accumulators that reduce their tile's last dim (a deferred reduction keeps whole tiles)
REDUCING_ACCUMULATORS = frozenset({AccumKind.SUM, AccumKind.MEAN, AccumKind.RMS})


AUTO_UNROLL_MAX = 32  # longest for-loop unrolled by default


def auto_unroll(block: BlockGraph) -> bool:
    """Whether a for-loop is unrolled by default: short loops without a matmul inside (the
    combination of partial sums), whose iterations are one small load each."""
    if not 1 < block.forloop_range <= AUTO_UNROLL_MAX:
        return False
    phases = block_phases(block)
    return not any(
        op.kind is OpKind.MATMUL and phase is LOOP
        for op, phase in zip(block.ops, phases, strict=True)
    )


def unrolled(block: BlockGraph, options: CodegenOptions) -> bool:
    """Whether the kernel of ``block`` gets an unrolled for-loop with these options."""
    return auto_unroll(block) if options.unroll is None else options.unroll


def streamed_input(block: BlockGraph, op: Op) -> bool:
    """Whether each element of input ``op`` is read by one block, once: every grid axis of
    more than one block maps to a dim of the tensor (none replicates it), and a for-loop
    either walks along the tensor or is absent."""
    imap = op.attr("imap")
    partitioned = all(d >= 0 or g == 1 for g, d in zip(block.grid_dim, imap, strict=True))
    return partitioned and (op.attr("forloop_dim") >= 0 or block.forloop_range == 1)


def mixed_dot_loads(block: BlockGraph) -> frozenset[int]:
    """Positions of the input operators whose tile is loaded in the for-loop and read both by
    a matmul lowered to ``tl.dot`` and by another operator (see ``split_mixed_loads``)."""
    if block.forloop_range <= 1:
        return frozenset()
    phases = block_phases(block)
    uses = block.uses()
    found = set()
    for i, op in enumerate(block.ops):
        if op.kind is not OpKind.BLOCK_INPUT or phases[i] is not LOOP:
            continue
        readers = [block.ops[c] for c, _ in uses.get(i, [])]
        dots = [r for r in readers if is_dot(block, r)]
        if dots and len(dots) < len(readers):
            found.add(i)
    return frozenset(found)


AXIS_OPS = frozenset({OpKind.REDUCTION, OpKind.REDUCTION_MAX, OpKind.CONCAT})  # a "dim" attr


def squeezed_lead(block: BlockGraph) -> int:
    """How many leading dims the kernel's register tiles leave out: 1 when every tensor of the
    block graph has rank 3 or more and a leading dim of size 1 (and no operator works along
    that dim or changes ranks), else 0. Its offsets then enter addresses as scalars."""
    types = [t for op in block.ops for t in op.outputs]
    if not types or any(len(t.dims) < 3 or t.dims[0] != 1 for t in types):
        return 0
    for op in block.ops:
        if op.kind is OpKind.RESHAPE:
            return 0
        if op.kind in AXIS_OPS and op.attr("dim") % len(op.outputs[0].dims) == 0:
            return 0
    return 1


def is_dot(block: BlockGraph, op: Op) -> bool:
    """Whether ``op`` is a matmul emitted as a ``tl.dot`` (:func:`lowers_to_dot`)."""
    return op.kind is OpKind.MATMUL and lowers_to_dot(block, *op.inputs[:2])


def has_dot(block: BlockGraph) -> bool:
    """Whether a block graph has a product emitted as a ``tl.dot``."""
    return any(is_dot(block, op) for op in block.ops)


def derived_from_dot(block: BlockGraph, ref: TensorRef) -> bool:
    """Whether ``ref``'s register tile is computed, in this kernel, from a ``tl.dot`` result."""
    seen, todo = set(), [ref]
    while todo:
        r = todo.pop()
        if r.op in seen:
            continue
        seen.add(r.op)
        op = block.ops[r.op]
        if is_dot(block, op):
            return True
        todo.extend(op.inputs)
    return False


CHAINED_DOT_NARROW_K = 16  # padded inner dim of a chained tl.dot that needs two warps


def wide_chained_dots(block: BlockGraph) -> list[int]:
    """Matmuls emitted as a ``tl.dot`` of at least 64 rows and an inner dim of at most 16
    whose operand is computed from another ``tl.dot``'s result (see
    :func:`mugraph.runtime.compiled.default_launch`). On an H100 with Triton 3.6 such a dot
    (LoRA's (X @ A) @ B with rank 16, 64 rows) faulted with 4 warps, while attention's
    exp(Q K) @ V with inner dims 32 and 64 and 32, 64 or 128 rows was right with 2, 4 and 8
    (benchmarks/probe_variants.py, part ``chain``)."""
    found = []
    for i, op in enumerate(block.ops):
        if op.kind is not OpKind.MATMUL:
            continue
        pairs = split_matmul_parts(block, op.inputs[0], op.inputs[1]) or [op.inputs[:2]]
        if any(_narrow_chained_dot(block, ra, rb) for ra, rb in pairs):
            found.append(i)
    return found


def _narrow_chained_dot(block: BlockGraph, ra: TensorRef, rb: TensorRef) -> bool:
    if not lowers_to_dot(block, ra, rb):
        return False
    transposed = derived_from_dot(block, rb)  # emitted as (B^T A^T)^T: N rows
    if not (transposed or derived_from_dot(block, ra)):
        return False
    a, b = block.tensor_type(ra).dims, block.tensor_type(rb).dims
    rows = b[-1] if transposed else a[-2]
    return rows >= 64 and next_pow2(a[-1]) <= CHAINED_DOT_NARROW_K


def gemv_accumulators(block: BlockGraph) -> list[int]:
    """Positions of the accumulators (no reduction of their own) that add up a
    matrix-vector product over the for-loop — a matmul of one row (M = 1), K and N above 1,
    computed in the loop and used by nothing else: where ``gemv_form`` changes the code."""
    if block.forloop_range <= 1:
        return []
    phases, uses = block_phases(block), block.uses()
    found = []
    for i, op in enumerate(block.ops):
        if op.kind is not OpKind.FORLOOP_ACCUM or op.attr("acc") is not AccumKind.NONE:
            continue
        src = op.inputs[0]
        product = block.ops[src.op]
        if (product.kind is not OpKind.MATMUL or phases[src.op] is not LOOP
                or len(uses.get(src.op, ())) != 1
                or split_matmul_parts(block, *product.inputs) is not None):
            continue
        a, b = (block.tensor_type(r).dims for r in product.inputs)
        if a[-2] == 1 and a[-1] > 1 and b[-1] > 1:
            found.append(i)
    return found

