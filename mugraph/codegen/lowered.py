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
  reinterprets), MatMul (with its products' forms), Elementwise, Reduce, Init, Accumulate
  (with its form) and Transpose, each placed before the for-loop, in it or after it by
  :func:`mugraph.ir.phase.block_phases` (the classification the code generator uses): an
  accumulator is initialised before the loop, accumulated in it and finished after it; an
  output with a ``forloop_dim`` is stored in every iteration;
- **footprints**: shared memory (per pipeline stage: the padded loop loads that only feed
  ``tl.dot``, times ``num_stages``) and the largest register tile per thread.

The code generator (:mod:`mugraph.codegen.triton_gen`) emits its Triton source from this IR:
which values are computed at all (values no output needs are listed as unused), each value's
memory, padded tile and phase, the coordinate steps that place each block's and iteration's
tile (:class:`GlobalTile`), which products are ``tl.dot`` (a matmul of two concatenations split
at the same place is the sum of its parts' products; a product whose B operand comes from
another ``tl.dot`` is computed transposed, with :class:`SpecKind.TRANSPOSE` specs, or from
float32 operands: the Triton 3.6 workaround), which reshapes only reinterpret, which concats
are one load from two address ranges, how each accumulator adds up (:class:`AccumForm`: per
iteration, rescaled by the stable exp, whole tiles reduced after the loop, a GEMV form, a merge
of rescaled partials) and the softmax carry (:class:`SpecFlag`). The decisions themselves are
functions of the block graph in :mod:`mugraph.codegen.decisions`; the lowering applies them
once per kernel, under the code generator's options. The emitter keeps what is Triton text:
names, pointer arithmetic, masks, casts, and the order of statements (it emits on demand,
from the stores backwards).
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from mugraph.codegen.decisions import (
    DEFER_MAX_ELEMENTS,
    REDUCING_ACCUMULATORS,
    CodegenOptions,
    derived_from_dot,
    gemv_accumulators,
    lowers_to_dot,
    reshape_is_reinterpretation,
    reshape_pads_rows,
    squeezed_lead,
    streamed_input,
)
from mugraph.codegen.decisions import unrolled as loop_unrolled
from mugraph.codegen.launch import default_launch
from mugraph.codegen.padding import padded_shapes, split_matmul_parts
from mugraph.codegen.stable_exp import (
    NO_CARRY,
    KernelCarry,
    ScaledInputs,
    StableExp,
    scaled_input_plan,
    softmax_carry_plan,
    stable_exp_plan,
)
from mugraph.dtypes import DType
from mugraph.errors import MapError, UnsupportedError
from mugraph.ir import maps
from mugraph.ir.graph import BlockGraph, Op, accumulates
from mugraph.ir.layout import Layout, LayoutError, logical_divide, make_layout
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.phase import Phase, block_phases
from mugraph.ir.tensor import TensorRef, TensorType, contiguous_strides
from mugraph.ir.thread import render_program
from mugraph.ir.tiling import BlockSteps, TileDivision, block_steps, tile_division

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
    steps: BlockSteps  # the division over coordinates: what addresses multiply by strides
    evict_first: bool = False  # an input read once, loaded with the evict-first L2 policy


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
    phase: Phase = PRE  # where the value is computed (an accumulator's: after the loop)

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
    phase: Phase = LOOP

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
    TRANSPOSE = "Transpose"


class ProductForm(enum.Enum):
    """How one product ``A @ B`` of a matmul is computed; the value is how it prints."""

    DOT = "tl.dot"
    BROADCAST = "broadcast"  # M, K or N is 1: a broadcast product summed on CUDA cores
    # Triton 3.6 computed a tl.dot wrongly on an H100 (4+ warps, in a for-loop) when its B
    # operand came from another tl.dot (benchmarks/RESULTS.md, "A Triton 3.6
    # miscompilation"): B^T A^T with B's transpose as the A operand, else float32 operands
    TRANSPOSED = "tl.dot.T"
    DOT_FLOAT32 = "tl.dot.fp32"


@dataclass(frozen=True)
class Product:
    """One product of a matmul (two when it is split at a concatenation of its inner dim)."""

    a: TensorRef
    b: TensorRef
    form: ProductForm


class TransposeForm(enum.Enum):
    """How the transpose of a 2-D value is made without transposing a tl.dot result."""

    TRANS = "trans"  # tl.trans of a value no tl.dot computed
    PRODUCT = "dot"  # C @ D as tl.dot(D^T, C^T)
    ELEMENTWISE = "elementwise"  # the operator on its operands' transposes


class AccumForm(enum.Enum):
    """How a for-loop accumulator adds up its input; the value is how it prints."""

    PLAIN = ""  # its update every iteration
    RESCALED = "rescaled by the stable exp"  # acc * alpha + x (online softmax)
    DEFERRED = "whole tiles, reduced after the loop"
    MERGED = "log-sum-exp merge of rescaled partials"
    GEMV_DEFER = "unreduced [K, N] products, reduced after the loop"
    GEMV_DOT = "tl.dot of the row padded with zero rows, reduced after the loop"

    @property
    def reduces_after_loop(self) -> bool:
        return self in AFTER_LOOP_REDUCTIONS


AFTER_LOOP_REDUCTIONS = frozenset({AccumForm.DEFERRED, AccumForm.GEMV_DEFER, AccumForm.GEMV_DOT})


class SpecFlag(enum.Enum):
    """What else a spec does (the softmax carry, :mod:`mugraph.codegen.stable_exp`)."""

    STABLE_EXP = "the running row maximum subtracted"  # the exp of a softmax loop
    SCALED_INPUT = "a rescaled partial, with the log-scales of its rows"
    SCALED_RATIO = "corrected by exp(R_a - R_b)"  # a / b of merged partial sums
    CARRIED = "stored rescaled, with its row maxima"  # an output of the carry


@dataclass(frozen=True)
class Spec:
    """``outputs <- Kind<variant>(inputs)``, run by all the block's threads in ``phase``, for
    block operator ``op``. ``variant``: which operator, reduction or accumulation (for a
    Move, its ``route``: the memories it goes through); ``detail``: the rest, in words.
    ``attrs``: the operator's attributes; ``products``: a matmul's products;
    ``accumulation``: how an Accumulate adds up; ``transpose``: how a Transpose is made."""

    kind: SpecKind
    phase: Phase
    op: int
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    variant: str = ""
    route: tuple[Memory, ...] = ()
    detail: str = ""
    attrs: tuple = ()
    products: tuple[Product, ...] = ()
    accumulation: AccumForm | None = None
    transpose: TransposeForm | None = None
    flags: frozenset[SpecFlag] = frozenset()


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
    hoisted: bool = True  # before-loop values computed once (else in every part needing them)
    stable: StableExp | None = None  # the softmax loop's stable exp
    scaled_widths: tuple[tuple[int, int], ...] = ()  # rescaled inputs: (index, producer width)

    @property
    def num_threads(self) -> int:
        return self.threads.size

    # ---- lookups (what the code generator reads) ------------------------------------------

    @functools.cached_property
    def _tiles(self) -> dict[str, RegisterTile | SharedTile]:
        return {t.tensor.name: t for t in (*self.registers, *self.shared)}

    @functools.cached_property
    def _defining(self) -> dict[int, Spec]:
        found: dict[int, Spec] = {}
        for spec in self.specs:
            if spec.kind in DEFINING_KINDS and spec.outputs[0].startswith("%b"):
                found.setdefault(spec.op, spec)
        return found

    @functools.cached_property
    def _transposes(self) -> dict[int, Spec]:
        return {s.op: s for s in self.specs if s.kind is SpecKind.TRANSPOSE}

    def tile(self, ref: TensorRef) -> RegisterTile | SharedTile:
        """The register or shared tile of block value ``ref`` (KeyError: not lowered)."""
        return self._tiles[value_name(ref)]

    def spec_of(self, op: int) -> Spec:
        """The spec that computes block operator ``op``'s value (an accumulator's: its
        Accumulate)."""
        return self._defining[op]

    def transpose_of(self, op: int) -> Spec | None:
        """The Transpose spec of block operator ``op``'s value, if a product needs one."""
        return self._transposes.get(op)

    @property
    def stores(self) -> tuple[Spec, ...]:
        """The Moves into the kernel's outputs, in output order."""
        return tuple(sorted((s for s in self.specs if s.outputs[0].startswith("%out")),
                            key=lambda s: s.op))

    def input_tile(self, index: int) -> GlobalTile:
        return self.global_tiles[index]

    def output_tile(self, j: int) -> GlobalTile:
        return self.global_tiles[len(self.global_tiles) - len(self.stores) + j]

    @property
    def scaled_inputs(self) -> dict[int, int]:
        """Kernel inputs that arrive rescaled: index -> the producer's block width."""
        return dict(self.scaled_widths)

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


DEFINING_KINDS = frozenset({SpecKind.MOVE, SpecKind.VIEW, SpecKind.MATMUL, SpecKind.ELEMENTWISE,
                            SpecKind.REDUCE, SpecKind.ACCUMULATE})


def value_name(ref: TensorRef) -> str:
    """``%b<op>`` (``.<index>`` for a further output): the lowered name of a block value."""
    return f"%b{ref.op}" + (f".{ref.index}" if ref.index else "")


# ---- lowering -----------------------------------------------------------------------------------


class _Lowering:
    """The facts one kernel's lowering consults, computed once (block-graph analyses)."""

    def __init__(self, block: BlockGraph, name: str, outputs: tuple[TensorType, ...] | None,
                 num_warps: int, options: CodegenOptions, carry: KernelCarry) -> None:
        self.block = block
        self.name = name
        self.outputs = outputs
        self.options = options
        self.carry = carry
        self.threads = num_warps * LANES
        self.lead = squeezed_lead(block)
        self.pads = padded_shapes(block, options.dot_min_dim, options.align_reshapes)
        self.phases = block_phases(block)
        self.reads = {i: operands_read(block, op) for i, op in enumerate(block.ops)}
        self.live = needed_ops(block, self.reads)
        self.consumers = _consumers(self.reads, self.live)
        self.unrolled = loop_unrolled(block, options)
        self.products = {i: _products(self, TensorRef(i), op) for i, op in enumerate(block.ops)
                         if op.kind is OpKind.MATMUL and i in self.live}
        self.staged = {i for i in self.live if self._staged(i)}
        self.stable = _stable_plan(block, name, options, carry)
        self.scaled = _scaled_plan(block, name, carry)
        self.gemv = frozenset(gemv_accumulators(block))
        self.transposes: dict[int, TransposeForm] = {}
        for products in self.products.values():
            for p in products:
                if p.form is ProductForm.TRANSPOSED:
                    self.transposes.update(self.transpose_plan(p.b) or {})

    # ---- the softmax carry ----------------------------------------------------------------

    def rescaled(self, index: int) -> bool:
        """An accumulator the stable exp rescales every iteration."""
        return self.stable is not None and index in self.stable.accumulators

    def merged(self, index: int) -> bool:
        """An accumulator merging rescaled partials."""
        return self.scaled is not None and index in self.scaled.accumulators

    def scaled_input(self, index: int) -> bool:
        op = self.block.ops[index]
        return (self.scaled is not None and op.kind is OpKind.BLOCK_INPUT
                and op.attr("index") in self.scaled.inputs)

    def has_scales(self, index: int) -> bool:
        """A value that carries the log-scales of its rows (a rescaled partial, a merge)."""
        return self.scaled_input(index) or self.merged(index)

    # ---- matmuls ----------------------------------------------------------------------------

    def transpose_plan(self, ref: TensorRef) -> dict[int, TransposeForm] | None:
        """How the transpose of 2-D value ``ref`` is made with no tl.dot result transposed:
        the form of every value on the way, or None when impossible (a dot whose operands
        come from dots, an operator of another kind)."""
        block = self.block
        if len(self.tile_pad(ref)) != 2:
            return None
        if not derived_from_dot(block, ref):
            return {ref.op: TransposeForm.TRANS}
        op = block.ops[ref.op]
        if op.kind is OpKind.MATMUL:
            c, d = op.inputs
            if (split_matmul_parts(block, c, d) is not None or derived_from_dot(block, c)
                    or derived_from_dot(block, d)):
                return None
            return {ref.op: TransposeForm.PRODUCT}
        if op.kind not in Group.ELEMENTWISE or any(len(self.tile_pad(r)) != 2
                                                   for r in op.inputs):
            return None
        plan = {ref.op: TransposeForm.ELEMENTWISE}
        for r in op.inputs:
            part = self.transpose_plan(r)
            if part is None:
                return None
            plan.update(part)
        return plan

    # ---- accumulators ------------------------------------------------------------------------

    def accumulation(self, index: int) -> AccumForm:
        """How the accumulator at ``index`` adds up its input."""
        op = self.block.ops[index]
        if op.kind is not OpKind.FORLOOP_ACCUM:
            return AccumForm.PLAIN
        rescaled, merged = self.rescaled(index), self.merged(index)
        if index in self.gemv and not (rescaled or merged):
            form = self._gemv_form(index, op)
            if form is not None:
                return form
        if merged:
            return AccumForm.MERGED
        if self._defers(op) and not rescaled:
            return AccumForm.DEFERRED
        return AccumForm.RESCALED if rescaled else AccumForm.PLAIN

    def _gemv_form(self, index: int, op: Op) -> AccumForm | None:
        """The form ``gemv_form`` gives a matrix-vector product's accumulator, or None where
        it does not fit (a broadcast sum per iteration then)."""
        form = self.options.gemv_form
        if form == "broadcast":
            return None
        ref = TensorRef(index)
        pad = self.tile_pad(ref)
        if form == "dot" and len(pad) == 2 and self.block.tensor_type(ref).dtype is not \
                DType.float32:
            return AccumForm.GEMV_DOT
        a, b = self.block.ops[op.inputs[0].op].inputs
        if math.prod(self.gemv_shape(index, a, b)) > DEFER_MAX_ELEMENTS:
            return None
        return AccumForm.GEMV_DEFER

    def gemv_shape(self, index: int, a: TensorRef, b: TensorRef) -> tuple[int, ...]:
        """The [.., K, N] tile a GEMV accumulator keeps unreduced."""
        return (*self.tile_pad(TensorRef(index))[:-1], self.tile_pad(a)[-1],
                self.tile_pad(b)[-1])

    def _defers(self, op: Op) -> bool:
        """A reducing accumulator small enough to add whole tiles (options permitting)."""
        return (self.options.defer_reductions and op.attr("acc") in REDUCING_ACCUMULATORS
                and self.block.forloop_range > 1
                and math.prod(self.tile_pad(op.inputs[0])) <= DEFER_MAX_ELEMENTS)

    # ---- naming and shapes --------------------------------------------------------------

    def fail(self, index: int, why: str) -> LoweringError:
        op = self.block.ops[index]
        return LoweringError(f"lowering {self.name}: {op.kind.value} b{index}: {why}")

    def value(self, ref: TensorRef) -> str:
        return value_name(ref)

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

    def pads_rows(self, index: int) -> bool:
        """A reshape kept in registers by padding its output's rows there
        (:func:`~mugraph.codegen.decisions.reshape_pads_rows`)."""
        op = self.block.ops[index]
        if op.kind is not OpKind.RESHAPE or self.reinterprets(index):
            return False
        src, out = op.inputs[0], TensorRef(index)
        return reshape_pads_rows(self.tile_dims(src), self.tile_pad(src),
                                 self.tile_dims(out), self.tile_pad(out))

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
        """Loads keep their memory type until computed on (rescaled partials arrive in
        float32); computed values are float32."""
        op = self.block.ops[index]
        if self.is_load(index) and not self.scaled_input(index):
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
        return any(index in (p.a.op, p.b.op) and p.form is not ProductForm.BROADCAST
                   for p in self.products[consumer])


def _stable_plan(block: BlockGraph, name: str, options: CodegenOptions,
                 carry: KernelCarry) -> StableExp | None:
    plan = (stable_exp_plan(block, carry=bool(carry.carried_outputs)) if options.stable_exp
            else None)
    if carry.carried_outputs and (plan is None or plan.carried_outputs != carry.carried_outputs):
        raise LoweringError(f"{name}: the softmax carry plan does not fit this kernel")
    return plan


def _scaled_plan(block: BlockGraph, name: str, carry: KernelCarry) -> ScaledInputs | None:
    if not carry.scaled_inputs:
        return None
    plan = scaled_input_plan(block, carry.input_widths)
    if plan is None:
        raise LoweringError(f"{name}: the softmax carry plan does not fit this kernel")
    return plan


def _products(lw: _Lowering, out: TensorRef, op: Op) -> tuple[Product, ...]:
    return tuple(Product(a, b, _product_form(lw, out, a, b))
                 for a, b in matmul_pairs(lw.block, op))


def _product_form(lw: _Lowering, out: TensorRef, a: TensorRef, b: TensorRef) -> ProductForm:
    block = lw.block
    if not lowers_to_dot(block, a, b):
        return ProductForm.BROADCAST
    if not derived_from_dot(block, b):
        return ProductForm.DOT
    transposable = len(lw.tile_pad(out)) == 2 and not derived_from_dot(block, a)
    if transposable and lw.transpose_plan(b) is not None:
        return ProductForm.TRANSPOSED
    return ProductForm.DOT_FLOAT32


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
                 tile: tuple[int, ...], grid_map, forloop_dim: int,
                 evict_first: bool = False) -> GlobalTile:
    block = lw.block
    layout = _device_layout(device)
    try:
        division = tile_division(layout, tile, block.grid_dim, grid_map, block.forloop_range,
                                 forloop_dim)
    except LayoutError as error:
        raise lw.fail(index, f"{name} {layout} does not divide into tiles of "
                      f"{list(tile)}: {error}") from None
    steps = block_steps(tuple(device.dims), tuple(tile), block.grid_dim, tuple(grid_map),
                        block.forloop_range, forloop_dim)
    return GlobalTile(LoweredTensor(name, tuple(device.dims), device.dtype, Memory.GLOBAL),
                      layout, division, steps, evict_first)


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
    evict_first = lw.options.stream_loads and streamed_input(lw.block, op)
    return _global_tile(lw, index, name, device, tile, imap, fdim, evict_first)


