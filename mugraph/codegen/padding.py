"""Padded register shapes of a block graph's tiles.

``tl.arange`` needs power-of-two extents and ``tl.dot`` needs every dim of at least 16 on a
GPU, so each tile dim of true size ``n > 1`` is held in registers with a padded size ``p >= n``
(masked lanes beyond ``n``). Dims that meet in an operator (the two operands of an elementwise
operator, the inner dims of a matmul, the kept dims of a reduction...) must get the same padded
size or broadcasting would misalign them: a union-find over (value, dim) slots groups them, and
each group takes the largest requirement of its members. Size-1 dims stay 1 (they broadcast).

A reshape is a register view (``tl.reshape``) only when the padded tiles on its two sides hold
their valid elements at the same flat positions (:func:`~mugraph.codegen.decisions.
reshape_is_reinterpretation`); otherwise it goes through the block's scratch in global memory
(a store, a barrier, a load). With ``align_reshapes``, a group whose leading padded size is
too small for that is raised (:data:`RESHAPE_RULE`), within the largest tile the block
already holds.
"""

from __future__ import annotations

import math

from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.tensor import TensorRef

Slot = tuple[TensorRef, int]


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# A product with an inner dim of at most TINY_PRODUCT_K and at most TINY_PRODUCT_MACS
# multiplications (batch x M x K x N) is a broadcast product summed on CUDA cores even where
# M, K and N all exceed 1: padded to 16 for tl.dot, its operands would take 16 rows where they
# have two (RoPE's (2, 2) @ (2, head_dim / 2) of one key row), and a reshape beside it could
# not stay in registers.
TINY_PRODUCT_K = 4
TINY_PRODUCT_MACS = 512


def lowers_to_dot(block: BlockGraph, ra: TensorRef, rb: TensorRef) -> bool:
    """Whether the product of ``ra`` and ``rb`` is a ``tl.dot``: M, K and N all exceed 1 and
    the product is not tiny (:data:`TINY_PRODUCT_K`, :data:`TINY_PRODUCT_MACS`)."""
    a, b = block.tensor_type(ra).dims, block.tensor_type(rb).dims
    macs = math.prod(a[:-2]) * a[-2] * a[-1] * b[-1]
    tiny = a[-1] <= TINY_PRODUCT_K and macs <= TINY_PRODUCT_MACS
    return min(a[-2], a[-1], b[-1]) > 1 and not tiny


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[range, range]] | None:
    """Split a reshape into groups of dims with equal products (None if sizes disagree)."""
    groups = []
    i = j = 0
    while i < len(src) or j < len(dst):
        i0, j0 = i, j
        ps = pd = 1
        if i < len(src):
            ps, i = src[i], i + 1
        if j < len(dst):
            pd, j = dst[j], j + 1
        while ps != pd:
            if ps < pd and i < len(src):
                ps, i = ps * src[i], i + 1
            elif pd < ps and j < len(dst):
                pd, j = pd * dst[j], j + 1
            else:
                return None
        groups.append((range(i0, i), range(j0, j)))
    return groups


def reshape_is_reinterpretation(dims_in, pad_in, dims_out, pad_out) -> bool:
    """Whether ``tl.reshape`` of the padded tile puts every valid element where it belongs."""
    groups = reshape_groups(tuple(dims_in), tuple(dims_out))
    if groups is None:
        return False
    for gin, gout in groups:
        for group, dims, pad in ((gin, dims_in, pad_in), (gout, dims_out, pad_out)):
            if any(dims[k] != pad[k] for k in list(group)[1:]):
                return False
        if math.prod(pad_in[k] for k in gin) != math.prod(pad_out[k] for k in gout):
            return False
    return True




def reshape_pads_rows(dims_in, pad_in, dims_out, pad_out) -> bool:
    """Whether a reshape that is no reinterpretation can still stay in registers: an
    unpadded source ``tl.reshape``-d to the output's true dims (powers of two), then its first
    dim padded with zero rows (a broadcast along a new leading axis, masked to its first
    index, merged into that dim). A query row (1, 256) viewed as two heads' rows (2, 128)
    padded to 16 rows for a ``tl.dot``, say."""
    if tuple(dims_in) != tuple(pad_in) or not dims_out:
        return False
    if any(n & (n - 1) for n in dims_out):  # tl.reshape needs power-of-two extents
        return False
    return pad_out[0] > dims_out[0] and tuple(pad_out[1:]) == tuple(dims_out[1:])


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Slot, Slot] = {}

    def find(self, x: Slot) -> Slot:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: Slot, b: Slot) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


