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


def decode_type(d: Any, where: str = "tensor type") -> TensorType:
    if not isinstance(d, dict):
        raise _malformed(where, f'expected {{"dims": [...], "dtype": ...}}, got {d!r}')
    if "dims" not in d or "dtype" not in d:
        missing = [k for k in ("dims", "dtype") if k not in d]
        raise _malformed(where, f"missing {', '.join(repr(k) for k in missing)}")
    try:
        dtype = DType(d["dtype"])
    except (ValueError, TypeError):
        known = ", ".join(t.value for t in DType)
        raise _malformed(where, f"unknown dtype {d['dtype']!r} (known: {known})") from None
    dims, strides = _int_tuple(d["dims"], where, "dims"), d.get("strides")
    return TensorType(dims, dtype, None if strides is None else _int_tuple(strides, where,
                                                                          "strides"))


def _int_tuple(value: Any, where: str, name: str) -> tuple:
    if not isinstance(value, list):
        raise _malformed(where, f"{name} must be a list of ints, got {value!r}")
    return tuple(value)


def _malformed(where: str, what: str) -> SerializationError:
    return SerializationError(f"malformed mugraph document: {where}: {what}")


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


def _decode_enum(enum_type, what: str, list_known: bool = True):
    def decode(payload: Any, where: str):
        try:
            return enum_type(payload)
        except (ValueError, TypeError):
            known = ", ".join(repr(e.value) for e in enum_type)
            hint = f" (known: {known})" if list_known else " (not an operator mugraph knows)"
            raise _malformed(where, f"unknown {what} {payload!r}{hint}") from None

    return decode


def _decode_tuple(items: Any, where: str) -> tuple:
    if not isinstance(items, list):
        raise _malformed(where, f"a tuple must be a list, got {items!r}")
    return tuple(decode_value(v, where) for v in items)


# tag of a tagged attribute value -> decoder(payload, where)
_VALUE_DECODERS = {
    "block_graph": lambda payload, where: decode_block_graph(payload, where),
    "tensor_type": decode_type,
    "accum": _decode_enum(AccumKind, "accumulator"),
    "op_kind": _decode_enum(OpKind, "operator kind", list_known=False),
    "tuple": _decode_tuple,
}


def decode_value(data: Any, where: str = "attribute") -> Any:
    if isinstance(data, dict):
        if len(data) != 1:
            raise _malformed(where, f"a tagged value has exactly one key, got {sorted(data)}")
        ((tag, payload),) = data.items()
        if tag not in _VALUE_DECODERS:
            known = ", ".join(repr(t) for t in _VALUE_DECODERS)
            raise _malformed(where, f"unknown attribute tag {tag!r} (known: {known})")
        return _VALUE_DECODERS[tag](payload, where)
    if isinstance(data, list):
        raise _malformed(where, f"a list must be tagged as a tuple, got {data!r}")
    return data


def encode_op(op: Op) -> dict:
    return {
        "kind": op.kind.value,
        "inputs": [[r.op, r.index] for r in op.inputs],
        "attrs": {k: encode_value(v) for k, v in op.attrs},
        "outputs": [encode_type(t) for t in op.outputs],
    }


def decode_op(d: Any, where: str = "operator") -> Op:
    """One operator of a document; ``where`` names it in errors ("operator 2", ...)."""
    if not isinstance(d, dict):
        raise _malformed(where, f'expected an object with "kind", "inputs", "attrs" and '
                         f'"outputs", got {d!r}')
    if "kind" not in d:
        raise _malformed(where, 'missing "kind"')
    kind = _decode_enum(OpKind, "operator kind", list_known=False)(d["kind"], where)
    where = f"{where} ({kind.value})"
    attrs = d.get("attrs", {})
    if not isinstance(attrs, dict):
        raise _malformed(where, f'"attrs" must be an object, got {attrs!r}')
    decoded = {k: decode_value(v, f"{where} attribute {k!r}") for k, v in attrs.items()}
    return Op(
        kind,
        tuple(_decode_ref(r, f"{where} input {i}") for i, r in enumerate(d.get("inputs", []))),
        freeze_attrs(decoded),
        tuple(decode_type(t, f"{where} output {j}") for j, t in enumerate(d.get("outputs", []))),
    )


