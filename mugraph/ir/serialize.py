"""JSON round trip of μGraphs: ``to_json`` / ``from_json``.

The document lists operators in order with their kind, input positions, attributes and
output types; a custom kernel's block graph is nested in its operator. Loading rebuilds
the graph through the same immutable nodes, so a round trip gives an equal graph with an
equal structural hash.
"""

from __future__ import annotations

import json
from typing import Any

from mugraph.dtypes import DType
from mugraph.errors import MugraphError, SerializationError
from mugraph.ir.graph import BlockGraph, Op, freeze_attrs
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.tensor import TensorRef, TensorType

FORMAT = "mugraph"
VERSION = 1


def encode_type(t: TensorType) -> dict:
    out: dict[str, Any] = {"dims": list(t.dims), "dtype": t.dtype.value}
    if t.strides is not None:
        out["strides"] = list(t.strides)
    return out


def decode_type(d: dict) -> TensorType:
    strides = d.get("strides")
    return TensorType(
        tuple(d["dims"]), DType(d["dtype"]), None if strides is None else tuple(strides)
    )


def encode_value(value: Any) -> Any:
    """An attribute value as JSON data, tagged where the type is not plain."""
    if isinstance(value, BlockGraph):
        return {"block_graph": encode_block_graph(value)}
    if isinstance(value, TensorType):
        return {"tensor_type": encode_type(value)}
    if isinstance(value, AccumKind):
        return {"accum": value.value}
    if isinstance(value, OpKind):
        return {"op_kind": value.value}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v) for v in value]}
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    raise SerializationError(f"cannot serialize attribute value {value!r}")


def decode_value(data: Any) -> Any:
    if isinstance(data, dict):
        ((tag, payload),) = data.items()
        decoders = {
            "block_graph": decode_block_graph,
            "tensor_type": decode_type,
            "accum": AccumKind,
            "op_kind": OpKind,
            "tuple": lambda items: tuple(decode_value(v) for v in items),
        }
        if tag not in decoders:
            raise SerializationError(f"unknown attribute tag {tag!r}")
        return decoders[tag](payload)
    return data


def encode_op(op: Op) -> dict:
    return {
        "kind": op.kind.value,
        "inputs": [[r.op, r.index] for r in op.inputs],
        "attrs": {k: encode_value(v) for k, v in op.attrs},
        "outputs": [encode_type(t) for t in op.outputs],
    }


def decode_op(d: dict) -> Op:
    attrs = {k: decode_value(v) for k, v in d.get("attrs", {}).items()}
    return Op(
        OpKind(d["kind"]),
        tuple(TensorRef(i, j) for i, j in d.get("inputs", [])),
        freeze_attrs(attrs),
        tuple(decode_type(t) for t in d.get("outputs", [])),
    )


def encode_block_graph(block: BlockGraph) -> dict:
    return {
        "grid_dim": list(block.grid_dim),
        "block_dim": list(block.block_dim),
        "forloop_range": block.forloop_range,
        "reduction_dimx": block.reduction_dimx,
        "ops": [encode_op(op) for op in block.ops],
    }


def decode_block_graph(d: dict) -> BlockGraph:
    return BlockGraph(
        tuple(d["grid_dim"]),
        tuple(d["block_dim"]),
        d["forloop_range"],
        d["reduction_dimx"],
        tuple(decode_op(op) for op in d["ops"]),
    )


def graph_to_dict(graph) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "ops": [encode_op(op) for op in graph.ops],
        "outputs": [[r.op, r.index] for r in graph.outputs],
    }


def to_json(graph, indent: int | None = 1) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


def from_json(text: str):
    """Load a kernel graph written by ``to_json``; re-checks it through the builder."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise SerializationError(f"not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SerializationError('not a mugraph document (missing "format": "mugraph")')
    if data.get("version") != VERSION:
        raise SerializationError(f"unsupported mugraph document version {data.get('version')!r}")
    try:
        ops = [decode_op(op) for op in data["ops"]]
        outputs = [TensorRef(i, j) for i, j in data["outputs"]]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise SerializationError(f"malformed mugraph document: {error!r}") from None
    from mugraph.ir.rebuild import rebuild_kernel_graph

    try:
        return rebuild_kernel_graph(ops, outputs)
    except MugraphError as error:
        raise SerializationError(f"document describes an invalid graph: {error}") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        # an attribute missing or of the wrong type where the checks do not look
        raise SerializationError(f"document describes an invalid graph: {error!r}") from None
