"""Rebuild a graph from frozen operators through the builders, so every check runs again.

Used by ``from_json`` and by anything that assembles operators directly (the search), so a
graph that did not pass the builder's checks can never come into being.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mugraph.errors import GraphStructureError, MugraphError
from mugraph.ir.builder import KernelGraph, ThreadBlockGraph
from mugraph.ir.graph import BlockGraph, Op, accumulates
from mugraph.ir.ops import Group, OpKind
from mugraph.ir.tensor import DTensor, TensorRef


def rebuild_kernel_graph(ops: list[Op], outputs: list[TensorRef]) -> KernelGraph:
    graph = KernelGraph()
    handles: list[list[DTensor]] = []
    for i, op in enumerate(ops):
        args = [_lookup(handles, r, i) for r in op.inputs]
        with _located(f"operator {i} ({op.kind.value})"):
            if op.kind is OpKind.INPUT:
                t = op.outputs[0]
                made = [graph.new_input(t.dims, t.strides, t.dtype)]
            elif op.kind is OpKind.CUSTOMIZED:
                block = op.attr("graph")
                if not isinstance(block, BlockGraph):
                    raise GraphStructureError(
                        f"operator {i} (customized): its 'graph' attribute is {block!r:.40}, "
                        "not a block graph"
                    )
                with _located(f"operator {i} (customized): in its block graph,", always=True):
                    block = rebuild_block_graph(block, args)
                made = graph.customized(args, block)
            elif op.kind in Group.KERNEL:
                made = graph._append(op.kind, args, op.attr_dict)
            else:
                raise GraphStructureError(
                    f"operator {i} ({op.kind.value}) cannot be in a kernel graph"
                )
        _check_types(op, made, i)
        handles.append(made)
    for r in outputs:
        t = _lookup(handles, r, len(ops))
        declared = ops[r.op].outputs[r.index]
        graph.mark_output(t, declared.strides if declared.strides != t.strides else None)
    return graph


def rebuild_block_graph(block: BlockGraph, dtensors: list[DTensor]) -> ThreadBlockGraph:
    tb = ThreadBlockGraph(
        block.grid_dim, block.block_dim, block.forloop_range, block.reduction_dimx
    )
    handles: list[list] = []
    for i, op in enumerate(block.ops):
        args = [_lookup(handles, r, i) for r in op.inputs]
        with _located(f"operator {i} ({op.kind.value})"):
            if op.kind is OpKind.BLOCK_INPUT:
                index = op.attr("index")
                if type(index) is not int or not 0 <= index < len(dtensors):
                    raise GraphStructureError(
                        f"block input {i} names kernel input {index!r}, which does not exist"
                    )
                made = [tb.new_input(dtensors[index], op.attr("imap"), op.attr("forloop_dim"))]
            elif op.kind is OpKind.BLOCK_OUTPUT:
                tb.new_output(
                    args[0], op.attr("omap"), op.attr("forloop_dim"), accumulates(op)
                )
                made = []
            elif op.kind in Group.BLOCK:
                made = tb._append(op.kind, args, op.attr_dict)
            else:
                raise GraphStructureError(
                    f"operator {i} ({op.kind.value}) cannot be in a block graph"
                )
        _check_types(op, made, i)
        handles.append(made)
    return tb


@contextmanager
def _located(where: str, always: bool = False) -> Iterator[None]:
    """Errors that do not say which operator they are about (a missing attribute, a value of
    the wrong type) become GraphStructureErrors naming ``where``; with ``always``, mugraph's
    own errors get ``where`` in front too (an operator of a nested block graph)."""
    try:
        yield
    except MugraphError as error:
        if not always:
            raise
        raise type(error)(f"{where} {error}") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        detail = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise GraphStructureError(f"{where}: {detail}") from None


def _lookup(handles: list[list], ref: TensorRef, at: int):
    if not 0 <= ref.op < at or not 0 <= ref.index < len(handles[ref.op]):
        raise GraphStructureError(
            f"operator {at} uses tensor {ref}, which is not defined before it"
        )
    return handles[ref.op][ref.index]


def _check_types(op: Op, made: list, i: int) -> None:
    got = tuple(t.type.dims for t in made)
    want = tuple(t.dims for t in op.outputs)
    if got != want:
        raise GraphStructureError(
            f"operator {i} ({op.kind.value}) declares outputs {want} but computes {got}"
        )
