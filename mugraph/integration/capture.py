"""Capture: translate a set of torch.fx nodes into a mugraph kernel graph.

:func:`build_program` walks the members of a candidate partition in graph order and lowers
each one through the table of :mod:`mugraph.integration.lowering`. Values computed inside the
partition are mugraph tensors; values computed outside it (``External``) become kernel-graph
inputs the first time an operator reads them, with the strides of the actual tensor. An input
may be an adapted view of the outside tensor (the transposed weight of ``linear``, a tensor
reshaped to the rank of the other operand of a broadcast); scalars that mugraph has no
operator for (``x + eps``) become inputs holding the constant, so the captured function is
exactly the PyTorch one — never an approximation.

Anything that does not map raises :class:`Unsupported` with the reason; the partitioner then
leaves the node to PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node
from torch.fx.node import map_aggregate

from mugraph.dtypes import as_dtype
from mugraph.errors import MugraphError
from mugraph.ir.builder import KernelGraph, new_kernel_graph
from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import DTensor


class Unsupported(Exception):
    """A node (or a set of nodes) that mugraph cannot capture; the message says why."""


@dataclass(frozen=True)
class External:
    """A tensor computed outside the partition, seen through ``adapters`` (view operations)."""

    node: Node
    adapters: tuple = ()


@dataclass(frozen=True)
class ExternalInput:
    """A kernel-graph input fed by raw input ``source`` of the partition, adapted by views."""

    source: int
    adapters: tuple = ()


@dataclass(frozen=True)
class ConstInput:
    """A kernel-graph input holding one constant, shaped ``(1,) * rank``."""

    value: float
    rank: int
    dtype: torch.dtype

    def tensor(self, device, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.full((1,) * self.rank, self.value, dtype=dtype or self.dtype, device=device)


@dataclass(frozen=True)
class CausalMaskInput:
    """The 0/1 mask of ``is_causal`` attention: 1 where key <= query (PyTorch's
    ``ones(rows, cols).tril()``), shaped ``(1,) * (rank - 2) + (rows, cols)``."""

    rows: int
    cols: int
    rank: int
    dtype: torch.dtype

    def tensor(self, device, dtype: torch.dtype | None = None) -> torch.Tensor:
        ones = torch.ones(self.rows, self.cols, dtype=dtype or self.dtype, device=device)
        return ones.tril().reshape((1,) * (self.rank - 2) + (self.rows, self.cols))


InputSpec = ExternalInput | ConstInput | CausalMaskInput


@dataclass
class CapturedProgram:
    """A partition as a kernel graph, and how its inputs and outputs map to fx nodes."""

    graph: KernelGraph
    nodes: list[Node]
    raw_inputs: list[Node]
    input_specs: list[InputSpec]
    outputs: list[Node]
    output_index: list[int]
    ops: int = 0
    kinds: list[str] = field(default_factory=list)
    output_shapes: list[tuple[int, ...] | None] = field(default_factory=list)

    @property
    def compute_ops(self) -> int:
        """Operators that compute (not reshapes or permutes)."""
        return sum(1 for k in self.kinds if k not in _MOVES_ONLY)


_MOVES_ONLY = frozenset({OpKind.RESHAPE.value, OpKind.PERMUTE.value})


# ---- views applied to outside tensors ------------------------------------------------------------


def apply_adapters(tensor: torch.Tensor, adapters: tuple,
                   compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Apply adapter steps to a tensor: ``("permute", perm)``, ``("reshape", dims)`` and
    ``("slice", (dim, start, length))`` are views; ``("scale", c)`` multiplies by a power of
    two (exact) and ``("cast", dtype)`` converts (a boolean mask to 0/1), both giving a new
    contiguous tensor. ``compute_dtype`` replaces the dtype of casts (the capture check
    computes in float64)."""
    for kind, arg in adapters:
        if kind == "permute":
            tensor = tensor.permute(arg)
        elif kind == "reshape":
            tensor = tensor.reshape(arg)
        elif kind == "slice":
            tensor = tensor.narrow(*arg)
        elif kind == "scale":
            tensor = (tensor * arg).contiguous()
        elif kind == "cast":
            tensor = tensor.to(compute_dtype or arg).contiguous()
        else:
            raise ValueError(f"unknown adapter {kind!r}")
    return tensor


def meta_value(node: Node) -> Any:
    """The propagated (fake) value of a node: a tensor, a number, or a structure of them."""
    if "val" in node.meta:
        return node.meta["val"]
    if "example_value" in node.meta:
        return node.meta["example_value"]
    raise Unsupported(f"{node.name}: no shape information (shape propagation did not reach it)")


def _meta_view(node: Node, adapters: tuple) -> torch.Tensor:
    val = meta_value(node)
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{node.name}: not a tensor")
    if any(not isinstance(s, int) for s in val.shape):
        raise Unsupported(f"{node.name}: symbolic shape {tuple(val.shape)}")
    shape, stride = tuple(val.shape), tuple(val.stride())
    base = torch.empty_strided(shape, stride, dtype=val.dtype, device="meta")
    return apply_adapters(base, adapters)


