"""Thread-graph construction (§4.2): rule-based fusion of elementwise chains inside block graphs.

Each rule is data: a name, the law that makes it safe, and which producer / consumer kinds it
joins. A producer whose only use is one consumer is folded into it, giving a THREAD_GRAPH
operator whose program runs in registers; rules apply until none matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from mugraph.ir.graph import BlockGraph, Op, freeze_attrs
from mugraph.ir.ops import Group, OpKind
from mugraph.ir.tensor import TensorRef

_FUSIBLE = Group.ELEMENTWISE | {OpKind.THREAD_GRAPH}


@dataclass(frozen=True)
class FusionRule:
    name: str
    law: str
    producers: frozenset[OpKind]
    consumers: frozenset[OpKind]


FUSION_RULES: tuple[FusionRule, ...] = (
    FusionRule(
        "elementwise_chain",
        "(f∘g)(x)[i] = f(g(x)[i]): a composition of elementwise functions is elementwise, so "
        "the intermediate never needs to leave registers",
        frozenset(_FUSIBLE),
        frozenset(_FUSIBLE),
    ),
)


def _as_program(op: Op) -> tuple[tuple, int]:
    """(steps, number of inputs) of an elementwise op or thread graph."""
    if op.kind is OpKind.THREAD_GRAPH:
        return op.attr("program"), len(op.inputs)
    operands = tuple(range(len(op.inputs)))
    return ((op.kind, operands, op.attrs),), len(op.inputs)


def _merge(producer: Op, consumer: Op, producer_ref: TensorRef) -> Op:
    """One THREAD_GRAPH computing ``consumer`` with ``producer`` inlined."""
    p_steps, p_n = _as_program(producer)
    c_steps, c_n = _as_program(consumer)
    inputs = list(producer.inputs)
    remap_c: dict[int, int] = {}  # consumer operand -> merged operand (inputs only)
    feeds = []
    for j, ref in enumerate(consumer.inputs):
        if ref == producer_ref:
            feeds.append(j)
            continue
        if ref not in inputs:
            inputs.append(ref)
        remap_c[j] = inputs.index(ref)
    n_in = len(inputs)
    steps = []
    for kind, operands, attrs in p_steps:  # producer steps read producer inputs (same order)
        steps.append((kind, tuple(o if o < p_n else n_in + (o - p_n) for o in operands), attrs))
    p_result = n_in + len(p_steps) - 1
    for kind, operands, attrs in c_steps:
        mapped = []
        for o in operands:
            if o < c_n:
                mapped.append(p_result if o in feeds else remap_c[o])
            else:
                mapped.append(n_in + len(p_steps) + (o - c_n))
        steps.append((kind, tuple(mapped), attrs))
    return Op(
        OpKind.THREAD_GRAPH,
        tuple(inputs),
        freeze_attrs({"program": tuple(steps)}),
        consumer.outputs,
    )


def _uses(ops: list[Op]) -> dict[TensorRef, int]:
    count: dict[TensorRef, int] = {}
    for op in ops:
        for r in op.inputs:
            count[r] = count.get(r, 0) + 1
    return count


def fuse_block_graph(block: BlockGraph, rules=FUSION_RULES) -> BlockGraph:
    ops = list(block.ops)
    changed = True
    while changed:
        changed = False
        uses = _uses(ops)
        for ci, consumer in enumerate(ops):
            for ref in consumer.inputs:
                producer = ops[ref.op]
                if uses.get(ref, 0) != 1 or not any(
                    producer.kind in r.producers and consumer.kind in r.consumers for r in rules
                ):
                    continue
                ops[ci] = _merge(producer, consumer, ref)
                ops = _drop(ops, ref.op)
                changed = True
                break
            if changed:
                break
    return BlockGraph(
        block.grid_dim, block.block_dim, block.forloop_range, block.reduction_dimx, tuple(ops)
    )


def _drop(ops: list[Op], index: int) -> list[Op]:
    """Remove operator ``index`` (now unused) and renumber the references after it."""

    def shift(r: TensorRef) -> TensorRef:
        return TensorRef(r.op - 1, r.index) if r.op > index else r

    out = []
    for i, op in enumerate(ops):
        if i == index:
            continue
        out.append(Op(op.kind, tuple(shift(r) for r in op.inputs), op.attrs, op.outputs))
    return out


def construct_thread_graphs(graph):
    """A copy of kernel graph ``graph`` with every block graph's elementwise chains fused."""
    from mugraph.ir.rebuild import rebuild_kernel_graph

    ops = []
    for op in graph.ops:
        if op.kind is OpKind.CUSTOMIZED:
            fused = fuse_block_graph(op.attr("graph"))
            op = Op(op.kind, op.inputs, freeze_attrs({"graph": fused}), op.outputs)
        ops.append(op)
    return rebuild_kernel_graph(ops, list(graph.outputs))
