"""A textual form of μGraphs that parses back to the same graph: ``to_text`` / ``from_text``.

Meant for tests and bug reports: a kernel graph, each custom kernel's block graph nested
under it, one operator per line, every attribute and type spelled out (an excerpt; the Fig 4c
GQA μGraph in full is ``tests/golden/gqa_fig4c_small.mgt``)::

    mugraph 1
    %0 = input() [index=0] -> float16[8,16]/[16,1]
    %1 = customized(%0) -> float16[8,16]/[16,1] {
      grid=(2, 1, 1) block=(128, 1, 1) forloop_range=1 reduction_dimx=64
      b0 = block_input() [dtensor=float16[8,16]/[16,1], forloop_dim=-1, ...] -> float16[4,16]
      b1 = exp(b0) -> float16[4,16]
      b2 = block_output(b1) [forloop_dim=-1, omap=(0, -1, -1)]
    }
    outputs %1

An operator is named by its position (``%i`` in the kernel graph, ``bi`` in a block graph);
``%i.j`` / ``bi.j`` is its output ``j``. Attribute values: ints, floats (Python's ``repr``:
``1e-06``, ``inf``), strings in double quotes, ``none`` / ``true`` / ``false``, tuples
``(a, b)`` (one element: ``(a,)``), ``accum.sum``, ``op.exp``, and tensor types
``dtype[dims]`` or ``dtype[dims]/[strides]``. Lines starting with ``#`` are comments.
A custom kernel's block graph is the ``{`` ... ``}`` under its line, its first line the
schedule. Reading rebuilds the graph through the builder's checks (as ``from_json`` does), so
a round trip gives an equal graph with an equal structural hash.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mugraph.dtypes import DType
from mugraph.errors import SerializationError
from mugraph.ir.builder import expect_kernel_graph
from mugraph.ir.graph import BlockGraph, Op, freeze_attrs
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.serialize import rebuilt
from mugraph.ir.tensor import TensorRef, TensorType

HEADER = "mugraph 1"
INDENT = "  "
# the schedule line of a block graph: field name -> how it is written
_SCHEDULE = ("grid", "block", "forloop_range", "reduction_dimx")


# ---- writing ------------------------------------------------------------------------------


def type_text(t: TensorType) -> str:
    text = f"{t.dtype.value}[{','.join(map(str, t.dims))}]"
    if t.strides is not None:
        text += f"/[{','.join(map(str, t.strides))}]"
    return text


def value_text(value: Any) -> str:
    """An attribute value in the text form (see the module docstring)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, AccumKind):
        return f"accum.{value.value}"
    if isinstance(value, OpKind):
        return f"op.{value.value}"
    if isinstance(value, TensorType):
        return type_text(value)
    if isinstance(value, tuple):
        items = [value_text(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    raise SerializationError(f"to_text: cannot write attribute value {value!r}")


def _ref_text(ref: TensorRef, prefix: str) -> str:
    return f"{prefix}{ref.op}" + (f".{ref.index}" if ref.index else "")


def _op_lines(index: int, op: Op, prefix: str, indent: str) -> list[str]:
    args = ", ".join(_ref_text(r, prefix) for r in op.inputs)
    attrs = [(k, v) for k, v in op.attrs if not isinstance(v, BlockGraph)]
    blocks = [v for _, v in op.attrs if isinstance(v, BlockGraph)]
    line = f"{indent}{prefix}{index} = {op.kind.value}({args})"
    if attrs:
        line += " [" + ", ".join(f"{k}={value_text(v)}" for k, v in attrs) + "]"
    if op.outputs:
        line += " -> " + ", ".join(type_text(t) for t in op.outputs)
    if not blocks:
        return [line]
    (block,) = blocks  # a customized operator holds its one block graph as "graph"
    inner = indent + INDENT
    lines = [line + " {", inner + _schedule_text(block)]
    for j, bop in enumerate(block.ops):
        lines += _op_lines(j, bop, "b", inner)
    return lines + [indent + "}"]


def _schedule_text(block: BlockGraph) -> str:
    values = (block.grid_dim, block.block_dim, block.forloop_range, block.reduction_dimx)
    return " ".join(f"{k}={value_text(v)}" for k, v in zip(_SCHEDULE, values, strict=True))


def to_text(graph) -> str:
    """The text form of a kernel graph (see the module docstring)."""
    expect_kernel_graph(graph, "to_text")
    lines = [HEADER]
    for i, op in enumerate(graph.ops):
        lines += _op_lines(i, op, "%", "")
    lines.append("outputs " + ", ".join(_ref_text(r, "%") for r in graph.outputs))
    return "\n".join(lines) + "\n"


# ---- reading ------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_OP_LINE = re.compile(
    r"(?P<name>[%b]\d+)\s*=\s*(?P<kind>[a-z_0-9]+)\((?P<args>[^)]*)\)\s*(?P<rest>.*)$"
)
_REF = re.compile(r"(?P<prefix>[%b])(?P<op>\d+)(?:\.(?P<index>\d+))?$")


class _Cursor:
    """A position in one line, for the value grammar."""

    def __init__(self, text: str, where: str) -> None:
        self.text, self.pos, self.where = text, 0, where

    def error(self, what: str) -> SerializationError:
        return SerializationError(
            f"mugraph text, {self.where}: {what} at column {self.pos + 1}: {self.text.strip()}"
        )

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def take(self, token: str) -> None:
        if not self.peek(token):
            raise self.error(f"expected {token!r}")
        self.pos += len(token)

    def match(self, pattern: re.Pattern) -> str | None:
        self.skip()
        found = pattern.match(self.text, self.pos)
        if found is None:
            return None
        self.pos = found.end()
        return found.group(0)

    def done(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)


def _int_list(cursor: _Cursor) -> tuple[int, ...]:
    cursor.take("[")
    items: list[int] = []
    while not cursor.peek("]"):
        if items:
            cursor.take(",")
        number = cursor.match(_NUMBER)
        if number is None or not re.fullmatch(r"-?\d+", number):
            raise cursor.error("expected an integer")
        items.append(int(number))
    cursor.take("]")
    return tuple(items)


def _type_after(cursor: _Cursor, dtype_name: str) -> TensorType:
    try:
        dtype = DType(dtype_name)
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise cursor.error(f"unknown dtype {dtype_name!r} (known: {known})") from None
    dims = _int_list(cursor)
    strides = None
    if cursor.peek("/"):
        cursor.take("/")
        strides = _int_list(cursor)
    return TensorType(dims, dtype, strides)


def _enum_value(cursor: _Cursor, enum_type, what: str):
    cursor.take(".")
    name = cursor.match(_NAME)
    try:
        return enum_type(name)
    except ValueError:
        raise cursor.error(f"unknown {what} {name!r}") from None


_WORDS = {"none": None, "true": True, "false": False}


def _value(cursor: _Cursor) -> Any:
    """One attribute value (the grammar of the module docstring)."""
    if cursor.peek("("):
        return _tuple(cursor)
    if cursor.peek('"'):
        text = cursor.match(_STRING)
        if text is None:
            raise cursor.error("unterminated string")
        return json.loads(text)
    number = cursor.match(_NUMBER)
    if number is not None:
        whole = re.fullmatch(r"-?\d+", number)
        return int(number) if whole else float(number)
    name = cursor.match(_NAME)
    if name is None:
        raise cursor.error("expected a value")
    if name in _WORDS:
        return _WORDS[name]
    if name == "accum":
        return _enum_value(cursor, AccumKind, "accumulator")
    if name == "op":
        return _enum_value(cursor, OpKind, "operator kind")
    if cursor.peek("["):
        return _type_after(cursor, name)
    raise cursor.error(f"unknown value {name!r}")


def _tuple(cursor: _Cursor) -> tuple:
    cursor.take("(")
    items: list[Any] = []
    while not cursor.peek(")"):
        items.append(_value(cursor))
        if not cursor.peek(")"):
            cursor.take(",")
    cursor.take(")")
    return tuple(items)


def _attrs(cursor: _Cursor, close: str | None) -> dict[str, Any]:
    """``name=value`` pairs, separated by commas (``close`` given) or spaces (to the end)."""
    attrs: dict[str, Any] = {}
    while not (cursor.peek(close) if close else cursor.done()):
        if attrs and close:
            cursor.take(",")
        name = cursor.match(_NAME)
        if name is None:
            raise cursor.error("expected an attribute name")
        if name in attrs:
            raise cursor.error(f"attribute {name!r} given twice")
        cursor.take("=")
        attrs[name] = _value(cursor)
    if close:
        cursor.take(close)
    return attrs


def _types(cursor: _Cursor) -> tuple[TensorType, ...]:
    types = []
    while True:
        name = cursor.match(_NAME)
        if name is None:
            raise cursor.error("expected a tensor type")
        types.append(_type_after(cursor, name))
        if not cursor.peek(","):
            return tuple(types)
        cursor.take(",")


@dataclass
class _Line:
    number: int
    text: str

    @property
    def where(self) -> str:
        return f"line {self.number}"


class _Reader:
    """The lines of a text, read top-down (kernel operators; block graphs nested)."""

    def __init__(self, text: str) -> None:
        self.lines = [
            _Line(i + 1, line.strip())
            for i, line in enumerate(text.splitlines())
            if line.strip() and not line.strip().startswith("#")
        ]
        self.at = 0

    def next(self, expected: str) -> _Line:
        if self.at >= len(self.lines):
            raise SerializationError(f"mugraph text: ended early, expected {expected}")
        line = self.lines[self.at]
        self.at += 1
        return line

    def peek(self) -> _Line | None:
        return self.lines[self.at] if self.at < len(self.lines) else None

    def ops(self, prefix: str, stop: str) -> list[Op]:
        """Operator lines named ``{prefix}0``, ``{prefix}1``... up to a line starting with
        ``stop``."""
        ops: list[Op] = []
        while True:
            line = self.peek()
            if line is None:
                raise SerializationError(f"mugraph text: ended early, expected {stop!r}")
            if line.text.startswith(stop):
                return ops
            if prefix == "b" and not line.text.startswith("b"):
                raise SerializationError(
                    f"mugraph text, {line.where}: expected block operator b{len(ops)} or the "
                    f"'}}' that closes the block graph: {line.text}"
                )
            self.at += 1
            ops.append(self.op(line, prefix, len(ops)))

    def op(self, line: _Line, prefix: str, index: int) -> Op:
        found = _OP_LINE.match(line.text)
        if found is None:
            raise SerializationError(
                f"mugraph text, {line.where}: expected '{prefix}{index} = kind(inputs) "
                f"[attributes] -> types': {line.text}"
            )
        if found["name"] != f"{prefix}{index}":
            raise SerializationError(
                f"mugraph text, {line.where}: expected operator {prefix}{index}, "
                f"got {found['name']}: {line.text}"
            )
        try:
            kind = OpKind(found["kind"])
        except ValueError:
            raise SerializationError(
                f"mugraph text, {line.where}: unknown operator kind {found['kind']!r}"
            ) from None
        inputs = tuple(self.ref(a.strip(), prefix, line) for a in found["args"].split(",")
                       if a.strip())  # fmt: skip
        cursor = _Cursor(line.text, line.where)
        cursor.pos = found.start("rest")
        attrs: dict[str, Any] = {}
        if cursor.peek("["):
            cursor.take("[")
            attrs = _attrs(cursor, "]")
        outputs: tuple[TensorType, ...] = ()
        if cursor.peek("->"):
            cursor.take("->")
            outputs = _types(cursor)
        if cursor.peek("{"):
            cursor.take("{")
            attrs["graph"] = self.block()
        if not cursor.done():
            raise cursor.error("unexpected text")
        return Op(kind, inputs, freeze_attrs(attrs), outputs)

    def block(self) -> BlockGraph:
        line = self.next("a block graph's schedule line")
        schedule = _attrs(_Cursor(line.text, line.where), None)
        missing = [k for k in _SCHEDULE if k not in schedule]
        extra = sorted(set(schedule) - set(_SCHEDULE))
        if missing or extra:
            raise SerializationError(
                f"mugraph text, {line.where}: a block graph's schedule line is "
                f"'{' '.join(k + '=...' for k in _SCHEDULE)}': {line.text}"
            )
        ops = self.ops("b", "}")
        end = self.next("'}'")
        if end.text != "}":
            raise SerializationError(f"mugraph text, {end.where}: expected '}}': {end.text}")
        return BlockGraph(
            tuple(schedule["grid"]),
            tuple(schedule["block"]),
            schedule["forloop_range"],
            schedule["reduction_dimx"],
            tuple(ops),
        )

    @staticmethod
    def ref(text: str, prefix: str, line: _Line) -> TensorRef:
        found = _REF.match(text)
        if found is None or found["prefix"] != prefix:
            raise SerializationError(
                f"mugraph text, {line.where}: expected an input like {prefix}3 or "
                f"{prefix}3.1, got {text!r}: {line.text}"
            )
        return TensorRef(int(found["op"]), int(found["index"] or 0))


def from_text(text: str):
    """Read a kernel graph written by ``to_text``; re-checks it through the builder."""
    if not isinstance(text, str):
        raise SerializationError(f"from_text: expected a str, got {type(text).__name__}")
    reader = _Reader(text)
    first = reader.next(repr(HEADER))
    version = first.text.split(" ", 1)
    if first.text != HEADER and version[0] == "mugraph" and len(version) == 2:
        raise SerializationError(
            f"mugraph text, {first.where}: unsupported version {version[1]!r} (this mugraph "
            f"reads {HEADER!r})"
        )
    if first.text != HEADER:
        raise SerializationError(
            f"mugraph text, {first.where}: expected the header {HEADER!r}, got {first.text!r}"
        )
    ops = reader.ops("%", "outputs")
    last = reader.next("'outputs ...'")
    line = reader.peek()
    if line is not None:
        raise SerializationError(f"mugraph text, {line.where}: text after the outputs line")
    names = [n.strip() for n in last.text[len("outputs") :].split(",") if n.strip()]
    outputs = [_Reader.ref(name, "%", last) for name in names]
    return rebuilt(ops, outputs, "mugraph text")
