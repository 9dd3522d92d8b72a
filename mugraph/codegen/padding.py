"""Padded register shapes of a block graph's tiles.

``tl.arange`` needs power-of-two extents and ``tl.dot`` needs every dim of at least 16 on a
GPU, so each tile dim of true size ``n > 1`` is held in registers with a padded size ``p >= n``
(masked lanes beyond ``n``). Dims that meet in an operator (the two operands of an elementwise
operator, the inner dims of a matmul, the kept dims of a reduction...) must get the same padded
size or broadcasting would misalign them: a union-find over (value, dim) slots groups them, and
each group takes the largest requirement of its members. Size-1 dims stay 1 (they broadcast).
"""

from __future__ import annotations

from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.tensor import TensorRef

Slot = tuple[TensorRef, int]


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


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
        from mugraph.codegen.decisions import reshape_groups

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
        m, k = self.dims(a)[-2:]
        n = self.dims(b)[-1]
        if min(m, k, n) > 1:  # tl.dot path: every dim at least dot_min_dim
            self.need(a, rank - 2, self.dot_min_dim)
            self.need(a, rank - 1, self.dot_min_dim)
            self.need(b, rank - 1, self.dot_min_dim)
        parts = split_matmul_parts(self.block, a, b)
        if parts is not None:  # emitted as one product per part: the parts must line up
            for pa, pb in parts:
                self._matmul(pa, pb, out)

    def run(self) -> dict[TensorRef, tuple[int, ...]]:
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
        return {
            ref: tuple(
                size[self.uf.find((ref, d))] if n > 1 else 1 for d, n in enumerate(self.dims(ref))
            )
            for ref in refs
        }


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


def padded_shapes(block: BlockGraph, dot_min_dim: int = 16) -> dict[TensorRef, tuple[int, ...]]:
    """The padded register shape of every value of ``block`` (powers of two, size-1 kept)."""
    return _Analysis(block, dot_min_dim).run()
