"""The lowered IR: one custom kernel as Graphene-style tensors, thread groups and specs.

Between a block graph (what each block computes) and its Triton source (how) lies a set of
decisions the code generator makes implicitly; this module states them as data, after
Graphene (``shared/seeds/001``) and the Mirage transpiler's plan (``shared/seeds/004``):

- **tensors** ``name:[dims].dtype.memory``: the kernel's device tensors (``GL``), the loop
  loads Triton stages through shared memory (``SH``), every other block value a register tile
  (``RF``) of the padded shape of :mod:`mugraph.codegen.padding`, leading size-1 dims left out
  as :func:`~mugraph.codegen.decisions.squeezed_lead` says;
- **layouts** (:mod:`mugraph.ir.layout`): each device tensor's ``shape:stride``, and each
  block's tile of it as a division of that layout: its tile, one mode per for-loop iteration
  (``forloop_dim``) and one per grid axis (``imap`` / ``omap``; stride 0 where the tile is
  replicated) — :class:`TileDivision`, built with ``logical_divide`` only;
- **threads** as a tensor: ``#threads:(32,warps):(1,32)``, lanes fastest; each register tile
  spread over them as a (thread, value) layout (a blocked distribution: every thread holds
  ``padded elements / threads`` values; Triton picks its own layouts, the count is what
  register pressure depends on);
- **specs**: Move (global → register or shared, register → global), View (a reshape that only
  reinterprets), MatMul, Elementwise, Reduce, Init and Accumulate, each placed before the
  for-loop, in it or after it by :func:`mugraph.ir.phase.block_phases` (the classification
  the code generator uses): an accumulator is initialised before the loop, accumulated in
  it and finished after it; an output with a ``forloop_dim`` is stored in every iteration;
- **footprints**: shared memory (per pipeline stage: the padded loop loads that only feed
  ``tl.dot``, times ``num_stages``) and the largest register tile per thread.

Like the code generator, values no output needs are not lowered (they are listed as unused),
a concat of two loaded tiles is one load from two address ranges, and a matmul of two
concatenations split at the same place is the sum of its parts' products. Not modelled: the
softmax carry and the stable exp's running maxima (:mod:`mugraph.codegen.stable_exp`),
deferred accumulator reductions, and the transposed products of the Triton 3.6 workaround.

It lives in ``mugraph.codegen`` rather than ``mugraph.ir`` because it is built from the code
generator's own decisions (padding, the left-out lead, which products are ``tl.dot``,
reshapes that reinterpret, the default launch): the IR never imports the layers below it.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from mugraph.codegen.decisions import (
    CodegenOptions,
    lowers_to_dot,
    reshape_is_reinterpretation,
    squeezed_lead,
)
from mugraph.codegen.decisions import unrolled as loop_unrolled
from mugraph.codegen.launch import default_launch
from mugraph.codegen.padding import padded_shapes, split_matmul_parts
from mugraph.dtypes import DType
from mugraph.errors import MapError, UnsupportedError
from mugraph.ir import maps
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.layout import Layout, LayoutError, logical_divide, make_layout
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.phase import Phase, block_phases
from mugraph.ir.tensor import TensorRef, TensorType, contiguous_strides
from mugraph.ir.thread import render_program
from mugraph.ir.tiling import TileDivision, tile_division

LANES = 32  # threads of a warp
PRE, LOOP, POST = Phase.INVARIANT, Phase.LOOP, Phase.POST


class LoweringError(UnsupportedError):
    """A block graph the lowered IR cannot describe (names the kernel, the operator and what
    is wrong with it)."""


class Memory(enum.Enum):
    """Where a tensor lives; the value is Graphene's abbreviation."""

    GLOBAL = "GL"
    SHARED = "SH"
    REGISTER = "RF"


DTYPE_NAMES = {DType.float16: "fp16", DType.bfloat16: "bf16", DType.float32: "fp32"}


@dataclass(frozen=True)
class LoweredTensor:
    """``name:[dims].dtype.memory``: a named tensor of the lowered kernel."""

    name: str
    dims: tuple[int, ...]
    dtype: DType
    memory: Memory

    def __str__(self) -> str:
        return f"{self.name}:{dims_text(self.dims)}.{DTYPE_NAMES[self.dtype]}.{self.memory.value}"


def dims_text(dims: tuple[int, ...]) -> str:
    return f"[{','.join(map(str, dims))}]"