class _Analysis:
    """Collects the slot equalities and the minimum sizes of one block graph."""

    def __init__(self, block: BlockGraph, dot_min_dim: int) -> None:
        self.block = block
        self.dot_min_dim = dot_min_dim
        self.uf = _UnionFind()
        self.minimum: dict[Slot, int] = {}

    def dims(self, ref: TensorRef) -> tuple[int, ...]:
        return self.block.tensor_type(ref).dims

    def tie(self, a: TensorRef, da: int, b: TensorRef, db: int) -> None:
        """Same padded size for dim ``da`` of ``a`` and ``db`` of ``b`` (when both exceed 1)."""
        if self.dims(a)[da] > 1 and self.dims(b)[db] > 1:
            self.uf.union((a, da), (b, db))

    def tie_all(self, a: TensorRef, b: TensorRef, skip: tuple[int, ...] = ()) -> None:
        rank = len(self.dims(a))
        for d in range(rank):
            if d not in skip and d < len(self.dims(b)):
                self.tie(a, d, b, d)

    def need(self, ref: TensorRef, dim: int, size: int) -> None:
        if self.dims(ref)[dim] > 1:
            slot = (ref, dim)
            self.minimum[slot] = max(self.minimum.get(slot, 1), size)

    def visit(self, index: int, op: Op) -> None:
        out = TensorRef(index, 0)
        ins = op.inputs
        kind = op.kind
        if kind in Group.ELEMENTWISE or kind in (OpKind.THREAD_GRAPH, OpKind.RMS_NORM):
            for ref in ins:
                self.tie_all(ref, out)
        elif kind is OpKind.MATMUL:
            self._matmul(ins[0], ins[1], out)
        elif kind in Group.REDUCING:
            self.tie_all(ins[0], out, skip=(op.attr("dim"),))
        elif kind is OpKind.CONCAT:
            skip = (op.attr("dim"),)
            self.tie_all(ins[0], out, skip)
            self.tie_all(ins[1], out, skip)
        elif kind is OpKind.FORLOOP_ACCUM:
            last = len(self.dims(out)) - 1
            self.tie_all(ins[0], out, () if op.attr("acc") is AccumKind.NONE else (last,))
        elif kind is OpKind.FORLOOP_ACCUM_MAX:
            self.tie_all(ins[0], out)
        elif kind is OpKind.FORLOOP_ACCUM_RESCALE:
            last = len(self.dims(out)) - 1
            self.tie_all(ins[0], out, () if op.attr("acc") is AccumKind.NONE else (last,))
            self.tie_all(ins[1], out)
        elif kind is OpKind.RESHAPE:
            self._reshape(ins[0], out)
        # BLOCK_INPUT, BLOCK_OUTPUT: no ties

    def _reshape(self, src: TensorRef, out: TensorRef) -> None:
        """Where a group of merged or split dims holds a single dim above 1 on each side (a
        reshape that only adds or drops size-1 dims there), the two dims get one padded size,
        so the reshape is a register reinterpretation rather than a scratch round trip."""
        din, dout = self.dims(src), self.dims(out)
        groups = reshape_groups(din, dout)
        for gin, gout in groups or []:
            big_in = [d for d in gin if din[d] > 1]
            big_out = [d for d in gout if dout[d] > 1]
            if len(big_in) == 1 and len(big_out) == 1:
                self.tie(src, big_in[0], out, big_out[0])

    def _matmul(self, a: TensorRef, b: TensorRef, out: TensorRef) -> None:
        rank = len(self.dims(out))
        for d in range(rank - 2):
            self.tie(a, d, out, d)
            self.tie(b, d, out, d)
        self.tie(a, rank - 1, b, rank - 2)
        self.tie(a, rank - 2, out, rank - 2)
        self.tie(b, rank - 1, out, rank - 1)
        if lowers_to_dot(self.block, a, b):  # tl.dot path: every dim at least dot_min_dim
            self.need(a, rank - 2, self.dot_min_dim)
            self.need(a, rank - 1, self.dot_min_dim)
            self.need(b, rank - 1, self.dot_min_dim)
        parts = split_matmul_parts(self.block, a, b)
        if parts is not None:  # emitted as one product per part: the parts must line up
            for pa, pb in parts:
                self._matmul(pa, pb, out)

    def run(self, align_reshapes: bool = False) -> dict[TensorRef, tuple[int, ...]]:
        for index, op in enumerate(self.block.ops):
            self.visit(index, op)
        size: dict[Slot, int] = {}
        ops = self.block.ops
        refs = [TensorRef(i, j) for i, op in enumerate(ops) for j in range(len(op.outputs))]
        for ref in refs:
            for d, n in enumerate(self.dims(ref)):
                if n > 1:
                    root = self.uf.find((ref, d))
                    need = max(next_pow2(n), self.minimum.get((ref, d), 1))
                    size[root] = max(size.get(root, 1), need)
        if align_reshapes:
            _ReshapeAlignment(self, refs, size).run()
        return self.padded(refs, size)

    def padded(self, refs, size: dict[Slot, int]) -> dict[TensorRef, tuple[int, ...]]:
        return {
            ref: tuple(
                size[self.uf.find((ref, d))] if n > 1 else 1 for d, n in enumerate(self.dims(ref))
            )
            for ref in refs
        }


