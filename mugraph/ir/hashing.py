"""Structural hashes: a Merkle hash over operators that ignores object ids and the order in
which independent operators were added. Stable across processes (blake2b, not ``hash``)."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.serialize import encode_type, encode_value

if TYPE_CHECKING:
    from mugraph.ir.builder import KernelGraph


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _attr_payload(value: Any) -> Any:
    if isinstance(value, BlockGraph):
        return {"block_graph": block_graph_hash(value)}
    if isinstance(value, tuple):
        return [_attr_payload(v) for v in value]
    return encode_value(value)


def op_digests(ops: tuple[Op, ...] | list[Op]) -> list[str]:
    """One digest per operator, from its kind, attributes, types and its inputs' digests."""
    digests: list[str] = []
    for op in ops:
        digests.append(
            _digest(
                {
                    "kind": op.kind.value,
                    "attrs": {k: _attr_payload(v) for k, v in op.attrs},
                    "outputs": [encode_type(t) for t in op.outputs],
                    "inputs": [[digests[r.op], r.index] for r in op.inputs],
                }
            )
        )
    return digests


def block_graph_hash(block: BlockGraph) -> str:
    digests = op_digests(block.ops)
    outputs = [
        d for op, d in zip(block.ops, digests, strict=True) if op.kind.value == "block_output"
    ]
    return _digest(
        {
            "grid": list(block.grid_dim),
            "block": list(block.block_dim),
            "forloop": block.forloop_range,
            "dimx": block.reduction_dimx,
            "outputs": outputs,
        }
    )


def kernel_graph_hash(graph: KernelGraph) -> str:
    digests = op_digests(graph.ops)
    inputs = [d for op, d in zip(graph.ops, digests, strict=True) if op.kind.value == "input"]
    outputs = [[digests[r.op], r.index] for r in graph.outputs]
    return _digest({"inputs": inputs, "outputs": outputs})
