"""Readable text rendering of a μGraph: the kernel graph with each block graph under its kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Level, OpKind
from mugraph.ir.tensor import TensorRef, TensorType

if TYPE_CHECKING:
    from mugraph.ir.builder import KernelGraph

_AXES = "xyz"


def _map_text(grid_map: tuple[int, int, int]) -> str:
    return (
        "{"
        + ", ".join(f"{a}:{'-' if d < 0 else d}" for a, d in zip(_AXES, grid_map, strict=True))
        + "}"
    )


def _value_text(name: str, value: Any) -> str:
    if isinstance(value, AccumKind):
        return f"{name}={value.value}"
    if isinstance(value, TensorType):
        return ""
    if isinstance(value, tuple) and name in ("imap", "omap"):
        return f"{name}={_map_text(value)}"
    return f"{name}={value}"


def _op_line(index: int, op: Op, prefix: str) -> str:
    args = [f"{prefix}{r.op}" + (f".{r.index}" if r.index else "") for r in op.inputs]
    skip = {"graph", "index", "dtensor", "program"}
    attrs = [_value_text(k, v) for k, v in op.attrs if k not in skip]
    if op.kind is OpKind.BLOCK_INPUT:
        args = [f"input[{op.attr('index')}]"]
    if op.kind is OpKind.THREAD_GRAPH:
        from mugraph.ir.thread import render_program

        attrs.append("{" + render_program(op.attr("program"), len(op.inputs)) + "}")
    call = f"{op.kind.value}({', '.join(args + [a for a in attrs if a])})"
    if not op.outputs:
        return f"{call}"
    outs = ", ".join(f"{prefix}{index}" + (f".{i}" if i else "") for i in range(len(op.outputs)))
    types = ", ".join(str(t) for t in op.outputs)
    return f"{outs} = {call} -> {types}"


def render_block_header(grid_dim, block_dim, forloop_range: int) -> str:
    return (
        f"block graph grid={tuple(grid_dim)} block={tuple(block_dim)} forloop_range={forloop_range}"
    )


def render_ops(
    ops: list[Op] | tuple[Op, ...], level: Level, start: int = 0, indent: str = "  "
) -> list[str]:
    prefix = "%" if level is Level.KERNEL else "b"
    lines = []
    if start:
        lines.append(f"{indent}... ({start} earlier operators)")
    for i in range(start, len(ops)):
        op = ops[i]
        lines.append(indent + _op_line(i, op, prefix))
        if op.kind is OpKind.CUSTOMIZED:
            lines += render_block_graph(op.attr("graph"), indent + "    ")
    return lines


def render_block_graph(block: BlockGraph, indent: str = "    ") -> list[str]:
    header = render_block_header(block.grid_dim, block.block_dim, block.forloop_range)
    return [indent + header] + render_ops(block.ops, Level.BLOCK, indent=indent + "  ")


def render_kernel_graph(graph: KernelGraph) -> str:
    ins = len(graph.input_ops)
    lines = [f"KernelGraph ({ins} inputs, {len(graph.outputs)} outputs)"]
    lines += render_ops(graph.ops, Level.KERNEL)
    outs = ", ".join(str(r) for r in graph.outputs) if graph.outputs else "(none marked)"
    lines.append(f"  outputs: {outs}")
    return "\n".join(lines)


def tensor_ref_text(ref: TensorRef) -> str:
    return str(ref)