# The law the alignment relies on: tl.reshape keeps the row-major (flat) order of a tile's
# padded elements. Where every dim of a reshape group but its first is unpadded, a valid
# element's flat position inside the group is its unpadded one, so the two sides agree
# exactly when the groups' padded sizes do; padding the first dim of the smaller side further
# (more masked rows, zeros) makes them equal without moving any valid element.
RESHAPE_RULE = "pad a reshape group's first dim until both sides hold the same flat size"
ALIGN_ROUNDS = 8  # raising one group can unalign another; a few rounds reach the fixpoint


class _ReshapeAlignment:
    """Raises the padded size of a reshape group's first dim where that makes the reshape a
    register view (:data:`RESHAPE_RULE`). A raise is kept when it leaves fewer reshapes
    through scratch than before (one raise can align a reshape and unalign another) and no
    tile of the block grows beyond the largest one it already holds."""

    def __init__(self, analysis: _Analysis, refs: list[TensorRef], size: dict[Slot, int]):
        self.an = analysis
        self.refs = refs
        self.size = size
        self.reshapes = [(TensorRef(i, 0), op.inputs[0]) for i, op in enumerate(analysis.block.ops)
                         if op.kind is OpKind.RESHAPE]
        self.limit = max((math.prod(p) for p in analysis.padded(refs, size).values()), default=1)

    def run(self) -> None:
        for _ in range(ALIGN_ROUNDS):
            if not any(self.align(out, src) for out, src in self.reshapes):
                return

    def pad(self, size: dict[Slot, int], ref: TensorRef, d: int) -> int:
        return size[self.an.uf.find((ref, d))] if self.an.dims(ref)[d] > 1 else 1

    def through_scratch(self, size: dict[Slot, int]) -> int:
        """How many reshapes the padded sizes ``size`` leave to the scratch: neither a
        register view nor a reshape that pads its rows in registers."""
        pads = self.an.padded([r for pair in self.reshapes for r in pair], size)

        def in_registers(src: TensorRef, out: TensorRef) -> bool:
            shapes = (self.an.dims(src), pads[src], self.an.dims(out), pads[out])
            return reshape_is_reinterpretation(*shapes) or reshape_pads_rows(*shapes)

        return sum(not in_registers(src, out) for out, src in self.reshapes)

    def align(self, out: TensorRef, src: TensorRef) -> bool:
        """Raise one group of this reshape (True when a raise was kept)."""
        for gin, gout in reshape_groups(self.an.dims(src), self.an.dims(out)) or []:
            flat = []
            for ref, group in ((src, gin), (out, gout)):
                dims = self.an.dims(ref)
                if any(self.pad(self.size, ref, k) != dims[k] for k in list(group)[1:]):
                    break  # a padded inner dim: no first-dim padding can align it
                flat.append(math.prod(self.pad(self.size, ref, k) for k in group))
            else:
                if flat[0] == flat[1]:
                    continue
                low = (src, gin[0]) if flat[0] < flat[1] else (out, gout[0])
                if self.raise_first(*low, max(flat) // min(flat)):
                    return True
        return False

    def raise_first(self, ref: TensorRef, dim: int, factor: int) -> bool:
        if self.an.dims(ref)[dim] <= 1:
            return False  # a size-1 dim stays 1 (it broadcasts)
        root = self.an.uf.find((ref, dim))
        trial = {**self.size, root: self.size[root] * factor}
        grown = self.an.padded(self.refs, trial)
        if any(math.prod(p) > self.limit for p in grown.values()):
            return False
        if self.through_scratch(trial) >= self.through_scratch(self.size):
            return False
        self.size[root] = trial[root]
        return True


def split_matmul_parts(
    block: BlockGraph, a: TensorRef, b: TensorRef
) -> list[tuple[TensorRef, TensorRef]] | None:
    """``matmul(concat(a1, a2, -1), concat(b1, b2, -2))`` is ``a1 @ b1 + a2 @ b2`` when the
    two concatenations split the inner dim at the same place: the pairs (a1, b1), (a2, b2),
    else None. (LoRA's fused form, paper Fig 9b.)"""
    op_a, op_b = block.ops[a.op], block.ops[b.op]
    if op_a.kind is not OpKind.CONCAT or op_b.kind is not OpKind.CONCAT:
        return None
    rank = len(block.tensor_type(a).dims)
    if rank < 2 or op_a.attr("dim") != rank - 1 or op_b.attr("dim") != rank - 2:
        return None
    a1, a2 = op_a.inputs
    b1, b2 = op_b.inputs
    if block.tensor_type(a1).dims[-1] != block.tensor_type(b1).dims[-2]:
        return None
    return [(a1, b1), (a2, b2)]


def padded_shapes(block: BlockGraph, dot_min_dim: int = 16,
                  align_reshapes: bool = True) -> dict[TensorRef, tuple[int, ...]]:
    """The padded register shape of every value of ``block`` (powers of two, size-1 kept);
    with ``align_reshapes``, reshapes kept in registers where a larger first-dim padding
    allows (:class:`_ReshapeAlignment`)."""
    return _Analysis(block, dot_min_dim).run(align_reshapes)
