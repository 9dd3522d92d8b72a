"""What kind of μGraph a candidate is, independent of its tiling: its structure (which kernels,
which block operators in which order) and whether it is a split form (a kernel that cuts a
contraction over its blocks and leaves partial sums for a later kernel: split-K, split-KV /
FlashDecoding). The search keeps the best candidate of each structure; reports name the form.
"""

from __future__ import annotations

from mugraph.ir.ops import OpKind


def structure_key(graph) -> str:
    """What a μGraph computes where, without its tiling: each kernel with its operands and,
    for a custom kernel, its block operators in order (kinds, operands, accumulators) — not
    its grid, loop, maps or tile sizes. Candidates with the same key differ only in how they
    cut the work (a one-kernel form and a split form are different structures)."""
    parts = []
    for op in graph.ops:
        if op.kind is OpKind.INPUT:
            continue
        operands = ",".join(f"%{r.op}.{r.index}" for r in op.inputs)
        if op.kind is not OpKind.CUSTOMIZED:
            parts.append(f"{op.kind.value}({operands})")
            continue
        body = []
        for bop in op.attr("graph").ops:
            if bop.kind is OpKind.BLOCK_INPUT:
                body.append(f"in{bop.attr('index')}")
                continue
            acc = bop.attr("acc", None)
            name = bop.kind.value + (f"[{acc.value}]" if acc is not None else "")
            body.append(f"{name}({','.join(f'b{r.op}' for r in bop.inputs)})")
        parts.append(f"custom({operands}){{{'; '.join(body)}}}")
    return " ".join(parts)


def splits_contraction(block) -> bool:
    """Does the block graph's grid cut a dim that a matmul sums over (the last dim of its
    left operand, the second-to-last of its right one), so that each block computes a partial
    sum of the contraction?"""
    inputs = {i: op for i, op in enumerate(block.ops) if op.kind is OpKind.BLOCK_INPUT}
    for op in block.ops:
        if op.kind is not OpKind.MATMUL:
            continue
        for side, ref in enumerate(op.inputs[:2]):
            source = inputs.get(ref.op)
            if source is None:
                continue
            rank = len(source.outputs[0].dims)
            contracted = rank - 1 if side == 0 else rank - 2
            for size, dim in zip(block.grid_dim, source.attr("imap"), strict=True):
                if size > 1 and dim == contracted:
                    return True
    return False


def is_split_form(graph) -> bool:
    """A custom kernel writes partial sums of a contraction cut over its blocks (split-K,
    split-KV) that a later custom kernel combines."""
    kernels = [op for op in graph.ops if op.kind is OpKind.CUSTOMIZED]
    return any(splits_contraction(op.attr("graph")) for op in kernels[:-1])


def custom_kernel_count(graph) -> int:
    return sum(1 for op in graph.ops if op.kind is OpKind.CUSTOMIZED)


def describe_form(graph) -> str:
    """A short name of the candidate's form: "1 kernel", "2 kernels, split" ..."""
    n = custom_kernel_count(graph)
    others = sum(1 for op in graph.ops if op.kind not in (OpKind.INPUT, OpKind.CUSTOMIZED))
    text = f"{n} kernel{'s' if n != 1 else ''}"
    if is_split_form(graph):
        text += ", split (partial sums combined by a later kernel)"
    if others:
        text += f" + {others} pre-defined operator{'s' if others != 1 else ''}"
    return text