def mugraph_dtype(dtype: torch.dtype, what: str):
    try:
        return as_dtype(dtype)
    except MugraphError:
        raise Unsupported(
            f"{what}: dtype {dtype} (mugraph supports float16, bfloat16, float32)"
        ) from None


def _positive_strides(view: torch.Tensor) -> tuple[int, ...]:
    """Strides mugraph accepts: size-1 dims get any positive stride."""
    pairs = zip(view.stride(), view.shape, strict=True)
    return tuple(max(int(s), 1) if d == 1 else int(s) for s, d in pairs)


# ---- the lowering context ------------------------------------------------------------------------


class LowerContext:
    """What a lowering rule may do: read values, create inputs and constants, add operators."""

    def __init__(self) -> None:
        self.graph = new_kernel_graph()
        self.raw_inputs: list[Node] = []
        self.specs: list[InputSpec] = []
        self._inputs: dict[tuple, DTensor] = {}
        self.device: torch.device | None = None
        # nodes whose mugraph value has other dims than PyTorch's (same elements, row-major):
        # the partition's output is reshaped (a view); only allowed for partition outputs
        self.reshaped: set[Node] = set()

    # values
    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, (DTensor, External))

    def tensor(self, value: Any) -> DTensor:
        """A mugraph tensor for ``value`` (an outside tensor becomes an input)."""
        if isinstance(value, DTensor):
            return value
        if isinstance(value, External):
            return self._external_input(value)
        raise Unsupported(f"expected a tensor, got {value!r}")

    def dims(self, value: Any) -> tuple[int, ...]:
        if isinstance(value, DTensor):
            return value.dims
        if isinstance(value, External):
            return tuple(_meta_view(value.node, value.adapters).shape)
        raise Unsupported(f"expected a tensor, got {value!r}")

    def dtype(self, value: Any) -> torch.dtype:
        if isinstance(value, DTensor):
            return getattr(torch, value.dtype.torch_name)
        if isinstance(value, External):
            return meta_value(value.node).dtype
        raise Unsupported(f"expected a tensor, got {value!r}")

    def note_raw(self, node: Node) -> None:
        """Record an outside node the partition reads (without a kernel-graph input)."""
        self._raw_index(node)

    def _raw_index(self, node: Node) -> int:
        if node not in self.raw_inputs:
            self.raw_inputs.append(node)
        return self.raw_inputs.index(node)

    def _external_input(self, ext: External) -> DTensor:
        key = ("ext", ext.node, ext.adapters)
        if key not in self._inputs:
            self._check_device(ext.node)
            view = _meta_view(ext.node, ext.adapters)
            if view.dim() == 0 or view.numel() == 0:
                raise Unsupported(f"{ext.node.name}: a 0-d or empty tensor input")
            dtype = mugraph_dtype(view.dtype, ext.node.name)
            strides = _positive_strides(view)
            self._inputs[key] = self.graph.new_input(tuple(view.shape), strides, dtype)
            self.specs.append(ExternalInput(self._raw_index(ext.node), ext.adapters))
        return self._inputs[key]

    def _check_device(self, node: Node) -> None:
        device = meta_value(node).device
        if self.device is None:
            self.device = device
        elif device != self.device:
            raise Unsupported(f"{node.name}: inputs on different devices ({device}, {self.device})")

    def causal_mask(self, rows: int, cols: int, rank: int, dtype: torch.dtype) -> DTensor:
        """An input holding the 0/1 causal mask (see CausalMaskInput)."""
        key = ("causal", rows, cols, rank, dtype)
        if key not in self._inputs:
            dims = (1,) * (rank - 2) + (rows, cols)
            mdtype = mugraph_dtype(dtype, "causal mask")
            self._inputs[key] = self.graph.new_input(dims, None, mdtype)
            self.specs.append(CausalMaskInput(rows, cols, rank, dtype))
        return self._inputs[key]

    def adapted(self, value: Any, step: tuple) -> External:
        """An outside tensor seen through one more adapter step (scale, cast)."""
        if not isinstance(value, External):
            raise Unsupported(f"cannot adapt a value computed by mugraph ({step[0]})")
        return External(value.node, (*value.adapters, step))

    def const(self, value: float, rank: int, dtype: torch.dtype) -> DTensor:
        """An input holding ``value`` with ``rank`` size-1 dims (broadcasts against anything)."""
        if not math.isfinite(value):
            raise Unsupported(f"the constant {value} is not finite")
        key = ("const", float(value), rank, dtype)
        if key not in self._inputs:
            mdtype = mugraph_dtype(dtype, "constant")
            self._inputs[key] = self.graph.new_input((1,) * rank, (1,) * rank, mdtype)
            self.specs.append(ConstInput(float(value), rank, dtype))
        return self._inputs[key]

    # data movement
    def reshape(self, value: Any, dims: tuple[int, ...]) -> Any:
        """``value`` with new dims: a view of an outside tensor, a reshape of an inside one."""
        dims = tuple(int(d) for d in dims)
        if self.dims(value) == dims:
            return value
        if isinstance(value, External):
            return External(value.node, (*value.adapters, ("reshape", dims)))
        return self.graph.reshape(self.tensor(value), dims)

    def permute(self, value: Any, perm: tuple[int, ...]) -> Any:
        """``value`` with its dims in the order ``perm``: a view either way (an adapter of an
        outside tensor, a kernel-level permute of an inside one), never a copy."""
        perm = tuple(perm)
        if perm == tuple(range(len(perm))):
            return value
        if isinstance(value, External):
            return External(value.node, (*value.adapters, ("permute", perm)))
        return self.graph.permute(self.tensor(value), perm)

    def with_rank(self, value: Any, rank: int) -> Any:
        """Prepend size-1 dims (PyTorch broadcasting aligns trailing dims)."""
        dims = self.dims(value)
        if len(dims) > rank:
            raise Unsupported(f"cannot lower rank {len(dims)} to {rank}")
        return self.reshape(value, (1,) * (rank - len(dims)) + dims) if len(dims) < rank else value