def _output_tile(lw: _Lowering, index: int, op: Op, j: int) -> GlobalTile:
    tile_type = lw.block.tensor_type(op.inputs[0])
    omap, fdim = op.attr("omap"), op.attr("forloop_dim")
    name = f"%out{j}"
    summed = accumulates(op)

    def assembled(*args):
        return maps.output_dims(*args, summed)

    dims = _mapped_dims(lw, index, name, "omap", omap, fdim, tile_type.dims, assembled)
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
        phase = lw.phases[i]
        if memory is Memory.SHARED:
            shared.append(SharedTile(tensor, lw.tile_pad(ref), view_of, phase))
        else:
            registers.append(_register_tile(lw, tensor, lw.tile_pad(ref), view_of, phase))
        if i in lw.transposes:
            registers.append(_transposed_tile(lw, ref, tensor))
        if op.kind is OpKind.MATMUL:
            registers += _product_tiles(lw, i)
        if op.kind is OpKind.FORLOOP_ACCUM:
            registers += _accumulator_tiles(lw, i, op)
    return tuple(shared), tuple(registers)


def _register_tile(lw: _Lowering, tensor: LoweredTensor, padded: tuple[int, ...],
                   view_of: str | None = None, phase: Phase = PRE) -> RegisterTile:
    return RegisterTile(tensor, padded, threads_values(math.prod(padded), lw.threads), view_of,
                        phase)