def _decode_ref(ref: Any, where: str) -> TensorRef:
    """``[operator, output index]``."""
    if not (isinstance(ref, list) and len(ref) == 2 and all(type(v) is int for v in ref)):
        raise _malformed(where, f"a tensor reference is [operator, output], got {ref!r}")
    return TensorRef(ref[0], ref[1])


def encode_block_graph(block: BlockGraph) -> dict:
    return {
        "grid_dim": list(block.grid_dim),
        "block_dim": list(block.block_dim),
        "forloop_range": block.forloop_range,
        "reduction_dimx": block.reduction_dimx,
        "ops": [encode_op(op) for op in block.ops],
    }


_BLOCK_FIELDS = ("grid_dim", "block_dim", "forloop_range", "reduction_dimx", "ops")


def decode_block_graph(d: Any, where: str = "block graph") -> BlockGraph:
    where = f"{where}: block graph" if where != "block graph" else where
    if not isinstance(d, dict):
        raise _malformed(where, f"expected an object, got {d!r}")
    missing = [k for k in _BLOCK_FIELDS if k not in d]
    if missing:
        raise _malformed(where, f"missing {', '.join(repr(k) for k in missing)}")
    if not isinstance(d["ops"], list):
        raise _malformed(where, f'"ops" must be a list, got {d["ops"]!r}')
    return BlockGraph(
        _int_tuple(d["grid_dim"], where, "grid_dim"),
        _int_tuple(d["block_dim"], where, "block_dim"),
        d["forloop_range"],
        d["reduction_dimx"],
        tuple(decode_op(op, f"{where} operator {i}") for i, op in enumerate(d["ops"])),
    )


def graph_to_dict(graph) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "ops": [encode_op(op) for op in graph.ops],
        "outputs": [[r.op, r.index] for r in graph.outputs],
    }


def _parse(document) -> Any:
    """The parsed JSON of ``document`` (text, bytes, or an already parsed dict)."""
    if isinstance(document, dict):
        return document
    if not isinstance(document, (str, bytes, bytearray)):
        raise SerializationError(
            "from_json: expected a mugraph JSON document as str, bytes or a parsed dict, "
            f"got {type(document).__name__}"
        )
    try:
        return json.loads(document)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SerializationError(f"not JSON: {error}") from None


def _json_kind(data: Any) -> str:
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "a boolean"
    if isinstance(data, (int, float)):
        return "a number"
    return {str: "a string", list: "a list"}.get(type(data), type(data).__name__)


def to_json(graph, indent: int | None = 1) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


def from_json(document):
    """Load a kernel graph written by ``to_json``; re-checks it through the builder.

    ``document`` is the JSON text (str, bytes) or the object it parses to (a dict, as
    ``json.load`` returns it)."""
    data = _parse(document)
    if not isinstance(data, dict):
        raise SerializationError(
            f"not a mugraph document: expected a JSON object, got {_json_kind(data)}"
        )
    if data.get("format") != FORMAT:
        raise SerializationError('not a mugraph document (missing "format": "mugraph")')
    if "version" not in data:
        raise SerializationError('malformed mugraph document: missing "version"')
    if data["version"] != VERSION:
        raise SerializationError(f"unsupported mugraph document version {data['version']!r} "
                                 f"(this mugraph reads version {VERSION})")
    for name in ("ops", "outputs"):
        if not isinstance(data.get(name), list):
            raise _malformed("the document", f'"{name}" must be a list, got {data.get(name)!r}')
    ops = [decode_op(op, f"operator {i}") for i, op in enumerate(data["ops"])]
    outputs = [_decode_ref(r, f"graph output {k}") for k, r in enumerate(data["outputs"])]
    return rebuilt(ops, outputs, "document")


def rebuilt(ops, outputs, source: str):
    """The kernel graph of ``ops`` and ``outputs`` read from ``source`` (a document, a text),
    through the builder's checks; what they refuse is a SerializationError naming ``source``."""
    from mugraph.ir.rebuild import rebuild_kernel_graph

    try:
        return rebuild_kernel_graph(ops, outputs)
    except MugraphError as error:
        raise SerializationError(f"{source} describes an invalid graph: {error}") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        # an attribute missing or of the wrong type where the checks do not look
        raise SerializationError(f"{source} describes an invalid graph: {error!r}") from None
