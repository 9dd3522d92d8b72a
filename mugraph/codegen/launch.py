"""How a generated kernel is launched: :class:`LaunchConfig` (Triton's warps and pipeline
stages, and the GEMV form the GPU ranking tunes beside them) and the defaults a block graph
gets (:func:`default_launch`, :func:`max_warps`). Code generation facts only, so the code
generator's own views of a kernel (the lowered IR) and the runtime share them;
:mod:`mugraph.runtime.compiled` re-exports them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mugraph.codegen.decisions import GEMV_FORMS, auto_unroll, wide_chained_dots
from mugraph.codegen.padding import next_pow2
from mugraph.ir.graph import BlockGraph
from mugraph.ir.ops import OpKind

SHARED_MEMORY_BUDGET = 192 * 1024  # bytes of pipelined tiles a kernel may keep in flight


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel is launched — Triton's ``num_warps`` and ``num_stages`` — and the one
    code-generation choice the GPU ranking tunes beside them: ``gemv_form``, how a for-loop
    accumulates a matrix-vector product (:class:`~mugraph.codegen.triton_gen.CodegenOptions`;
    None: the kernel's codegen options decide)."""

    num_warps: int = 4
    num_stages: int = 2
    gemv_form: str | None = None

    def to_list(self) -> list:
        """The stored form: [num_warps, num_stages], with the GEMV form when one is set."""
        base = [self.num_warps, self.num_stages]
        return base if self.gemv_form is None else [*base, self.gemv_form]

    @classmethod
    def from_list(cls, value) -> LaunchConfig:
        """The inverse of :meth:`to_list` (ValueError / TypeError on anything else)."""
        if not isinstance(value, (list, tuple)) or len(value) not in (2, 3):
            raise ValueError(f"a launch setting is [num_warps, num_stages(, gemv_form)], got "
                             f"{value!r}")
        form = str(value[2]) if len(value) == 3 else None
        if form is not None and form not in GEMV_FORMS:
            raise ValueError(f"unknown gemv_form {form!r}")
        return cls(int(value[0]), int(value[1]), form)


def loop_tile_bytes(block: BlockGraph) -> int:
    """Bytes of the input tiles a for-loop iteration loads (what one pipeline stage holds)."""
    total = 0
    for op in block.input_ops:
        if op.attr("forloop_dim") >= 0:
            t = op.outputs[0]
            total += math.prod(max(16, next_pow2(d)) if d > 1 else 1 for d in t.dims) * (
                t.dtype.itemsize
            )
    return total


LARGE_TILE = 16384  # elements of a register tile above which a kernel gets 8 warps by default


def default_launch(block: BlockGraph) -> LaunchConfig:
    """The block graph's own thread count (block_dim) as warps (at least 8 for very large
    tiles without matmuls); as many pipeline stages (up to 4) as fit the loop's tiles in
    shared memory, 1 without a for-loop or with an unrolled one."""
    warps = max(1, math.prod(block.block_dim) // 32)
    warps = 1 << (warps.bit_length() - 1)  # a power of two
    large = max((t.num_elements for op in block.ops for t in op.outputs), default=1) >= LARGE_TILE
    if large and not any(op.kind is OpKind.MATMUL for op in block.ops):
        # (not with a matmul: Triton 3.6 computed a pipelined M=128 tl.dot wrongly with 8
        # warps on an H100 while 4 were right; the tuner checks every variant it times)
        warps = max(warps, 8)
    warps = min(warps, max_warps(block))
    if block.forloop_range <= 1 or auto_unroll(block):
        stages = 1
    else:
        per_stage = max(1, loop_tile_bytes(block))
        stages = max(2, min(4, SHARED_MEMORY_BUDGET // per_stage))
    return LaunchConfig(num_warps=warps, num_stages=stages)


def max_warps(block: BlockGraph) -> int:
    """The most warps a kernel made from ``block`` may launch with: 2 with a chained dot of
    64 rows or more over an inner dim of 16 (Triton 3.6 on an H100 computed such a tl.dot of
    another dot's result wrongly, and faulted, with 4 or 8 warps, rightly with 2:
    benchmarks/RESULTS.md; wider inner dims, as in attention, were right), else 16. The
    default launch, the tuner and the benchmark runner all keep to it: a fault ends the CUDA
    context, which no check can recover from."""
    return 2 if wide_chained_dots(block) else 16