def _transposed_tile(lw: _Lowering, ref: TensorRef, of: LoweredTensor) -> RegisterTile:
    """``%b<i>.T``: the transpose a Triton 3.6 workaround computes (its dtype: the value's for a
    ``tl.trans``, float32 for a product or an operator)."""
    form = lw.transposes[ref.op]
    dtype = of.dtype if form is TransposeForm.TRANS else DType.float32
    tensor = LoweredTensor(f"{of.name}.T", of.dims[::-1], dtype, Memory.REGISTER)
    return _register_tile(lw, tensor, lw.tile_pad(ref)[::-1], phase=lw.phases[ref.op])


def _product_tiles(lw: _Lowering, index: int) -> list[RegisterTile]:
    """The [.., M, K, N] products of a matmul done as a broadcast multiply and a sum."""
    found = []
    for k, p in enumerate(lw.products[index]):
        if p.form is not ProductForm.BROADCAST:
            continue
        pa, pb = lw.tile_pad(p.a), lw.tile_pad(p.b)
        dims = (*lw.tile_dims(p.a), lw.tile_dims(p.b)[-1])
        suffix = ".product" + (str(k) if k else "")
        tensor = LoweredTensor(f"%b{index}{suffix}", dims, DType.float32, Memory.REGISTER)
        found.append(_register_tile(lw, tensor, (*pa, pb[-1]), phase=lw.phases[index]))
    return found