# ---- device tensors and their tiles -------------------------------------------------------------


@dataclass(frozen=True)
class GlobalTile:
    """A device tensor the kernel reads (an input) or writes (an output), its layout and the
    division of that layout among blocks and iterations."""

    tensor: LoweredTensor
    layout: Layout
    division: TileDivision


# ---- register and shared tiles ------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterTile:
    """A block value held in registers: its tensor (dims without the left-out lead), its
    padded shape, and how the threads hold it: ``threads_values`` maps (thread, value) to
    the element of the row-major padded tile (stride 0 where threads hold copies)."""

    tensor: LoweredTensor
    padded: tuple[int, ...]
    threads_values: Layout
    view_of: str | None = None  # a reshape that only reinterprets another tile

    @property
    def padded_elements(self) -> int:
        return math.prod(self.padded)

    @property
    def elements_per_thread(self) -> int:
        return self.threads_values.mode(1).size

    @property
    def bytes_per_thread(self) -> int:
        return self.elements_per_thread * self.tensor.dtype.itemsize


@dataclass(frozen=True)
class SharedTile:
    """A loop load staged through shared memory for ``tl.dot`` (one buffer per pipeline
    stage), or a view of one."""

    tensor: LoweredTensor
    padded: tuple[int, ...]
    view_of: str | None = None

    @property
    def bytes_per_stage(self) -> int:
        """Bytes of one stage's buffer (0 for a view: it shares its source's)."""
        if self.view_of is not None:
            return 0
        return math.prod(self.padded) * self.tensor.dtype.itemsize