# ---- building a partition ------------------------------------------------------------------------


def _map_args(cx: LowerContext, node: Node, env: dict[Node, Any]) -> tuple[tuple, dict]:
    def value_of(arg: Any) -> Any:
        if not isinstance(arg, Node):
            return arg
        if arg in env:
            return env[arg]
        val = meta_value(arg)
        if isinstance(val, torch.Tensor):
            return External(arg)
        if isinstance(val, (bool, int, float)):
            cx.note_raw(arg)  # the PyTorch path reads it; mugraph uses this specialization's value
            return val
        raise Unsupported(f"{node.name}: argument {arg.name} is {type(val).__name__}")

    return map_aggregate(node.args, value_of), map_aggregate(node.kwargs, value_of)


def _check_result(cx: LowerContext, node: Node, value: Any) -> DTensor:
    """A lowered node must give a mugraph tensor of exactly PyTorch's shape and dtype (or, for
    a node the rule marked as reshaped, the same number of elements)."""
    if not isinstance(value, DTensor):
        raise Unsupported(f"{node.name}: passes a PyTorch value through unchanged")
    want = meta_value(node)
    if not isinstance(want, torch.Tensor):
        raise Unsupported(f"{node.name}: does not produce one tensor")
    if node in cx.reshaped:
        if math.prod(value.dims) != want.numel():
            raise Unsupported(f"{node.name}: mugraph gives {list(value.dims)} elements")
    elif tuple(value.dims) != tuple(want.shape):
        raise Unsupported(
            f"{node.name}: mugraph gives {list(value.dims)}, PyTorch {list(want.shape)}"
        )
    if cx.dtype(value) != want.dtype:
        raise Unsupported(f"{node.name}: mugraph gives {cx.dtype(value)}, PyTorch {want.dtype}")
    return value


def lower_node(cx: LowerContext, node: Node, env: dict[Node, Any]) -> DTensor:
    """Lower one fx node with its arguments taken from ``env`` (or outside the partition)."""
    from mugraph.integration.lowering import lowering_rule

    rule = lowering_rule(node)
    args, kwargs = _map_args(cx, node, env)
    try:
        value = rule(cx, node, args, kwargs)
    except MugraphError as error:
        first = str(error).splitlines()[0]
        raise Unsupported(f"{node.name}: {first}") from None
    return _check_result(cx, node, value)


def _outputs(members: list[Node]) -> list[Node]:
    inside = set(members)
    return [n for n in members if any(u not in inside for u in n.users)]


def build_program(members: list[Node], *, check_verifiable: bool = True) -> CapturedProgram:
    """The kernel graph of ``members`` (fx nodes in graph order); raise Unsupported if none."""
    cx = LowerContext()
    env: dict[Node, Any] = {}
    for node in members:
        env[node] = lower_node(cx, node, env)
    outputs = _outputs(members)
    if not outputs:
        raise Unsupported("the partition has no outputs")
    inner_reshaped = [n for n in cx.reshaped if n not in outputs or any(u in env for u in n.users)]
    if inner_reshaped:
        raise Unsupported(f"{inner_reshaped[0].name}: its value is used inside the partition")
    index = _mark_outputs(cx.graph, [env[n] for n in outputs])
    graph = cx.graph
    try:
        graph.check()
        if check_verifiable:
            from mugraph.search.verify import check_verifiable as verifiable

            verifiable(graph)
    except MugraphError as error:
        raise Unsupported(str(error).splitlines()[0]) from None
    kinds = [op.kind.value for op in graph.ops if op.kind is not OpKind.INPUT]
    shapes = [tuple(meta_value(n).shape) if n in cx.reshaped else None for n in outputs]
    return CapturedProgram(
        graph, list(members), cx.raw_inputs, cx.specs, outputs, index, len(kinds), kinds, shapes
    )


def _mark_outputs(graph: KernelGraph, values: list[DTensor]) -> list[int]:
    """Mark each distinct tensor once; return, per value, the index of its graph output."""
    marked: list = []
    index = []
    for value in values:
        if value.ref not in marked:
            graph.mark_output(value)
            marked.append(value.ref)
        index.append(marked.index(value.ref))
    return index