def _accumulator_tiles(lw: _Lowering, index: int, op: Op) -> list[RegisterTile]:
    """``%b<i>.acc``: the whole tiles an accumulator adds up when it reduces after the loop."""
    form = lw.accumulation(index)
    if not form.reduces_after_loop:
        return []
    x = op.inputs[0]
    if form is AccumForm.DEFERRED:
        dims, padded = lw.tile_dims(x), lw.tile_pad(x)
    else:
        a, b = lw.block.ops[x.op].inputs
        k, n = lw.tile_dims(a)[-1], lw.tile_dims(b)[-1]
        dims = (*lw.tile_dims(TensorRef(index))[:-1], k, n)
        padded = lw.gemv_shape(index, a, b)
        if form is AccumForm.GEMV_DOT:
            m = lw.options.dot_min_dim
            dims, padded = (m, n), (m, padded[-1])
    tensor = LoweredTensor(f"%b{index}.acc", dims, DType.float32, Memory.REGISTER)
    return [_register_tile(lw, tensor, padded, phase=LOOP)]


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
        if i in lw.transposes:
            specs.append(_transpose_spec(lw, i))
    return tuple(sorted(specs, key=lambda s: int(s.phase)))  # sorted() is stable


def _spec(lw: _Lowering, kind: SpecKind, i: int, variant: str = "", detail: str = "",
          inputs: tuple[str, ...] | None = None, phase: Phase | None = None,
          route: tuple[Memory, ...] = (), **more) -> Spec:
    """The spec of block operator ``i`` defining its value (by default: in the operator's
    phase, reading the operator's inputs, with the operator's attributes); ``more``: the
    other fields of :class:`Spec`."""
    op = lw.block.ops[i]
    if inputs is None:
        inputs = tuple(lw.value(r) for r in op.inputs)
    return Spec(kind, lw.phases[i] if phase is None else phase, i, (lw.value(TensorRef(i)),),
                inputs, variant, route, detail, **{"attrs": op.attrs, **more})