@functools.lru_cache(maxsize=4096)
def threads_values(padded_elements: int, threads: int) -> Layout:
    """The (thread, value) layout of a tile of ``padded_elements`` over ``threads``: each
    thread a run of consecutive elements; threads beyond the tile's elements hold copies."""
    values = max(1, padded_elements // threads)
    per_value, runs = logical_divide(Layout(padded_elements, 1), Layout(values, 1)).modes()
    if runs.size < threads:
        runs = make_layout(runs, Layout(threads // runs.size, 0))
    return make_layout(runs, per_value)


# ---- specs --------------------------------------------------------------------------------------


class SpecKind(enum.Enum):
    """What a spec does; the value is how the printer names it."""

    MOVE = "Move"
    VIEW = "View"
    MATMUL = "MatMul"
    ELEMENTWISE = "Elementwise"
    REDUCE = "Reduce"
    INIT = "Init"
    ACCUMULATE = "Accumulate"


@dataclass(frozen=True)
class Spec:
    """``outputs <- Kind<variant>(inputs)``, run by all the block's threads in ``phase``, for
    block operator ``op``. ``variant``: which operator, reduction or accumulation (for a
    Move, its ``route``: the memories it goes through); ``detail``: the rest, in words."""

    kind: SpecKind
    phase: Phase
    op: int
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    variant: str = ""
    route: tuple[Memory, ...] = ()
    detail: str = ""


# ---- the kernel ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoweredKernel:
    """One custom kernel, lowered: its launch, tensors, specs and footprints."""

    name: str
    grid: tuple[int, int, int]
    forloop_range: int
    num_warps: int
    num_stages: int
    lead: int  # leading size-1 dims every register tile leaves out
    unrolled: bool  # the for-loop is unrolled (then nothing is pipelined)
    threads: Layout  # (lane, warp) -> thread id
    global_tiles: tuple[GlobalTile, ...]  # inputs by index, then outputs
    shared: tuple[SharedTile, ...]
    registers: tuple[RegisterTile, ...]
    specs: tuple[Spec, ...]
    unused: tuple[str, ...]  # block values no output needs (never computed)

    @property
    def num_threads(self) -> int:
        return self.threads.size

    @property
    def shared_bytes_per_stage(self) -> int:
        return sum(t.bytes_per_stage for t in self.shared)

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the pipelined loads: one buffer per stage."""
        return self.shared_bytes_per_stage * self.num_stages

    @property
    def largest_register_tile(self) -> RegisterTile | None:
        """The register tile with the most values per thread (the first of equals)."""
        return max(self.registers, key=lambda t: t.elements_per_thread, default=None)

    @property
    def register_elements_per_thread(self) -> int:
        largest = self.largest_register_tile
        return largest.elements_per_thread if largest is not None else 0

    def phase_specs(self, phase: Phase) -> tuple[Spec, ...]:
        return tuple(s for s in self.specs if s.phase is phase)


# ---- lowering -----------------------------------------------------------------------------------


class _Lowering:
    """The facts one kernel's lowering consults, computed once (block-graph analyses)."""

    def __init__(self, block: BlockGraph, name: str, outputs: tuple[TensorType, ...] | None,
                 num_warps: int) -> None:
        self.block = block
        self.name = name
        self.outputs = outputs
        self.threads = num_warps * LANES
        self.lead = squeezed_lead(block)
        self.pads = padded_shapes(block)
        self.phases = block_phases(block)
        self.reads = {i: operands_read(block, op) for i, op in enumerate(block.ops)}
        self.live = needed_ops(block, self.reads)
        self.consumers = _consumers(self.reads, self.live)
        self.unrolled = loop_unrolled(block, CodegenOptions())
        self.staged = {i for i in self.live if self._staged(i)}

    # ---- naming and shapes --------------------------------------------------------------

    def fail(self, index: int, why: str) -> LoweringError:
        op = self.block.ops[index]
        return LoweringError(f"lowering {self.name}: {op.kind.value} b{index}: {why}")

    def value(self, ref: TensorRef) -> str:
        return f"%b{ref.op}" + (f".{ref.index}" if ref.index else "")

    def tile_dims(self, ref: TensorRef) -> tuple[int, ...]:
        return self.block.tensor_type(ref).dims[self.lead:]

    def tile_pad(self, ref: TensorRef) -> tuple[int, ...]:
        return self.pads[ref][self.lead:]

    def axis(self, dim: int) -> int:
        return dim - self.lead if dim >= 0 else dim

    def is_load(self, index: int) -> bool:
        """A block input, or a concat of two (one load from two address ranges)."""
        op = self.block.ops[index]
        return op.kind is OpKind.BLOCK_INPUT or _concat_of_loads(self.block, op)

    def reinterprets(self, index: int) -> bool:
        op = self.block.ops[index]
        if op.kind is not OpKind.RESHAPE:
            return False
        src, out = op.inputs[0], TensorRef(index)
        return reshape_is_reinterpretation(self.tile_dims(src), self.tile_pad(src),
                                           self.tile_dims(out), self.tile_pad(out))

    def memory(self, index: int) -> Memory:
        if index in self.staged:
            return Memory.SHARED
        if self.reinterprets(index):
            return self.memory(self.block.ops[index].inputs[0].op)
        return Memory.REGISTER

    def register_dtype(self, index: int) -> DType:
        """Loads keep their memory type until computed on; computed values are float32."""
        op = self.block.ops[index]
        if self.is_load(index):
            return op.outputs[0].dtype
        if self.reinterprets(index):
            return self.register_dtype(op.inputs[0].op)
        return DType.float32

    # ---- staging --------------------------------------------------------------------------

    def _staged(self, index: int) -> bool:
        """A loop load that only feeds ``tl.dot`` (through views), in a pipelined loop."""
        pipelined = self.block.forloop_range > 1 and not self.unrolled
        return (pipelined and self.phases[index] is LOOP and self.is_load(index)
                and self._feeds_dots_only(index))

    def _feeds_dots_only(self, index: int) -> bool:
        users = self.consumers.get(index, ())
        return bool(users) and all(self._dot_use(index, c) for c in users)

    def _dot_use(self, index: int, consumer: int) -> bool:
        op = self.block.ops[consumer]
        if op.kind is OpKind.RESHAPE:
            return self.reinterprets(consumer) and self._feeds_dots_only(consumer)
        if op.kind is not OpKind.MATMUL:
            return False
        return any(index in (a.op, b.op) and lowers_to_dot(self.block, a, b)
                   for a, b in matmul_pairs(self.block, op))


def _concat_of_loads(block: BlockGraph, op: Op) -> bool:
    return op.kind is OpKind.CONCAT and all(
        block.ops[r.op].kind is OpKind.BLOCK_INPUT for r in op.inputs)


def matmul_pairs(block: BlockGraph, op: Op) -> list[tuple[TensorRef, TensorRef]]:
    """The (A, B) products a matmul is emitted as: its parts when split, else its operands."""
    return split_matmul_parts(block, *op.inputs[:2]) or [tuple(op.inputs[:2])]


def operands_read(block: BlockGraph, op: Op) -> tuple[TensorRef, ...]:
    """The block values an operator's emission reads: none for a concat of loads (it reads
    device memory), the parts of a split matmul, else its inputs."""
    if _concat_of_loads(block, op):
        return ()
    if op.kind is OpKind.MATMUL:
        return tuple(r for pair in matmul_pairs(block, op) for r in pair)
    return op.inputs


def needed_ops(block: BlockGraph, reads: dict[int, tuple[TensorRef, ...]]) -> frozenset[int]:
    """Positions of the operators the outputs need (the outputs included)."""
    todo = [i for i, op in enumerate(block.ops) if op.kind is OpKind.BLOCK_OUTPUT]
    seen: set[int] = set()
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(r.op for r in reads[i])
    return frozenset(seen)


def _consumers(reads: dict[int, tuple[TensorRef, ...]],
               live: Iterable[int]) -> dict[int, tuple[int, ...]]:
    found: dict[int, list[int]] = {}
    for i in sorted(live):
        for r in reads[i]:
            if i not in found.setdefault(r.op, []):
                found[r.op].append(i)
    return {k: tuple(v) for k, v in found.items()}


# ---- lowering: device tensors -------------------------------------------------------------------


def _device_layout(t: TensorType) -> Layout:
    strides = t.strides if t.strides is not None else contiguous_strides(t.dims)
    return Layout(tuple(t.dims), tuple(strides))


def _global_tile(lw: _Lowering, index: int, name: str, device: TensorType,
                 tile: tuple[int, ...], grid_map, forloop_dim: int) -> GlobalTile:
    block = lw.block
    layout = _device_layout(device)
    try:
        division = tile_division(layout, tile, block.grid_dim, grid_map, block.forloop_range,
                                 forloop_dim)
    except LayoutError as error:
        raise lw.fail(index, f"{name} {layout} does not divide into tiles of "
                      f"{list(tile)}: {error}") from None
    return GlobalTile(LoweredTensor(name, tuple(device.dims), device.dtype, Memory.GLOBAL),
                      layout, division)


def _mapped_dims(lw: _Lowering, index: int, name: str, what: str, grid_map, forloop_dim: int,
                 dims, derive) -> tuple[int, ...]:
    """``derive(name, dims, grid, grid_map, forloop_range, forloop_dim)`` (a tile from its
    tensor, or a tensor from its tile) after checking that ``grid_map`` and ``forloop_dim``
    name distinct, existing dims of ``dims``; a map error fails the lowering at ``index``."""
    block = lw.block
    try:
        maps.normalize_map(name, what, grid_map, len(dims))
        maps.check_forloop_dim(name, forloop_dim, len(dims))
        return derive(name, dims, block.grid_dim, grid_map, block.forloop_range, forloop_dim)
    except MapError as error:
        raise lw.fail(index, str(error)) from None


def _input_tile(lw: _Lowering, index: int, op: Op) -> GlobalTile:
    device: TensorType = op.attr("dtensor")
    imap, fdim = op.attr("imap"), op.attr("forloop_dim")
    name = f"%in{op.attr('index')}"
    tile = _mapped_dims(lw, index, name, "imap", imap, fdim, device.dims, maps.input_tile_dims)
    if tile != op.outputs[0].dims:
        raise lw.fail(index, f"its tile {list(op.outputs[0].dims)} is not what imap {imap} and "
                      f"forloop_dim {fdim} make of {name} {list(device.dims)} ({list(tile)})")
    return _global_tile(lw, index, name, device, tile, imap, fdim)


def _output_tile(lw: _Lowering, index: int, op: Op, j: int) -> GlobalTile:
    tile_type = lw.block.tensor_type(op.inputs[0])
    omap, fdim = op.attr("omap"), op.attr("forloop_dim")
    name = f"%out{j}"
    dims = _mapped_dims(lw, index, name, "omap", omap, fdim, tile_type.dims, maps.output_dims)
    device = TensorType(dims, tile_type.dtype)
    if lw.outputs is not None:
        device = lw.outputs[j]
        if tuple(device.dims) != dims:
            raise lw.fail(index, f"omap {omap} and forloop_dim {fdim} assemble {list(dims)}, "
                          f"but the kernel's output {j} is {list(device.dims)}")
    return _global_tile(lw, index, name, device, tile_type.dims, omap, fdim)


def _global_tiles(lw: _Lowering) -> tuple[GlobalTile, ...]:
    block = lw.block
    inputs = sorted((op.attr("index"), i, op) for i, op in enumerate(block.ops)
                    if op.kind is OpKind.BLOCK_INPUT)
    tiles = [_input_tile(lw, i, op) for _, i, op in inputs]
    outputs = [(i, op) for i, op in enumerate(block.ops) if op.kind is OpKind.BLOCK_OUTPUT]
    if lw.outputs is not None and len(lw.outputs) != len(outputs):
        raise LoweringError(f"lowering {lw.name}: {len(outputs)} block outputs for "
                            f"{len(lw.outputs)} kernel outputs")
    tiles += [_output_tile(lw, i, op, j) for j, (i, op) in enumerate(outputs)]
    return tuple(tiles)


# ---- lowering: tiles in registers and shared memory ---------------------------------------------


def _value_tiles(lw: _Lowering) -> tuple[tuple[SharedTile, ...], tuple[RegisterTile, ...]]:
    shared: list[SharedTile] = []
    registers: list[RegisterTile] = []
    for i in sorted(lw.live):
        op = lw.block.ops[i]
        if op.kind is OpKind.BLOCK_OUTPUT:
            continue
        ref = TensorRef(i)
        memory = lw.memory(i)
        tensor = LoweredTensor(lw.value(ref), lw.tile_dims(ref), lw.register_dtype(i), memory)
        view_of = lw.value(op.inputs[0]) if lw.reinterprets(i) else None
        if memory is Memory.SHARED:
            shared.append(SharedTile(tensor, lw.tile_pad(ref), view_of))
        else:
            registers.append(_register_tile(lw, tensor, lw.tile_pad(ref), view_of))
        if op.kind is OpKind.MATMUL:
            registers += _product_tiles(lw, i, op)
    return tuple(shared), tuple(registers)


def _register_tile(lw: _Lowering, tensor: LoweredTensor, padded: tuple[int, ...],
                   view_of: str | None = None) -> RegisterTile:
    return RegisterTile(tensor, padded, threads_values(math.prod(padded), lw.threads), view_of)


def _product_tiles(lw: _Lowering, index: int, op: Op) -> list[RegisterTile]:
    """The [.., M, K, N] products of a matmul done as a broadcast multiply and a sum."""
    found = []
    for k, (a, b) in enumerate(matmul_pairs(lw.block, op)):
        if lowers_to_dot(lw.block, a, b):
            continue
        pa, pb = lw.tile_pad(a), lw.tile_pad(b)
        dims = (*lw.tile_dims(a), lw.tile_dims(b)[-1])
        suffix = ".product" + (str(k) if k else "")
        tensor = LoweredTensor(f"%b{index}{suffix}", dims, DType.float32, Memory.REGISTER)
        found.append(_register_tile(lw, tensor, (*pa, pb[-1])))
    return found


# ---- lowering: specs, one rule per operator kind ------------------------------------------------


def _specs(lw: _Lowering) -> tuple[Spec, ...]:
    """Every live operator's specs, before-loop ones first, then the loop's, then after-loop
    ones; in operator order within each part."""
    specs: list[Spec] = []
    outputs = 0
    for i in sorted(lw.live):
        op = lw.block.ops[i]
        if op.kind is OpKind.BLOCK_OUTPUT:
            specs.append(_store_spec(lw, i, op, outputs))
            outputs += 1
            continue
        rule = SPEC_RULES.get(op.kind)
        if rule is None:
            raise lw.fail(i, "not an operator of a block graph; nothing to lower it to")
        specs += rule(lw, i, op)
    return tuple(sorted(specs, key=lambda s: int(s.phase)))  # sorted() is stable


def _spec(lw: _Lowering, kind: SpecKind, i: int, variant: str = "", detail: str = "",
          inputs: tuple[str, ...] | None = None, phase: Phase | None = None,
          route: tuple[Memory, ...] = ()) -> Spec:
    """The spec of block operator ``i`` defining its value (by default: in the operator's
    phase, reading the operator's inputs)."""
    if inputs is None:
        inputs = tuple(lw.value(r) for r in lw.block.ops[i].inputs)
    return Spec(kind, lw.phases[i] if phase is None else phase, i, (lw.value(TensorRef(i)),),
                inputs, variant, route, detail)


SCRATCH_ROUTE = (Memory.REGISTER, Memory.GLOBAL, Memory.REGISTER)  # store, barrier, load


def _load_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    sources = [lw.block.ops[r.op] for r in op.inputs] if op.kind is OpKind.CONCAT else [op]
    names = tuple(f"%in{s.attr('index')}" for s in sources)
    target = lw.memory(i)
    notes = []
    if op.kind is OpKind.CONCAT:
        notes.append(f"concat along axis {lw.axis(op.attr('dim'))}: two address ranges")
    if target is Memory.SHARED:
        notes.append("staged for tl.dot")
    return [_spec(lw, SpecKind.MOVE, i, detail="; ".join(notes), inputs=names,
                  route=(Memory.GLOBAL, target))]


def _store_spec(lw: _Lowering, i: int, op: Op, j: int) -> Spec:
    """Output ``j``'s store: in every iteration with a forloop_dim, else where its value is."""
    fdim = op.attr("forloop_dim")
    phase = LOOP if fdim >= 0 else lw.phases[i]
    route = (lw.memory(op.inputs[0].op), Memory.GLOBAL)
    detail = "a tile every iteration" if fdim >= 0 else ""
    return Spec(SpecKind.MOVE, phase, i, (f"%out{j}",), (lw.value(op.inputs[0]),), "", route,
                detail)


def _elementwise_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    detail = ", ".join(f"{k}={v}" for k, v in op.attrs)
    return [_spec(lw, SpecKind.ELEMENTWISE, i, op.kind.value, detail)]


def _thread_graph_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    program = render_program(op.attr("program"), len(op.inputs))
    return [_spec(lw, SpecKind.ELEMENTWISE, i, "thread_graph", program)]


def _matmul_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    pairs = matmul_pairs(lw.block, op)
    how = ["tl.dot" if lowers_to_dot(lw.block, a, b) else "broadcast" for a, b in pairs]
    detail = "" if len(pairs) == 1 else "split inner dim: " + " + ".join(
        f"{lw.value(a)} @ {lw.value(b)}" for a, b in pairs)
    if "broadcast" in how:
        detail = "; ".join(filter(None, [detail, "broadcast product summed on CUDA cores"]))
    inputs = tuple(lw.value(r) for pair in pairs for r in pair)
    return [_spec(lw, SpecKind.MATMUL, i, "+".join(how), detail, inputs)]


def _reduction_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    how = "max" if op.kind is OpKind.REDUCTION_MAX else "sum"
    return [_spec(lw, SpecKind.REDUCE, i, how, f"axis {lw.axis(op.attr('dim'))}")]


def _rms_norm_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    eps = op.attr("eps", 0.0)
    tail = f" + {eps!r}" if eps else ""
    return [_spec(lw, SpecKind.REDUCE, i, "rms_norm", f"x / sqrt(mean(x*x, axis -1){tail})")]


def _concat_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    if _concat_of_loads(lw.block, op):
        return _load_spec(lw, i, op)
    detail = f"concat along axis {lw.axis(op.attr('dim'))} through block scratch"
    return [_spec(lw, SpecKind.MOVE, i, detail=detail, route=SCRATCH_ROUTE)]


def _reshape_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    dims = dims_text(lw.tile_dims(TensorRef(i)))
    if lw.reinterprets(i):
        return [_spec(lw, SpecKind.VIEW, i, detail=f"reshape to {dims}")]
    detail = f"reshape to {dims} through block scratch"
    return [_spec(lw, SpecKind.MOVE, i, detail=detail, route=SCRATCH_ROUTE)]


_ACCUMULATED = {
    AccumKind.NONE: "acc + x",
    AccumKind.SUM: "acc + sum(x, axis -1)",
    AccumKind.MEAN: "acc + sum(x, axis -1)",
    AccumKind.RMS: "acc + sum(x*x, axis -1)",
}


def _accumulation(lw: _Lowering, op: Op) -> tuple[str, str, str]:
    """(variant, initial value, update) of an accumulator."""
    if op.kind is OpKind.FORLOOP_ACCUM_MAX:
        return "max", "-inf", "max(acc, x)"
    acc = op.attr("acc", AccumKind.NONE)
    if acc is AccumKind.SUM_TODIMX:
        update = f"acc + sums of {lw.block.reduction_dimx} chunks of axis -1"
    else:
        update = _ACCUMULATED[acc]
    if op.kind is OpKind.FORLOOP_ACCUM_RESCALE:
        return f"rescale {acc.value}", "0", update.replace("acc +", "acc * r +", 1)
    return acc.value, "0", update


def _accumulator_specs(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    """Init before the loop, Accumulate in it and, for mean and rms, a finish after it."""
    variant, initial, update = _accumulation(lw, op)
    specs = [_spec(lw, SpecKind.INIT, i, initial, inputs=(), phase=PRE),
             _spec(lw, SpecKind.ACCUMULATE, i, variant, update, phase=LOOP)]
    acc = op.attr("acc", AccumKind.NONE)
    if op.kind is OpKind.FORLOOP_ACCUM and acc in (AccumKind.MEAN, AccumKind.RMS):
        count = lw.block.tensor_type(op.inputs[0]).dims[-1] * lw.block.forloop_range
        eps = op.attr("eps", 0.0)
        root = f"sqrt(acc / {count}" + (f" + {eps!r})" if eps else ")")
        finish = f"acc / {count}" if acc is AccumKind.MEAN else root
        specs.append(_spec(lw, SpecKind.ELEMENTWISE, i, acc.value, finish,
                           inputs=(lw.value(TensorRef(i)),), phase=POST))
    return specs


SPEC_RULES = {
    OpKind.BLOCK_INPUT: _load_spec,
    **{kind: _elementwise_spec for kind in Group.ELEMENTWISE},
    OpKind.THREAD_GRAPH: _thread_graph_spec,
    OpKind.MATMUL: _matmul_spec,
    OpKind.REDUCTION: _reduction_spec,
    OpKind.REDUCTION_MAX: _reduction_spec,
    OpKind.RMS_NORM: _rms_norm_spec,
    OpKind.CONCAT: _concat_spec,
    OpKind.RESHAPE: _reshape_spec,
    **{kind: _accumulator_specs for kind in Group.ACCUMULATOR},
}


# ---- entry points -------------------------------------------------------------------------------


def lower_block(block: BlockGraph, name: str = "kernel",
                outputs: tuple[TensorType, ...] | None = None, num_warps: int | None = None,
                num_stages: int | None = None) -> LoweredKernel:
    """The lowered IR of the kernel made from ``block``. ``outputs``: the kernel's output
    tensors (their strides; contiguous when None); ``num_warps`` / ``num_stages``: the launch
    (:func:`mugraph.codegen.launch.default_launch` for what is None)."""
    num_warps, num_stages = _launch(block, num_warps, num_stages, name)
    lw = _Lowering(block, name, outputs, num_warps)
    global_tiles = _global_tiles(lw)
    shared, registers = _value_tiles(lw)
    return LoweredKernel(
        name=name, grid=block.grid_dim, forloop_range=block.forloop_range,
        num_warps=num_warps, num_stages=num_stages, lead=lw.lead, unrolled=lw.unrolled,
        threads=thread_layout(num_warps),
        global_tiles=global_tiles, shared=shared, registers=registers, specs=_specs(lw),
        unused=tuple(lw.value(TensorRef(i)) for i, op in enumerate(block.ops)
                     if i not in lw.live and op.kind is not OpKind.BLOCK_OUTPUT),
    )


def thread_layout(num_warps: int) -> Layout:
    """``#threads``: (lane, warp) -> thread id, lanes fastest."""
    return Layout((LANES, num_warps), (1, LANES))


def _launch(block: BlockGraph, num_warps: int | None, num_stages: int | None,
            name: str) -> tuple[int, int]:
    if num_warps is None or num_stages is None:
        launch = default_launch(block)
        num_warps = launch.num_warps if num_warps is None else num_warps
        num_stages = launch.num_stages if num_stages is None else num_stages
    if num_warps < 1 or num_warps & (num_warps - 1):
        raise LoweringError(f"lowering {name}: num_warps={num_warps} is not a power of two")
    if num_stages < 1:
        raise LoweringError(f"lowering {name}: num_stages={num_stages} is below 1")
    return num_warps, num_stages


def lower_graph(graph) -> tuple[LoweredKernel, ...]:
    """The lowered IR of every custom kernel of kernel graph ``graph``, in graph order, each
    named by its position (``%i``) and launched with its default launch."""
    return tuple(
        lower_block(op.attr("graph"), f"%{i}", tuple(op.outputs))
        for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED
    )


__all__ = [
    "GlobalTile",
    "LoweredKernel",
    "LoweredTensor",
    "LoweringError",
    "Memory",
    "RegisterTile",
    "SharedTile",
    "Spec",
    "SpecKind",
    "lower_block",
    "lower_graph",
]
