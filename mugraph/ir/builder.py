"""The builder API: ``new_kernel_graph`` / ``new_threadblock_graph`` and their methods.

The builders are append-only containers of immutable :class:`Op` nodes. Every method checks
its operator (shapes, maps, dtypes, memory) before adding it and raises a MugraphError whose
message names the operator and shows the graph built so far.
"""

from __future__ import annotations

import math
from typing import Any

from mugraph.dtypes import DType, as_dtype, float16
from mugraph.errors import (
    DTypeError,
    GraphStructureError,
    MugraphError,
    ShapeError,
    SharedMemoryError,
    UnsupportedError,
)
from mugraph.gpu import DEFAULT_GPU, GPUSpec
from mugraph.ir import maps
from mugraph.ir.graph import BlockGraph, Op, accumulates, freeze_attrs
from mugraph.ir.ops import AccumKind, Group, Level, OpKind, as_accum_kind
from mugraph.ir.phase import Phase, op_phase
from mugraph.ir.shapes import ShapeContext, fmt, infer_output_types, normalize_dim
from mugraph.ir.tensor import DTensor, STensor, Tensor, TensorRef, TensorType, contiguous_strides

_CONTEXT_OPS = 12  # how many preceding operators an error message shows


class GraphBuilder:
    """What the kernel and block builders share: the op list and error reporting."""

    level: Level
    handle_type: type[Tensor]

    def __init__(self) -> None:
        self._ops: list[Op] = []

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(self._ops)

    def _render_context(self, pending: str) -> str:
        raise NotImplementedError

    def _fail(self, error: MugraphError, pending: str) -> MugraphError:
        """Return ``error`` with the surrounding graph appended to its message."""
        context = self._render_context(pending)
        return type(error)(f"{error}\n\n{context}")

    def _ref_text(self, ref: TensorRef) -> str:
        prefix = "b" if self.level is Level.BLOCK else "%"
        return f"{prefix}{ref.op}" + (f".{ref.index}" if ref.index else "")

    def _check_tensor(self, op: str, t: object) -> Tensor:
        if not isinstance(t, self.handle_type):
            kind = "STensor" if self.level is Level.BLOCK else "DTensor"
            error = GraphStructureError(f"{op}: expected a {kind} of this graph, got {t!r}")
            raise self._fail(error, op)
        if t.graph is not self:
            error = GraphStructureError(f"{op}: tensor {t.ref} belongs to another graph")
            raise self._fail(error, op)
        return t

    def _shape_context(self) -> ShapeContext:
        return ShapeContext(self.level)

    def _append(self, kind: OpKind, inputs: list[Tensor], attrs: dict[str, Any]) -> list:
        """Infer, check and append one operator; return handles to its outputs."""
        name = kind.value
        for t in inputs:
            self._check_tensor(name, t)
        pending = f"{name}({', '.join(self._ref_text(t.ref) for t in inputs)})"
        try:
            types = infer_output_types(kind, [t.type for t in inputs], attrs, self._shape_context())
            op = Op(kind, tuple(t.ref for t in inputs), freeze_attrs(attrs), tuple(types))
            self._check_new_op(op)
        except MugraphError as error:
            raise self._fail(error, pending) from None
        return self._push(op)

    def _check_new_op(self, op: Op) -> None:
        """Level-specific checks (phases, memory) on an operator about to be added."""

    def _push(self, op: Op) -> list:
        self._ops.append(op)
        index = len(self._ops) - 1
        return [self.handle_type(TensorRef(index, i), t, self) for i, t in enumerate(op.outputs)]

    # ---- operators shared by both levels -------------------------------------------------

    def _unary(self, kind: OpKind, t: Tensor, **attrs: Any) -> Any:
        return self._append(kind, [t], attrs)[0]

    def _binary(self, kind: OpKind, a: Tensor, b: Tensor) -> Any:
        return self._append(kind, [a, b], {})[0]

    def exp(self, t):
        return self._unary(OpKind.EXP, t)

    def square(self, t):
        return self._unary(OpKind.SQUARE, t)

    def sqrt(self, t):
        return self._unary(OpKind.SQRT, t)

    def silu(self, t):
        return self._unary(OpKind.SILU, t)

    def gelu(self, t):
        """GELU in its tanh form: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
        return self._unary(OpKind.GELU, t)

    def relu(self, t):
        return self._unary(OpKind.RELU, t)

    def clamp(self, t, min_val: float, max_val: float):
        lo, hi = _scalar("clamp", min_val, self), _scalar("clamp", max_val, self)
        if lo > hi:
            raise self._fail(ShapeError(f"clamp: min_val {lo} exceeds max_val {hi}"), "clamp")
        return self._unary(OpKind.CLAMP, t, min_val=lo, max_val=hi)

    def mul_scalar(self, t, scalar: float):
        return self._unary(OpKind.MUL_SCALAR, t, scalar=_scalar("mul_scalar", scalar, self))

    def pow(self, t, exponent: float):
        return self._unary(OpKind.POW, t, exponent=_scalar("pow", exponent, self))

    def add(self, a, b):
        return self._binary(OpKind.ADD, a, b)

    def sub(self, a, b):
        return self._binary(OpKind.SUB, a, b)

    def mul(self, a, b):
        return self._binary(OpKind.MUL, a, b)

    def div(self, a, b):
        return self._binary(OpKind.DIV, a, b)

    def matmul(self, a, b):
        return self._binary(OpKind.MATMUL, a, b)

    def reduction(self, t, dim: int):
        """Sum over ``dim``, keeping it with size 1."""
        self._check_tensor("reduction", t)
        dim = self._normalize_dim("reduction", dim, t)
        return self._unary(OpKind.REDUCTION, t, dim=dim)

    def concat(self, a, b, dim: int):
        self._check_tensor("concat", a)
        dim = self._normalize_dim("concat", dim, a)
        return self._append(OpKind.CONCAT, [a, b], {"dim": dim})[0]

    def reshape(self, t, dims):
        self._check_tensor("reshape", t)
        new = _dims("reshape", dims, self)
        return self._unary(OpKind.RESHAPE, t, dims=new)

    def _normalize_dim(self, op: str, dim: int, t: Tensor) -> int:
        try:
            return normalize_dim(op, dim, t.num_dims)
        except MugraphError as error:
            raise self._fail(error, op) from None


def _scalar(op: str, value: object, builder: GraphBuilder | None = None) -> float:
    error = None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        error = UnsupportedError(f"{op}: expected a number, got {value!r}")
    elif not math.isfinite(value):
        error = UnsupportedError(f"{op}: the scalar must be finite, got {value!r}")
    if error is not None:
        raise builder._fail(error, op) if builder else error
    return float(value)


def _eps_attr(eps: object, builder: GraphBuilder | None = None) -> dict[str, float]:
    """The ``eps`` attribute of rms_norm / the rms accumulator: absent when 0 (so graphs
    without one keep their hashes), else a finite non-negative float."""
    value = _scalar("rms eps", eps, builder)
    if value < 0:
        error = UnsupportedError(f"rms eps: must be >= 0, got {value!r}")
        raise builder._fail(error, "rms eps") if builder else error
    return {"eps": value} if value else {}


def _dims(op: str, dims: object, builder: GraphBuilder | None = None) -> tuple[int, ...]:
    try:
        out = tuple(dims)  # type: ignore[arg-type]
    except TypeError:
        out = None
    if (
        out is None
        or not out
        or any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in out)
    ):
        error = ShapeError(
            f"{op}: dims must be a non-empty sequence of positive ints, got {dims!r}"
        )
        raise (builder._fail(error, op) if builder else error) from None
    return out


# ---- kernel graphs -----------------------------------------------------------------------


class KernelGraph(GraphBuilder):
    """A kernel graph: operators over device tensors, some defined by block graphs."""

    level = Level.KERNEL
    handle_type = DTensor

    def __init__(self, gpu: GPUSpec = DEFAULT_GPU) -> None:
        super().__init__()
        self.gpu = gpu
        self._outputs: list[TensorRef] = []
        self._num_inputs = 0

    # inputs / outputs
    def new_input(self, dims, strides=None, dtype: DType | str = float16) -> DTensor:
        dims = _dims("new_input", dims, self)
        try:
            try:
                dtype = as_dtype(dtype)
            except DTypeError as error:
                raise DTypeError(f"new_input: {error}") from None
            strides = contiguous_strides(dims) if strides is None else tuple(strides)
            _check_strides("new_input", dims, strides)
        except MugraphError as error:
            raise self._fail(error, "input") from None
        attrs = {"index": self._num_inputs}
        self._num_inputs += 1
        return self._push(
            Op(OpKind.INPUT, (), freeze_attrs(attrs), (TensorType(dims, dtype, strides),))
        )[0]

    def mark_output(self, t: DTensor, strides=None) -> None:
        self._check_tensor("mark_output", t)
        if strides is not None:
            strides = tuple(strides)
            try:
                _check_strides("mark_output", t.dims, strides)
                if self._ops[t.ref.op].kind in Group.VIEW and strides != t.strides:
                    raise UnsupportedError(
                        f"mark_output: {t.ref} is a {self._ops[t.ref.op].kind.value} (a view); "
                        f"its strides are its input's {t.strides}, not {strides}")
            except MugraphError as error:
                raise self._fail(error, "output") from None
            op = self._ops[t.ref.op]
            outs = list(op.outputs)
            outs[t.ref.index] = TensorType(t.dims, t.dtype, strides)
            self._ops[t.ref.op] = Op(op.kind, op.inputs, op.attrs, tuple(outs))
        self._outputs.append(t.ref)

    @property
    def outputs(self) -> tuple[TensorRef, ...]:
        return tuple(self._outputs)

    @property
    def input_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self._ops if op.kind is OpKind.INPUT)

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return tuple(op.outputs[0] for op in self.input_ops)

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return tuple(self.tensor_type(r) for r in self._outputs)

    def tensor_type(self, ref: TensorRef) -> TensorType:
        return self._ops[ref.op].outputs[ref.index]

    # kernel-only operators
    def rms_norm(self, t: DTensor, normalized_shape, eps: float = 0.0) -> DTensor:
        """t / sqrt(mean(t², normalized dims) + eps); ``eps`` is kept only when nonzero."""
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        shape = _dims("rms_norm", shape, self)
        return self._unary(OpKind.RMS_NORM, t, normalized_shape=shape, **_eps_attr(eps, self))

    def permute(self, t: DTensor, perm) -> DTensor:
        """``t`` with its dims in the order ``perm`` (``transpose`` is a permute of two dims):
        a view of the same memory with permuted strides, no kernel and no copy."""
        self._check_tensor("permute", t)
        rank = t.num_dims
        if isinstance(perm, (list, tuple)) and all(
                isinstance(p, int) and -rank <= p < rank for p in perm):
            perm = tuple(p % rank for p in perm)
        return self._unary(OpKind.PERMUTE, t, perm=perm)

    def transpose(self, t: DTensor, dim0: int, dim1: int) -> DTensor:
        """``t`` with dims ``dim0`` and ``dim1`` swapped (a permute: a view)."""
        self._check_tensor("transpose", t)
        a = self._normalize_dim("transpose", dim0, t)
        b = self._normalize_dim("transpose", dim1, t)
        perm = list(range(t.num_dims))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(t, tuple(perm))

    def softmax(self, t: DTensor, dim: int = -1) -> DTensor:
        """exp, a sum over ``dim``, and a division (no max subtraction: the naive form)."""
        e = self.exp(t)
        return self.div(e, self.reduction(e, dim))

    def customized(self, inputs, tb_graph: ThreadBlockGraph) -> list[DTensor]:
        """Add a graph-defined kernel operator whose blocks run ``tb_graph``."""
        inputs = list(inputs)
        for t in inputs:
            self._check_tensor("customized", t)
        pending = f"customized({', '.join(str(t.ref) for t in inputs)})"
        try:
            if not isinstance(tb_graph, ThreadBlockGraph):
                raise GraphStructureError(
                    f"customized: expected a ThreadBlockGraph, got {type(tb_graph).__name__}"
                )
            block = tb_graph.to_block_graph()
            _check_customized_inputs(inputs, tb_graph)
            out_types = customized_output_types(block)
        except MugraphError as error:
            raise self._fail(error, pending) from None
        op = Op(
            OpKind.CUSTOMIZED,
            tuple(t.ref for t in inputs),
            freeze_attrs({"graph": block}),
            out_types,
        )
        return self._push(op)

    def _render_context(self, pending: str) -> str:
        from mugraph.ir.render import render_ops

        lines = render_ops(self._ops, Level.KERNEL, start=max(0, len(self._ops) - _CONTEXT_OPS))
        lines.append(f"  >>> {pending}   <- rejected")
        return "in kernel graph:\n" + "\n".join(lines)

    # graph-level services
    def check(self) -> None:
        """Whole-graph validity: at least one marked output."""
        if not self._outputs:
            raise GraphStructureError("kernel graph has no marked output (call mark_output)")

    def structural_hash(self) -> str:
        from mugraph.ir.hashing import kernel_graph_hash

        return kernel_graph_hash(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KernelGraph):
            return NotImplemented
        return self.structural_hash() == other.structural_hash()

    def __hash__(self) -> int:
        return hash(self.structural_hash())

    def __str__(self) -> str:
        from mugraph.ir.render import render_kernel_graph

        return render_kernel_graph(self)

    __repr__ = __str__

    def to_json(self) -> str:
        from mugraph.ir.serialize import to_json

        return to_json(self)

    def to_text(self) -> str:
        """The text form that ``mugraph.from_text`` reads back (:mod:`mugraph.ir.text`)."""
        from mugraph.ir.text import to_text

        return to_text(self)

    def superoptimize(self, config=None, *, time_limit: float | None = None, **options):
        """The best verified μGraph computing this graph's function (a KernelGraph).

        ``config`` None (the default) searches the space of the program's shape class, picked
        and sized from its shapes (``mugraph.search.space``: attention, gemv, lora, mlp,
        elementwise or generic; ``mugraph.search.space.classify(graph)`` says which); a
        preset name or a SearchConfig replaces that choice, and keywords naming SearchConfig
        fields override single fields of it (``time_limit``, ``workers``, ``min_blocks``...).
        Other keywords choose how the search runs (``workers``, ``engine="local" | "ray"``,
        ``address``, ``start_method``, ``checkpoint``, ``progress``, ``target_cost``: see
        ``mugraph.search.driver.superoptimize``) and how candidates are ranked (``ranking``:
        measured on the GPU when there is one). ``cache`` (a directory, True for the default
        one, or a ResultCache) answers from, and stores in, mugraph's result cache. The search
        result (a SearchResult: every verified candidate, statistics; for a program split into
        subprograms, each part's result in ``.parts``) is kept as ``.search_result`` on the
        returned graph, its check against this graph as ``.verification`` and the ranking as
        ``.ranking``. When nothing better is found, this graph itself is returned.
        """
        from mugraph.search.api import superoptimize_graph

        return superoptimize_graph(self, config, time_limit=time_limit, **options)

    def __call__(self, inputs=None, **kwargs):
        from mugraph.runtime.call import call_graph

        return call_graph(self, inputs, **kwargs)


def _check_strides(op: str, dims: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Strides must give every element its own address (no overlap)."""
    if len(strides) != len(dims) or any(not isinstance(s, int) or s < 1 for s in strides):
        raise ShapeError(f"{op}: strides {strides} do not fit dims {fmt(dims)}")
    order = sorted((s, d) for s, d in zip(strides, dims, strict=True) if d > 1)
    span = 1
    for s, d in order:
        if s < span:
            raise ShapeError(f"{op}: strides {strides} make elements of {fmt(dims)} overlap")
        span = s * d


def _check_customized_inputs(inputs: list[DTensor], tb_graph: ThreadBlockGraph) -> None:
    expected = tb_graph._dtensors
    if len(inputs) != len(expected):
        raise GraphStructureError(
            f"customized: {len(inputs)} inputs given, but the block graph has "
            f"{len(expected)} input iterators"
        )
    for i, (given, want) in enumerate(zip(inputs, expected, strict=True)):
        if given.type != want.type or given.ref != want.ref or given.graph is not want.graph:
            raise GraphStructureError(
                f"customized: input {i} is {given}, but the block graph's input iterator {i} "
                f"was made from {want}"
            )


def customized_output_types(block: BlockGraph) -> tuple[TensorType, ...]:
    """The device tensors a block graph writes, assembled by omap and forloop_dim (summed over
    blocks where the output accumulates)."""
    outs = []
    for op in block.output_ops:
        tile = block.tensor_type(op.inputs[0])
        summed = accumulates(op)
        dims = maps.output_dims(
            "new_output",
            tile.dims,
            block.grid_dim,
            op.attr("omap"),
            block.forloop_range,
            op.attr("forloop_dim"),
            summed,
        )
        outs.append(TensorType(dims, tile.dtype, contiguous_strides(dims)))
    return tuple(outs)


# ---- thread-block graphs -----------------------------------------------------------------


class ThreadBlockGraph(GraphBuilder):
    """The computation of one thread block, repeated over a grid and a for-loop."""

    level = Level.BLOCK
    handle_type = STensor

    def __init__(
        self,
        grid_dim,
        block_dim=(128, 1, 1),
        forloop_range: int = 1,
        reduction_dimx: int = 64,
        gpu: GPUSpec = DEFAULT_GPU,
    ) -> None:
        super().__init__()
        self.grid_dim = maps.normalize_grid("new_threadblock_graph", grid_dim)
        self.block_dim = _check_block_dim(block_dim, gpu)
        for name, value in (("forloop_range", forloop_range), ("reduction_dimx", reduction_dimx)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise maps.MapError(
                    f"new_threadblock_graph: {name} must be a positive int, got {value!r}"
                )
        self.forloop_range = forloop_range
        self.reduction_dimx = reduction_dimx
        self.gpu = gpu
        self._phases: list[Phase] = []
        self._dtensors: list[DTensor] = []

    def _shape_context(self) -> ShapeContext:
        return ShapeContext(Level.BLOCK, self.forloop_range, self.reduction_dimx)

    def _push(self, op: Op) -> list:
        self._phases.append(self._phase_of(op))
        return super()._push(op)

    def _phase_of(self, op: Op) -> Phase:
        return op_phase(op, (self._phases[r.op] for r in op.inputs))

    def phase(self, t: STensor) -> Phase:
        return self._phases[t.ref.op]

    def _check_new_op(self, op: Op) -> None:
        phases = [self._phases[r.op] for r in op.inputs]
        if Phase.LOOP in phases and Phase.POST in phases:
            raise GraphStructureError(
                f"{op.kind.value}: mixes a value computed inside the for-loop with one "
                f"computed after it (an accumulator's result)"
            )
        if op.kind in Group.ACCUMULATOR and Phase.POST in phases:
            raise GraphStructureError(
                f"{op.kind.value}: its input is already accumulated over the for-loop"
            )
        used = self.shared_memory_bytes() + sum(t.num_bytes for t in op.outputs)
        if used > self.gpu.shared_memory_per_block:
            raise SharedMemoryError(
                f"{op.kind.value}: shared memory of the block graph would reach {used} bytes, "
                f"over the {self.gpu.name} budget of {self.gpu.shared_memory_per_block} bytes"
            )

    def shared_memory_bytes(self) -> int:
        """Bytes of all shared-memory tensors of the block graph so far."""
        return sum(t.num_bytes for op in self._ops for t in op.outputs)

    # input iterators and output savers
    def new_input(self, dtensor: DTensor, input_map, forloop_dim: int) -> STensor:
        pending = "new_input"
        try:
            if not isinstance(dtensor, DTensor):
                raise GraphStructureError(f"new_input: expected a DTensor, got {dtensor!r}")
            rank = dtensor.num_dims
            imap = maps.normalize_map("new_input", "input_map", input_map, rank)
            fdim = maps.check_forloop_dim("new_input", forloop_dim, rank)
            tile = maps.input_tile_dims(
                "new_input", dtensor.dims, self.grid_dim, imap, self.forloop_range, fdim
            )
            attrs = {
                "index": len(self._dtensors),
                "imap": imap,
                "forloop_dim": fdim,
                "dtensor": dtensor.type,
            }
            op = Op(OpKind.BLOCK_INPUT, (), freeze_attrs(attrs), (TensorType(tile, dtensor.dtype),))
            self._check_new_op(op)
        except MugraphError as error:
            raise self._fail(error, pending) from None
        self._dtensors.append(dtensor)
        return self._push(op)[0]

    def new_output(
        self, stensor: STensor, output_map, forloop_dim: int = -1, accumulate: bool = False
    ) -> None:
        """Save a tile: ``output_map`` places the blocks' tiles in the output, ``forloop_dim``
        the iterations'. With ``accumulate`` the blocks along the grid axes the map leaves out
        (-1) add their tiles into the same part of the output instead."""
        self._check_tensor("new_output", stensor)
        pending = f"new_output({self._ref_text(stensor.ref)})"
        try:
            if not isinstance(accumulate, bool):
                raise maps.MapError(f"new_output: accumulate must be a bool, got {accumulate!r}")
            rank = stensor.num_dims
            omap = maps.normalize_map("new_output", "output_map", output_map, rank)
            fdim = maps.check_forloop_dim("new_output", forloop_dim, rank)
            maps.output_dims(
                "new_output", stensor.dims, self.grid_dim, omap, self.forloop_range, fdim,
                accumulate,
            )
            phase = self.phase(stensor)
            if self.forloop_range > 1 and fdim < 0 and phase is Phase.LOOP:
                raise GraphStructureError(
                    "new_output: the tensor changes every for-loop iteration; accumulate it "
                    "(forloop_accum) or give a forloop_dim to concatenate the iterations"
                )
            if fdim >= 0 and phase is Phase.POST:
                raise GraphStructureError(
                    "new_output: an accumulator's result is written once; it cannot be "
                    f"concatenated over iterations (forloop_dim={fdim})"
                )
        except MugraphError as error:
            raise self._fail(error, pending) from None
        attrs = {"omap": omap, "forloop_dim": fdim}
        if accumulate:  # absent otherwise: existing graphs keep their attributes and hashes
            attrs["accumulate"] = True
        self._push(Op(OpKind.BLOCK_OUTPUT, (stensor.ref,), freeze_attrs(attrs), ()))

    # block-only operators
    def rms_norm(self, t: STensor, eps: float = 0.0) -> STensor:
        """t / sqrt(mean(t², last dim) + eps)."""
        self._check_tensor("rms_norm", t)
        return self._unary(
            OpKind.RMS_NORM, t, normalized_shape=(t.dims[-1],), **_eps_attr(eps, self)
        )

    def reduction_max(self, t: STensor, dim: int) -> STensor:
        self._check_tensor("reduction_max", t)
        dim = self._normalize_dim("reduction_max", dim, t)
        return self._unary(OpKind.REDUCTION_MAX, t, dim=dim)

    def forloop_accum(self, t: STensor, acc: str | None = None, eps: float = 0.0) -> STensor:
        """Combine the iterations' tiles (see AccumKind); ``eps`` goes under the root of
        ``"rms"``: sqrt(mean(t²) + eps)."""
        try:
            kind = as_accum_kind(acc)
            extra = _eps_attr(eps, self)
            if extra and kind is not AccumKind.RMS:
                raise UnsupportedError(
                    f"forloop_accum: eps={eps} is only meaningful for acc='rms', not {kind.value!r}"
                )
        except MugraphError as error:
            raise self._fail(error, "forloop_accum") from None
        return self._unary(OpKind.FORLOOP_ACCUM, t, acc=kind, **extra)

    def forloop_accum_max(self, t: STensor) -> STensor:
        return self._unary(OpKind.FORLOOP_ACCUM_MAX, t)

    def forloop_accum_rescale(
        self, t: STensor, rescale: STensor, acc: str | None = None
    ) -> STensor:
        """acc ← acc·rescale + t each iteration (online softmax); "sum" reduces t's last dim."""
        try:
            kind = as_accum_kind(acc, operator="forloop_accum_rescale")
            if kind not in (AccumKind.NONE, AccumKind.SUM):
                raise UnsupportedError(
                    f"forloop_accum_rescale: accumulator {kind.value!r} is not supported "
                    "(use None or 'sum')"
                )
        except MugraphError as error:
            raise self._fail(error, "forloop_accum_rescale") from None
        return self._append(OpKind.FORLOOP_ACCUM_RESCALE, [t, rescale], {"acc": kind})[0]

    def thread_graph(self, inputs, program) -> STensor:
        """A fused chain of elementwise operators (see :mod:`mugraph.ir.thread`)."""
        from mugraph.ir.thread import check_program

        inputs = list(inputs)
        try:
            program = check_program(program, len(inputs))
        except MugraphError as error:
            raise self._fail(error, "thread_graph") from None
        return self._append(OpKind.THREAD_GRAPH, inputs, {"program": program})[0]

    def to_block_graph(self) -> BlockGraph:
        """Freeze: every block graph needs an output, and all its values must be used."""
        if not any(op.kind is OpKind.BLOCK_OUTPUT for op in self._ops):
            raise GraphStructureError("block graph has no output (call new_output)")
        return BlockGraph(
            self.grid_dim, self.block_dim, self.forloop_range, self.reduction_dimx, tuple(self._ops)
        )

    def _render_context(self, pending: str) -> str:
        from mugraph.ir.render import render_block_header, render_ops

        lines = [render_block_header(self.grid_dim, self.block_dim, self.forloop_range)]
        lines += render_ops(self._ops, Level.BLOCK, start=max(0, len(self._ops) - _CONTEXT_OPS))
        lines.append(f"  >>> {pending}   <- rejected")
        return "in block graph:\n" + "\n".join(lines)


def _check_block_dim(block_dim, gpu: GPUSpec) -> tuple[int, int, int]:
    dims = tuple(block_dim) if isinstance(block_dim, (tuple, list)) else ()
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise maps.MapError(
            f"new_threadblock_graph: block_dim must be 1 to 3 positive ints, got {block_dim!r}"
        )
    dims = (*dims, *(1,) * (3 - len(dims)))
    if math.prod(dims) > gpu.max_threads_per_block:
        raise maps.MapError(
            f"new_threadblock_graph: block_dim {dims} has {math.prod(dims)} threads, over the "
            f"limit of {gpu.max_threads_per_block}"
        )
    return dims  # type: ignore[return-value]


def expect_kernel_graph(value: Any, what: str) -> KernelGraph:
    """``value`` if it is a kernel graph; else the error a public entry point gives for it
    (``what`` names the function and the argument)."""
    if not isinstance(value, KernelGraph):
        raise GraphStructureError(
            f"{what}: expected a mugraph KernelGraph, got {type(value).__name__}")
    return value


def new_kernel_graph(gpu: GPUSpec = DEFAULT_GPU) -> KernelGraph:
    """Start an empty kernel graph."""
    return KernelGraph(gpu)


def new_threadblock_graph(
    grid_dim,
    block_dim=(128, 1, 1),
    forloop_range: int = 1,
    reduction_dimx: int = 64,
    gpu: GPUSpec = DEFAULT_GPU,
) -> ThreadBlockGraph:
    """Start an empty thread-block graph for a graph-defined kernel operator."""
    return ThreadBlockGraph(grid_dim, block_dim, forloop_range, reduction_dimx, gpu)