SCRATCH_ROUTE = (Memory.REGISTER, Memory.GLOBAL, Memory.REGISTER)  # store, barrier, load
REGISTER_ROUTE = (Memory.REGISTER,)  # computed in registers (a reshape padding its rows)


def _load_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    sources = [lw.block.ops[r.op] for r in op.inputs] if op.kind is OpKind.CONCAT else [op]
    names = tuple(f"%in{s.attr('index')}" for s in sources)
    target = lw.memory(i)
    notes = []
    if op.kind is OpKind.CONCAT:
        notes.append(f"concat along axis {lw.axis(op.attr('dim'))}: two address ranges")
    if target is Memory.SHARED:
        notes.append("staged for tl.dot")
    flags = frozenset({SpecFlag.SCALED_INPUT}) if lw.scaled_input(i) else frozenset()
    return [_spec(lw, SpecKind.MOVE, i, detail="; ".join(notes), inputs=names,
                  route=(Memory.GLOBAL, target), flags=flags)]


def _store_spec(lw: _Lowering, i: int, op: Op, j: int) -> Spec:
    """Output ``j``'s store: in every iteration with a forloop_dim, else where its value is."""
    fdim = op.attr("forloop_dim")
    phase = LOOP if fdim >= 0 else lw.phases[i]
    route = (lw.memory(op.inputs[0].op), Memory.GLOBAL)
    detail = "a tile every iteration" if fdim >= 0 else ""
    flags = frozenset({SpecFlag.CARRIED}) if j in lw.carry.carried_outputs else frozenset()
    return Spec(SpecKind.MOVE, phase, i, (f"%out{j}",), (lw.value(op.inputs[0]),), "", route,
                detail, op.attrs, flags=flags)


def _elementwise_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    detail = ", ".join(f"{k}={v}" for k, v in op.attrs)
    flags = set()
    if lw.stable is not None and i == lw.stable.exp_op:
        flags.add(SpecFlag.STABLE_EXP)
    if op.kind is OpKind.DIV and all(lw.has_scales(r.op) for r in op.inputs):
        flags.add(SpecFlag.SCALED_RATIO)
    return [_spec(lw, SpecKind.ELEMENTWISE, i, op.kind.value, detail, flags=frozenset(flags))]


def _thread_graph_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    program = render_program(op.attr("program"), len(op.inputs))
    return [_spec(lw, SpecKind.ELEMENTWISE, i, "thread_graph", program)]


PRODUCT_NOTES = {
    ProductForm.BROADCAST: "broadcast product summed on CUDA cores",
    ProductForm.TRANSPOSED: "as (B^T A^T)^T: B computed from a tl.dot (Triton 3.6)",
    ProductForm.DOT_FLOAT32: "float32 operands: B computed from a tl.dot (Triton 3.6)",
}


def _matmul_spec(lw: _Lowering, i: int, op: Op) -> list[Spec]:
    products = lw.products[i]
    notes = [] if len(products) == 1 else ["split inner dim: " + " + ".join(
        f"{lw.value(p.a)} @ {lw.value(p.b)}" for p in products)]
    notes += sorted({PRODUCT_NOTES[p.form] for p in products if p.form in PRODUCT_NOTES})
    inputs = tuple(lw.value(r) for p in products for r in (p.a, p.b))
    variant = "+".join(p.form.value for p in products)
    return [_spec(lw, SpecKind.MATMUL, i, variant, "; ".join(notes), inputs,
                  products=products)]


def _transpose_spec(lw: _Lowering, index: int) -> Spec:
    """``%b<i>.T <- Transpose<form>(..)``: the transpose of a value (its operands' for a
    product or an operator), as the Triton 3.6 workaround makes it."""
    form = lw.transposes[index]
    op = lw.block.ops[index]
    ref = TensorRef(index)
    if form is TransposeForm.TRANS:
        inputs = (lw.value(ref),)
    elif form is TransposeForm.PRODUCT:
        inputs = tuple(lw.value(r) for r in reversed(op.inputs[:2]))
    else:
        inputs = tuple(lw.value(r) + ".T" for r in op.inputs)
    return Spec(SpecKind.TRANSPOSE, lw.phases[index], index, (lw.value(ref) + ".T",), inputs,
                form.value, attrs=op.attrs, transpose=form)


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
    if lw.pads_rows(i):
        detail = f"reshape to {dims}, rows zero-padded in registers"
        return [_spec(lw, SpecKind.MOVE, i, detail=detail, route=REGISTER_ROUTE)]
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
    form = lw.accumulation(i)
    detail = "; ".join(filter(None, [update, form.value]))
    specs = [_spec(lw, SpecKind.INIT, i, initial, inputs=(), phase=PRE),
             _spec(lw, SpecKind.ACCUMULATE, i, variant, detail, phase=LOOP, accumulation=form)]
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
                num_stages: int | None = None, options: CodegenOptions | None = None,
                carry: KernelCarry | None = None) -> LoweredKernel:
    """The lowered IR of the kernel made from ``block``. ``outputs``: the kernel's output
    tensors (their strides; contiguous when None); ``num_warps`` / ``num_stages``: the launch
    (:func:`mugraph.codegen.launch.default_launch` for what is None); ``options``: the
    code generator's (default: :class:`CodegenOptions`); ``carry``: the kernel's part in the
    softmax carry (:func:`mugraph.codegen.stable_exp.softmax_carry_plan`; default: none)."""
    options = options or CodegenOptions()
    carry = carry or KernelCarry()
    num_warps, num_stages = _launch(block, num_warps, num_stages, name)
    lw = _Lowering(block, name, outputs, num_warps, options, carry)
    global_tiles = _global_tiles(lw)
    shared, registers = _value_tiles(lw)
    return LoweredKernel(
        name=name, grid=block.grid_dim, forloop_range=block.forloop_range,
        num_warps=num_warps, num_stages=num_stages, lead=lw.lead, unrolled=lw.unrolled,
        threads=thread_layout(num_warps),
        global_tiles=global_tiles, shared=shared, registers=registers, specs=_specs(lw),
        unused=tuple(lw.value(TensorRef(i)) for i, op in enumerate(block.ops)
                     if i not in lw.live and op.kind is not OpKind.BLOCK_OUTPUT),
        hoisted=options.hoist_invariants, stable=lw.stable,
        scaled_widths=tuple(sorted(carry.input_widths.items())),
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


def lower_graph(graph, options: CodegenOptions | None = None) -> tuple[LoweredKernel, ...]:
    """The lowered IR of every custom kernel of kernel graph ``graph``, in graph order, each
    named by its position (``%i``), launched with its default launch and given its part in
    the graph's softmax carry (as the compiled program does, ``options.stable_exp`` on)."""
    options = options or CodegenOptions()
    carry = softmax_carry_plan(graph) if options.stable_exp else NO_CARRY
    return tuple(
        lower_block(op.attr("graph"), f"%{i}", tuple(op.outputs), options=options,
                    carry=carry.of(i))
        for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED
    )


__all__ = [
    "AccumForm",
    "GlobalTile",
    "LoweredKernel",
    "LoweredTensor",
    "LoweringError",
    "Memory",
    "Product",
    "ProductForm",
    "RegisterTile",
    "SharedTile",
    "Spec",
    "SpecFlag",
    "SpecKind",
    "TransposeForm",
    "lower_block",
    "lower_graph",
    "value_name",
]
