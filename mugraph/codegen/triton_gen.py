"""Triton code generation: one ``@triton.jit`` kernel per graph-defined kernel operator.

The kernel's program ids are the block graph's grid (x, y, z); its ``for it in range(F)`` loop
is the for-loop. Every block value is a register tile of a padded power-of-two shape (see
:mod:`mugraph.codegen.padding`); lanes beyond a dim's true size are padding, masked on every
memory access and before every operator that mixes lanes (reductions, matmul inner dims,
accumulators that reduce). Padded lanes may otherwise hold anything; ``Val.zero_pad`` records
when they are known to be zero so the common case needs no extra ``tl.where``.

Schedule (cf. the transpiler notes, seed 004): values that depend only on for-loop-invariant
inputs are emitted before the loop (``hoist_invariants``), values that change per iteration
inside it, accumulators' results after it. Code is emitted on demand, from the outputs
backwards, so values no output needs are never computed.

Data movement: ``reshape`` is a ``tl.reshape`` when the padding allows a pure reinterpretation
(every non-leading dim of each merged or split group exact) and otherwise goes through a
block-private fp32 scratch buffer in global memory (store, barrier, load). ``concat`` of two
input tiles becomes one tile loaded from two masked address ranges (no register shuffles);
any other concat goes through the scratch buffer, unless only a split matmul (below) uses it.

A matmul of two concatenations that split the inner dim at the same place (LoRA's
``(X || XA) @ (W ; B)``) is emitted as the sum of the two parts' products, without the
concatenated tiles. Reshapes that only add or drop size-1 dims tie the padding of the dims
they keep (:mod:`mugraph.codegen.padding`), so they are reinterpretations too.

Tiles: a kernel whose every block tensor has a leading dim of size 1 (an attention head per
block, say) holds its tiles without that dim (:func:`squeezed_lead`): its offsets become scalar
terms of the addresses. On an H100 (Triton 3.6) the same attention kernels ran 1.1-1.3x faster
with 2-D tiles than with [1, M, N] tiles, and 10-50x faster where M was padded (falcon's 71
query heads); ``benchmarks/probe_attention.py``.

Matmul: ``tl.dot`` with float32 accumulation when every one of M, K, N exceeds 1 (their padded
sizes are then at least ``dot_min_dim`` = 16); 3-D tiles use the batched ``tl.dot``; tiles of
rank > 3 fold their batch dims into one. A matmul with M, K or N equal to 1 is a broadcast
multiply and ``tl.sum`` on CUDA cores.

The emission of each block operator is :data:`TRITON_EMITTERS`, a table keyed by OpKind.

Every decision above is read from the kernel's lowered IR (:func:`mugraph.codegen.lowered.
lower_block`, under the same options and softmax carry): each value's padded tile and phase,
the stores and their sections, the steps that place each tile, the evict-first hint, each
product's form, the transposes, each accumulator's form, reshapes that reinterpret, concats
that are loads, and the carry's flags; the functions behind them are in
:mod:`mugraph.codegen.decisions`. What stays here is Triton text: names, addresses, masks,
casts, which padded lanes are known zero, and the statements' order (on demand, from the
stores backwards, so that the source of every known graph is what it was before the lowered
IR existed: tests/test_codegen_lowered.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from mugraph.codegen import tiles
from mugraph.codegen.decisions import (  # noqa: F401 - re-exported for existing importers
    AUTO_UNROLL_MAX,
    CHAINED_DOT_NARROW_K,
    DEFER_MAX_ELEMENTS,
    GEMV_FORMS,
    REDUCING_ACCUMULATORS,
    CodegenOptions,
    auto_unroll,
    derived_from_dot,
    gemv_accumulators,
    lowers_to_dot,
    mixed_dot_loads,
    reshape_groups,
    reshape_is_reinterpretation,
    squeezed_lead,
    streamed_input,
    unrolled,
    wide_chained_dots,
)
from mugraph.codegen.elementwise import formula, zero_preserving
from mugraph.codegen.lowered import (
    REGISTER_ROUTE,
    AccumForm,
    Memory,
    Product,
    ProductForm,
    Spec,
    SpecFlag,
    SpecKind,
    TransposeForm,
    lower_block,
)
from mugraph.codegen.stable_exp import KernelCarry
from mugraph.dtypes import DType
from mugraph.errors import UnsupportedError
from mugraph.ir import tiling
from mugraph.ir.graph import BlockGraph, Op, accumulates
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.phase import Phase
from mugraph.ir.tensor import TensorRef, TensorType

# Raised when the emitted kernels change in speed: a result-cache entry whose GPU ranking
# timed kernels of an older revision is replaced by any new search of its program
# (:meth:`mugraph.cache.ResultCache.put`). 2: tiles without a leading unit dim. 3: the
# evict-first hint on streamed tiles (CodegenOptions.stream_loads).
CODEGEN_REVISION = 3

TRITON_MAX_NUMEL = 1 << 20  # Triton's hard limit on the elements of one tensor
TRITON_MAX_GRID_YZ = 65535
PRE, LOOP, POST = Phase.INVARIANT, Phase.LOOP, Phase.POST

TL_DTYPE = {DType.float16: "tl.float16", DType.bfloat16: "tl.bfloat16", DType.float32: "tl.float32"}
LOG2E = math.log2(math.e)



@dataclass(frozen=True)
class KernelSource:
    """One generated kernel: its source text and what the runtime needs to launch it."""

    name: str
    source: str
    grid: tuple[int, int, int]
    input_ranks: tuple[int, ...]
    output_ranks: tuple[int, ...]
    scratch_per_block: int  # float32 elements of block-private scratch (0: no scratch arg)
    label: str  # how error messages name the kernel
    # the softmax carry (mugraph.codegen.stable_exp): kernel inputs that arrive as rescaled
    # partials, each followed by its scale tensor among the arguments, and block outputs
    # stored rescaled, each with a scale tensor (arguments after the outputs, in this order)
    scaled_inputs: tuple[int, ...] = ()
    carried_outputs: tuple[int, ...] = ()

    @property
    def num_blocks(self) -> int:
        return math.prod(self.grid)


@dataclass(frozen=True)
class Val:
    """A register tile in the generated code.

    ``native`` is the Triton dtype of a tile that still has its memory type (a load), None for
    the float32 tiles every computation produces.
    """

    name: str
    dims: tuple[int, ...]
    pad: tuple[int, ...]
    native: str | None = None
    zero_pad: bool = False
    sec: Phase = PRE  # the section that defines it (derived values go there too)

    @property
    def padded(self) -> bool:
        return self.dims != self.pad


# maximum that propagates NaN, as np.maximum / np.max do (Triton's default drops it)
NAN_MAXIMUM = "propagate_nan=tl.PropagateNan.ALL"
NAN_MAX = "_mg_max_nan"
NAN_MAX_SOURCE = f"""@triton.jit
def {NAN_MAX}(a, b):
    return tl.maximum(a, b, {NAN_MAXIMUM})
"""



class KernelEmitter:
    """Builds the source of one kernel from its lowered IR (:mod:`mugraph.codegen.lowered`),
    from the stores backwards: each value's code is emitted, once per section, when a
    statement first needs it, as the value's spec says.

    ``lead`` leading dims (:func:`squeezed_lead`) are left out of every register tile:
    :meth:`dims` and :meth:`pad` give a tile's shape without them, :meth:`axis` maps an
    operator's dim to the tile's, and addresses take their offsets as scalar terms."""

    def __init__(self, block: BlockGraph, name: str, label: str, options: CodegenOptions,
                 carry: KernelCarry | None = None) -> None:
        carry = carry or KernelCarry()
        self.block = block
        self.name = name
        self.label = label
        self.options = options
        self.kernel = lower_block(block, label, options=options, carry=carry)
        self.lead = self.kernel.lead
        self.lines: dict[Phase, list[str]] = {PRE: [], LOOP: [], POST: []}
        self.memo: dict[tuple[TensorRef, Phase], Val] = {}
        self.derived_memo: dict[str, Val] = {}
        self.mixed_loads = mixed_dot_loads(block)  # inputs feeding a tl.dot and more
        self.second_loads: dict[str, str] = {}  # a mixed load's name -> its second load
        self.transposed: dict[tuple[TensorRef, Phase], Val | None] = {}  # see _transposed
        self.carry = carry
        self.scales: dict[int, Val] = {}  # op position -> the log-scale tile of its value
        self.row_max: tuple[str, str] | None = None  # (running max, this iteration's rescale)
        self.loop_tail: list[str] = []  # the last statements of every iteration
        self.names: set[str] = set()
        self.scratch_used = 0
        self.loop = self.kernel.forloop_range > 1
        self.helpers: dict[str, str] = {}  # @triton.jit helpers the kernel calls, by name

    def nan_max(self) -> str:
        """The name of the combine function of a NaN-propagating max reduction (tl.max skips
        NaN; np.max, the reference semantics, gives NaN)."""
        self.helpers[NAN_MAX] = NAN_MAX_SOURCE
        return NAN_MAX

    # ---- bookkeeping -------------------------------------------------------------------

    def accumulate_text(self, op: Op, ptr: str, value: str, mask: str | None,
                        shape: tuple[int, ...] = ()) -> str:
        """The statement that adds a block's tile into an accumulating output (``value`` is
        float32). A standalone kernel has no zeroed float32 output to add into: the sum over
        blocks is generated only inside the persistent kernel (:mod:`mugraph.persistent`)."""
        raise self.fail(op, op.inputs[0], "an accumulating output (blocks summed into one tile) "
                        "is generated only inside a persistent kernel")

    def fail(self, op: Op, ref: TensorRef | None, why: str) -> UnsupportedError:
        where = f"{op.kind.value}" + (f" b{ref.op}" if ref is not None else "")
        return UnsupportedError(f"{self.label}: {where}: {why}")

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def emit(self, sec: Phase, line: str) -> None:
        self.lines[sec].append(line)

    def assign(self, sec: Phase, base: str, expr: str, dims, pad, **kw) -> Val:
        name = self.fresh(base)
        self.emit(sec, f"{name} = {expr}")
        return Val(name, tuple(dims), tuple(pad), sec=sec, **kw)

    def derived(self, val: Val, tag: str, expr: str, **kw) -> Val:
        """A value computed from ``val`` alone (cast, mask), once, in ``val``'s section."""
        key = f"{val.name}@{tag}"
        if key not in self.derived_memo:
            name = f"{val.name}{tag}"
            self.derived_memo[key] = self.assign(val.sec, name, expr, val.dims, val.pad, **kw)
        return self.derived_memo[key]

    def spec_of(self, ref: TensorRef) -> Spec:
        """The lowered spec computing ``ref``."""
        return self.kernel.spec_of(ref.op)

    def dims(self, ref: TensorRef) -> tuple[int, ...]:
        """The dims of ``ref``'s register tile (the tensor's, less the left-out lead)."""
        return self.kernel.tile(ref).tensor.dims

    def full_dims(self, ref: TensorRef) -> tuple[int, ...]:
        """The dims of the block tensor ``ref`` (what addresses are computed from)."""
        return self.block.tensor_type(ref).dims

    def pad(self, ref: TensorRef) -> tuple[int, ...]:
        """The padded shape of ``ref``'s tile (its lowered tile's)."""
        return self.kernel.tile(ref).padded

    def axis(self, dim: int) -> int:
        """The tile axis of an operator's ``dim`` (negative dims count from the end)."""
        return dim - self.lead if dim >= 0 else dim

    def dtype(self, ref: TensorRef) -> DType:
        return self.block.tensor_type(ref).dtype

    def check_size(self, op: Op, ref: TensorRef | None, shape, what: str = "a register tile"):
        n = math.prod(shape)
        limit = min(self.options.max_tile_elements, TRITON_MAX_NUMEL)
        if n > limit:
            raise self.fail(
                op, ref, f"needs {what} of shape {list(shape)} ({n} elements), over the limit of "
                f"{limit} (max_tile_elements); use a larger grid or forloop_range"
            )

    def reserve_scratch(self, n: int) -> int:
        offset = self.scratch_used
        self.scratch_used += n
        return offset

    # ---- values --------------------------------------------------------------------------

    def section_for(self, ref: TensorRef, wanted: Phase) -> Phase:
        """Where ``ref`` is computed when section ``wanted`` needs it."""
        phase = self.kernel.tile(ref).phase
        if phase is PRE and not self.kernel.hoisted:
            return wanted
        return phase

    def get(self, ref: TensorRef, wanted: Phase) -> Val:
        """The register tile of ``ref``, emitting its code (and its inputs') on first use."""
        sec = self.section_for(ref, wanted)
        key = (ref, sec)
        if key not in self.memo:
            op = self.block.ops[ref.op]
            emitter = TRITON_EMITTERS.get(op.kind)
            if emitter is None:
                raise self.fail(op, ref, "no Triton emission for this operator")
            val = emitter(self, op, ref, sec)
            self.check_size(op, ref, val.pad)
            self.memo[key] = val
        return self.memo[key]

    def f32(self, val: Val, sec: Phase) -> Val:
        """``val`` as a float32 tile (loads keep their memory dtype until computed on); a
        tile that also feeds a ``tl.dot`` is loaded again for it (``split_mixed_loads``)."""
        if val.native is None or val.native == "tl.float32":
            return replace(val, native=None)
        source = self.second_loads.get(val.name, val.name)
        return self.derived(val, "f", f"{source}.to(tl.float32)", zero_pad=val.zero_pad)

    def zero_pads(self, val: Val, sec: Phase) -> Val:
        """``val`` with every padded lane set to zero."""
        if not val.padded or val.zero_pad:
            return val
        mask = tiles.valid_mask(val.dims, val.pad)
        expr = f"tl.where({mask}, {val.name}, tl.zeros_like({val.name}))"
        return self.derived(val, "z", expr, native=val.native, zero_pad=True)

    # ---- addresses -----------------------------------------------------------------------

    def pid(self, axis: int) -> str:
        return f"pid_{tiles.AXES[axis]}"

    def it(self) -> str:
        return "it_" if self.options.index64 else "it"

    def base_terms(self, dims, tile, grid_map, fdim) -> list[list[str]]:
        """Per dim, the scalar offset terms of this block (and iteration) along it, for a
        tensor of ``dims`` no global tile of the kernel describes (scales, prefetches)."""
        block = self.block
        steps = tiling.block_steps(tuple(dims), tuple(tile), block.grid_dim, grid_map,
                                   block.forloop_range, fdim)
        return self.placement(steps, fdim)

    def placement(self, steps: tiling.BlockSteps, fdim: int) -> list[list[str]]:
        """Per dim, the scalar offset terms ``steps`` give this block (and iteration)."""
        terms = [[f"{self.pid(axis)} * {step}" for axis, step in axes] for axes in steps.grid]
        if fdim >= 0 and self.loop:
            terms[fdim].append(f"{self.it()} * {steps.iteration[fdim]}")
        return terms

    def load_input(self, op: Op, pad, shift=None, region=None, second: bool = False) -> str:
        """A ``tl.load`` of input ``op``'s tile into a tile of shape ``pad``.

        Lane ``i`` of dim ``d`` reads element ``i - shift[d]``; only lanes in ``region`` (or,
        by default, the valid lanes of the tile) are read, the rest are zero. ``second``: the
        other operators' load of a tile that also feeds a ``tl.dot`` (``split_mixed_loads``).
        """
        i = op.attr("index")
        tile = op.outputs[0].dims
        source = self.kernel.input_tile(i)
        base = self.placement(source.steps, op.attr("forloop_dim"))
        strides = [f"in{i}_s{d}" for d in range(len(tile))]
        offs = tiles.offsets(pad, strides, base, shift, self.options.index64)
        mask = region if region is not None else tiles.valid_mask(tile[self.lead:], pad)
        args = [f"in{i}_ptr + {offs}"]
        if mask is not None:
            args += [f"mask={mask}", "other=0.0"]
        if second:
            # a different policy than the first load's: the two are not merged into one
            args.append('eviction_policy="evict_last"')
        elif source.evict_first:
            args.append('eviction_policy="evict_first"')
        return f"tl.load({', '.join(args)})"


# ---- emitters: one per operator kind ---------------------------------------------------

Emitter = Callable[[KernelEmitter, Op, TensorRef, Phase], Val]


def _emit_input(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    pad = em.pad(ref)
    expr = em.load_input(op, pad)
    if SpecFlag.SCALED_INPUT in em.spec_of(ref).flags:
        # a rescaled partial (stored in float32) and the log-scales of its rows
        em.scales[ref.op] = _load_scales(em, op, ref, sec)
        return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), pad, native="tl.float32",
                         zero_pad=True)
    native = TL_DTYPE[em.dtype(ref)]
    val = em.assign(sec, f"b{ref.op}", expr, em.dims(ref), pad, native=native, zero_pad=True)
    if em.options.split_mixed_loads and ref.op in em.mixed_loads and sec is LOOP:
        em.second_loads[val.name] = em.load_input(op, pad, second=True)
    return val


def _load_scales(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    """The scales of a rescaled input's tile, one per row: element ``[..., i]`` of the
    partial has scale ``[..., i // w]`` (``w``: the producer's block width), and the tile
    lies within one producer block (its width divides ``w``)."""
    i = op.attr("index")
    width = em.kernel.scaled_inputs[i]
    dtensor: TensorType = op.attr("dtensor")
    dims, pad, full = em.dims(ref), em.pad(ref), em.full_dims(ref)
    imap, fdim = op.attr("imap"), op.attr("forloop_dim")
    rows, row_pad, full_rows = (*dims[:-1], 1), (*pad[:-1], 1), (*full[:-1], 1)
    last = len(full) - 1
    if dims[-1] == width:  # a whole producer block per tile: offsets in units of blocks
        base = em.base_terms((*dtensor.dims[:-1], dtensor.dims[-1] // width), full_rows, imap,
                             fdim)
    else:
        base = em.base_terms(dtensor.dims, full, imap, fdim)
        if base[last]:
            base[last] = [f"({' + '.join(base[last])}) // {width}"]
    strides = [f"sin{i}_s{d}" for d in range(len(full))]
    offs = tiles.offsets(row_pad, strides, base, None, em.options.index64)
    mask = tiles.valid_mask(rows, row_pad)
    expr = f"tl.load(sin{i}_ptr + {offs}" + (f", mask={mask}, other=0.0)" if mask else ")")
    return em.assign(sec, f"s{ref.op}", expr, rows, row_pad, zero_pad=True)


def _emit_elementwise(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    flags = em.spec_of(ref).flags
    if SpecFlag.STABLE_EXP in flags:
        return _emit_stable_exp(em, op, ref, sec)
    args = [em.get(r, sec) for r in op.inputs]
    if SpecFlag.SCALED_RATIO in flags:
        # a / b of merged partial sums: each is its true value times exp(-R), so the ratio
        # is corrected by exp(R_a - R_b) (1 where both carry the same scales)
        (a, b), (ra, rb) = args, (em.scales[r.op] for r in op.inputs)
        expr = f"({a.name} / {b.name}) * tl.exp({ra.name} - {rb.name})"
        return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), em.pad(ref))
    return _elementwise(em, op, sec, f"b{ref.op}", args, em.dims(ref), em.pad(ref))


def _elementwise(em: KernelEmitter, op: Op, sec: Phase, name: str, args, dims, pad) -> Val:
    """One elementwise operator on the register tiles ``args`` (float32 from here on)."""
    args = [em.f32(a, sec) for a in args]
    zp = zero_preserving(op.kind, op.attr_dict) and all(a.zero_pad and a.pad == pad for a in args)
    expr = formula(op.kind, [a.name for a in args], op.attr_dict)
    return em.assign(sec, name, expr, dims, pad, zero_pad=zp)


def _emit_stable_exp(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    """``exp(S - m_new)``, with ``m`` the running maximum of each row of S (padded lanes of the
    last dim excluded) and ``alpha = exp(m_old - m_new)`` for the accumulators' rescale."""
    x = em.f32(em.zero_pads(em.get(op.inputs[0], sec), sec), sec)
    last = len(x.pad) - 1
    m = em.fresh(f"m{ref.op}")
    em.emit(PRE, f"{m} = tl.full({[*x.pad[:-1], 1]}, float('-inf'), tl.float32)")
    mask = tiles.valid_mask(x.dims, x.pad, only=[last])
    src = f"tl.where({mask}, {x.name}, float('-inf'))" if mask else x.name
    new, alpha = em.fresh(f"m{ref.op}n"), em.fresh(f"alpha{ref.op}")
    em.emit(sec, f"{new} = tl.maximum({m}, tl.expand_dims(tl.max({src}, axis={last}), {last}))")
    em.emit(sec, f"{alpha} = tl.exp({m} - {new})")
    em.loop_tail.append(f"{m} = {new}")
    em.row_max = (m, alpha)
    # exp(S - m) as exp2(S * log2(e) - m * log2(e)): one fused multiply-add per element
    # before the exp2 (tl.exp is exp2 of a product, after the subtraction: two operations)
    scaled = em.assign(sec, f"{new}l", f"{new} * {LOG2E!r}", (*x.dims[:-1], 1),
                       (*x.pad[:-1], 1))
    expr = f"tl.exp2({x.name} * {LOG2E!r} - {scaled.name})"
    return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), x.pad)


def _bcast_pad(pads: list[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(max(ps) for ps in zip(*pads, strict=True))


def _emit_thread_graph(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    """A fused elementwise chain: one statement per step, all in registers."""
    vals = [em.f32(em.get(r, sec), sec) for r in op.inputs]
    for step, (kind, operands, attrs) in enumerate(op.attr("program")):
        args = [vals[j] for j in operands]
        attr_map = dict(attrs)
        pad = _bcast_pad([a.pad for a in args])
        dims = tuple(max(ds) for ds in zip(*(a.dims for a in args), strict=True))
        zp = zero_preserving(kind, attr_map) and all(a.zero_pad and a.pad == pad for a in args)
        expr = formula(kind, [a.name for a in args], attr_map)
        vals.append(em.assign(sec, f"b{ref.op}t{step}", expr, dims, pad, zero_pad=zp))
    return vals[-1]


def _dot_operand(em: KernelEmitter, val: Val, graph_dtype: DType, sec: Phase) -> tuple[Val, str]:
    """The operand as ``tl.dot`` takes it, and the dot's input precision."""
    target = TL_DTYPE[graph_dtype]
    if graph_dtype is DType.float32 or (em.options.interpret and graph_dtype is DType.bfloat16):
        target = "tl.float32"  # the interpreter computes bf16 dots wrongly
    precision = "ieee" if target == "tl.float32" else ""
    current = val.native or "tl.float32"
    if current == target:
        return val, precision
    cast = em.derived(val, "d", f"{val.name}.to({target})", native=target, zero_pad=val.zero_pad)
    return cast, precision


def _emit_matmul(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    products = em.spec_of(ref).products
    if len(products) > 1:
        return _matmul_split(em, op, ref, sec, products)
    return _matmul_pair(em, op, ref, sec, products[0])


def _matmul_pair(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase, product: Product) -> Val:
    """One product in the form the lowering chose (:class:`ProductForm`): Triton 3.6
    computed a tl.dot wrongly on an H100 (4+ warps, inside a for-loop) when its B operand
    was computed from another tl.dot's result; with that value as the A operand (the
    flash-attention pattern, ``TRANSPOSED``), or in float32 (``DOT_FLOAT32``), it was right
    (benchmarks/RESULTS.md, "A Triton 3.6 miscompilation")."""
    pad, dims = em.pad(ref), em.dims(ref)
    ra, rb, form = product.a, product.b, product.form
    if form is ProductForm.TRANSPOSED:
        return _matmul_transposed(em, ref, sec, ra, _transposed(em, rb, sec))
    if form is ProductForm.DOT_FLOAT32:
        a = em.f32(em.zero_pads(em.get(ra, sec), sec), sec)
        b = em.zero_pads(em.get(rb, sec), sec)
        return _matmul_dot(em, op, ref, sec, a, b, pad, dims, operand_dtype=DType.float32)
    a = em.zero_pads(em.get(ra, sec), sec)
    b = em.zero_pads(em.get(rb, sec), sec)
    if form is ProductForm.DOT:
        return _matmul_dot(em, op, ref, sec, a, b, pad, dims)
    return _matmul_broadcast(em, op, ref, sec, a, b, pad, dims)



def _matmul_transposed(em: KernelEmitter, ref: TensorRef, sec: Phase, ra, inner: Val) -> Val:
    """``A @ B`` as ``(B^T A^T)^T``, given ``inner`` = B^T: B's value is the A operand."""
    graph_dtype = em.dtype(ref)
    left, precision = _dot_operand(em, inner, graph_dtype, sec)
    a, _ = _dot_operand(em, em.zero_pads(em.get(ra, sec), sec), graph_dtype, sec)
    kw = f", input_precision=\"{precision}\"" if precision else ""
    expr = f"tl.trans(tl.dot({left.name}, tl.trans({a.name}){kw}))"
    return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), em.pad(ref), zero_pad=True)


def _transposed(em: KernelEmitter, ref: TensorRef, sec: Phase) -> Val | None:
    """The transpose of the 2-D tile ``ref``, computed so that no ``tl.dot`` result is ever
    transposed: a product C @ D as ``tl.dot(D^T, C^T)``, elementwise operators on transposed
    operands, any value not computed from a dot as ``tl.trans``. None when that is impossible
    (a dot whose own operands come from dots, or an operator of another kind on the way)."""
    psec = em.section_for(ref, sec)
    key = (ref, psec)
    if key in em.transposed:
        return em.transposed[key]
    op = em.block.ops[ref.op]
    dims, pad = em.dims(ref)[::-1], em.pad(ref)[::-1]
    spec = em.kernel.transpose_of(ref.op)
    form = spec.transpose if spec is not None else None
    if form is TransposeForm.TRANS:
        x = em.get(ref, psec)
        val = em.assign(x.sec, f"{x.name}T", f"tl.trans({x.name})", dims, pad,
                        native=x.native, zero_pad=x.zero_pad)
    elif form is TransposeForm.PRODUCT:
        val = _transposed_product(em, op, ref, psec)
    elif form is TransposeForm.ELEMENTWISE:
        args = [_transposed(em, r, psec) for r in op.inputs]
        val = None if None in args else _elementwise(em, op, psec, f"b{ref.op}T", args, dims, pad)
    else:
        val = None
    em.transposed[key] = val
    return val


def _transposed_product(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    c_ref, d_ref = op.inputs
    graph_dtype = em.dtype(ref)
    c, precision = _dot_operand(em, em.zero_pads(em.get(c_ref, sec), sec), graph_dtype, sec)
    d, _ = _dot_operand(em, em.zero_pads(em.get(d_ref, sec), sec), graph_dtype, sec)
    kw = f", input_precision=\"{precision}\"" if precision else ""
    expr = f"tl.dot(tl.trans({d.name}), tl.trans({c.name}){kw})"
    return em.assign(sec, f"b{ref.op}T", expr, em.dims(ref)[::-1], em.pad(ref)[::-1], zero_pad=True)


def _matmul_split(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase, parts) -> Val:
    """A product over concatenated inner dims as the sum of the parts' products: no
    concatenated tile, no scratch round trip, no padding of the joint inner dim."""
    vals = [_matmul_pair(em, op, ref, sec, product) for product in parts]
    expr = " + ".join(v.name for v in vals)
    return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), em.pad(ref), zero_pad=True)


def _matmul_dot(em, op, ref, sec, a: Val, b: Val, pad, dims, operand_dtype=None) -> Val:
    """``tl.dot`` of operands cast to ``operand_dtype`` (default: the output's dtype); float32
    operands of a float16 / bfloat16 product use Triton's default (tf32) precision."""
    graph_dtype = em.dtype(ref)
    a, precision = _dot_operand(em, a, operand_dtype or graph_dtype, sec)
    b, _ = _dot_operand(em, b, operand_dtype or graph_dtype, sec)
    if operand_dtype is not None and graph_dtype is not DType.float32:
        precision = ""
    kw = f", input_precision=\"{precision}\"" if precision else ""
    rank = len(pad)
    if rank == 2:
        expr = f"tl.dot({a.name}, {b.name}{kw})"
        return em.assign(sec, f"b{ref.op}", expr, dims, pad, zero_pad=True)
    batch = pad[:-2]
    m, k, n = a.pad[-2], a.pad[-1], b.pad[-1]
    nb = math.prod(batch)
    em.check_size(op, ref, (nb, m, k), "a batched operand")
    em.check_size(op, ref, (nb, k, n), "a batched operand")
    a3 = _to_batch(a.name, a.pad, (*batch, m, k), (nb, m, k))
    b3 = _to_batch(b.name, b.pad, (*batch, k, n), (nb, k, n))
    out = f"tl.dot({a3}, {b3}{kw})"
    if rank > 3:
        out = f"tl.reshape({out}, {list(pad)})"
    return em.assign(sec, f"b{ref.op}", out, dims, pad, zero_pad=True)


def _to_batch(name: str, pad, full, flat) -> str:
    expr = name if tuple(pad) == tuple(full) else f"tl.broadcast_to({name}, {list(full)})"
    return expr if tuple(full) == tuple(flat) else f"tl.reshape({expr}, {list(flat)})"


def _matmul_broadcast(em, op, ref, sec, a: Val, b: Val, pad, dims) -> Val:
    """M, K or N is 1: a broadcast product summed over K, in float32 on CUDA cores."""
    a, b = em.f32(a, sec), em.f32(b, sec)
    rank = len(pad)
    k = a.pad[-1]
    em.check_size(op, ref, (*pad[:-1], k, pad[-1]), "a broadcast matmul product")
    left = f"{a.name}[{', '.join([':'] * rank)}, None]"
    right = f"{b.name}[{', '.join([':'] * (rank - 2) + ['None', ':', ':'])}]"
    expr = f"tl.sum({left} * {right}, axis={rank - 1})"
    return em.assign(sec, f"b{ref.op}", expr, dims, pad, zero_pad=True)


def _emit_reduction(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    x = em.f32(em.zero_pads(em.get(op.inputs[0], sec), sec), sec)
    d = em.axis(op.attr("dim"))
    expr = f"tl.expand_dims(tl.sum({x.name}, axis={d}), {d})"
    return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), em.pad(ref), zero_pad=True)


def _emit_reduction_max(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    x = em.f32(em.get(op.inputs[0], sec), sec)
    d = em.axis(op.attr("dim"))
    src = x.name
    mask = tiles.valid_mask(x.dims, x.pad, only=[d])
    if mask:
        src = f"tl.where({mask}, {x.name}, float('-inf'))"
    expr = f"tl.expand_dims(tl.reduce({src}, {d}, {em.nan_max()}), {d})"
    return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), em.pad(ref), zero_pad=x.zero_pad)


def _eps_term(op: Op) -> str:
    """`` + eps`` under the root of an rms (nothing when the operator has no epsilon)."""
    eps = op.attr("eps", 0.0)
    return f" + {float(eps)!r}" if eps else ""


def _emit_rms_norm(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    x = em.f32(em.zero_pads(em.get(op.inputs[0], sec), sec), sec)
    last = len(x.dims) - 1
    ms = f"tl.expand_dims(tl.sum({x.name} * {x.name}, axis={last}), {last}) / {float(x.dims[-1])}"
    expr = f"{x.name} / tl.sqrt({ms}{_eps_term(op)})"
    return em.assign(sec, f"b{ref.op}", expr, em.dims(ref), em.pad(ref))


def _emit_concat(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    if em.spec_of(ref).route[0] is Memory.GLOBAL:  # one tile from two address ranges
        return _concat_loads(em, op, ref, sec, [em.block.ops[r.op] for r in op.inputs])
    return _concat_scratch(em, op, ref, sec)


def _concat_loads(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase, ops: list[Op]) -> Val:
    """Concat of two input tiles: one tile read from two address ranges."""
    dims, pad = em.dims(ref), em.pad(ref)
    split = ops[0].outputs[0].dims[op.attr("dim")]
    d = em.axis(op.attr("dim"))
    idx = tiles.lane(d, pad)
    rest = tiles.valid_mask(dims, pad, only=[i for i in range(len(dims)) if i != d])
    first = tiles.and_masks(rest, f"({idx} < {split})")
    second = tiles.and_masks(rest, f"({idx} >= {split})", tiles.valid_mask(dims, pad, only=[d]))
    part_a = em.load_input(ops[0], pad, region=first)
    part_b = em.load_input(ops[1], pad, shift={d: split}, region=second)
    native = TL_DTYPE[em.dtype(ref)]
    expr = f"{part_a} + {part_b}"
    return em.assign(sec, f"b{ref.op}", expr, dims, pad, native=native, zero_pad=True)


def _scratch_base(em: KernelEmitter, n: int) -> str:
    return f"scratch_blk + {em.reserve_scratch(n)}"


def _concat_scratch(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    """Concat through block-private scratch: store both parts, barrier, load the whole."""
    a = em.f32(em.get(op.inputs[0], sec), sec)
    b = em.f32(em.get(op.inputs[1], sec), sec)
    d = em.axis(op.attr("dim"))
    dims, pad = em.dims(ref), em.pad(ref)
    base = _scratch_base(em, math.prod(dims))
    em.emit(sec, "tl.debug_barrier()")
    for part, shift in ((a, {}), (b, {d: a.dims[d]})):
        offs = tiles.contiguous_offsets(part.dims, part.pad, shift, into=dims)
        mask = tiles.valid_mask(part.dims, part.pad)
        em.emit(sec, _store_text(f"{base} + {offs}", part.name, mask))
    em.emit(sec, "tl.debug_barrier()")
    return _scratch_load(em, ref, sec, base, dims, pad)


def _store_text(ptr: str, value: str, mask: str | None) -> str:
    return f"tl.store({ptr}, {value}" + (f", mask={mask})" if mask else ")")


def _scratch_load(em: KernelEmitter, ref: TensorRef, sec: Phase, base: str, dims, pad) -> Val:
    offs = tiles.contiguous_offsets(dims, pad)
    mask = tiles.valid_mask(dims, pad)
    expr = f"tl.load({base} + {offs}" + (f", mask={mask}, other=0.0)" if mask else ")")
    return em.assign(sec, f"b{ref.op}", expr, dims, pad, zero_pad=True)


def _emit_reshape(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    x = em.get(op.inputs[0], sec)
    dims, pad = em.dims(ref), em.pad(ref)
    if em.spec_of(ref).kind is SpecKind.VIEW:
        expr = f"tl.reshape({x.name}, {list(pad)})"
        return em.assign(sec, f"b{ref.op}", expr, dims, pad, native=x.native, zero_pad=x.zero_pad)
    x = em.f32(x, sec)
    if em.spec_of(ref).route == REGISTER_ROUTE:
        return _reshape_padding_rows(em, ref, sec, x, dims, pad)
    base = _scratch_base(em, math.prod(dims))
    em.emit(sec, "tl.debug_barrier()")
    em.emit(sec, _store_text(f"{base} + {tiles.contiguous_offsets(x.dims, x.pad)}", x.name,
                             tiles.valid_mask(x.dims, x.pad)))
    em.emit(sec, "tl.debug_barrier()")
    return _scratch_load(em, ref, sec, base, dims, pad)


def _reshape_padding_rows(em: KernelEmitter, ref: TensorRef, sec: Phase, x: Val, dims, pad) -> Val:
    """An unpadded ``x`` reshaped to ``dims``, then zero rows added up to ``pad[0]``: copies
    of the tile along a new leading axis, all but the first zeroed, merged into the rows
    (:func:`~mugraph.codegen.decisions.reshape_pads_rows`)."""
    exact = em.assign(sec, f"b{ref.op}x", f"tl.reshape({x.name}, {list(dims)})", dims, dims)
    copies = pad[0] // dims[0]
    rest = ", None" * len(dims)
    where = (f"tl.where(tl.arange(0, {copies})[:{rest}] == 0, "
             f"{exact.name}[None{', :' * len(dims)}], 0.0)")
    return em.assign(sec, f"b{ref.op}", f"tl.reshape({where}, {list(pad)})", dims, pad,
                     zero_pad=True)


# ---- accumulators --------------------------------------------------------------------


def _reduce_last(em: KernelEmitter, op: Op, ref: TensorRef, x: Val, acc: AccumKind, sec: Phase):
    """The per-iteration contribution of an accumulator (as in reference._reduce_last)."""
    if acc is AccumKind.NONE:
        return x.name
    last = len(x.dims) - 1
    x = em.f32(em.zero_pads(x, sec), sec)
    if acc is AccumKind.SUM_TODIMX:
        return _sum_todimx(em, op, ref, x)
    src = f"{x.name} * {x.name}" if acc is AccumKind.RMS else x.name
    return f"tl.expand_dims(tl.sum({src}, axis={last}), {last})"


def _sum_todimx(em: KernelEmitter, op: Op, ref: TensorRef, x: Val) -> str:
    """Partial sums of ``reduction_dimx`` contiguous chunks of the last dim."""
    dimx = em.block.reduction_dimx
    out_pad = em.pad(ref)
    length = x.dims[-1]
    chunk = length // dimx
    rank = len(x.dims)
    if x.pad[-1] == length and out_pad[-1] == dimx:
        shape = [*x.pad[:-1], dimx, chunk]
        return f"tl.sum(tl.reshape({x.name}, {shape}), axis={rank})"
    em.check_size(op, ref, (*x.pad, out_pad[-1]), "a sum_todimx selection tile")
    k = tiles.lane(rank - 1, (*x.pad, out_pad[-1]))
    j = tiles.lane(rank, (*x.pad, out_pad[-1]))
    select = f"((({k}) // {chunk}) == ({j}))"
    lead = ", ".join([":"] * rank)
    return f"tl.sum(tl.where({select}, {x.name}[{lead}, None], 0.0), axis={rank - 1})"


def _acc_init(em: KernelEmitter, ref: TensorRef, fill: str) -> str:
    name = em.fresh(f"acc{ref.op}")
    em.emit(PRE, f"{name} = tl.full({list(em.pad(ref))}, {fill}, tl.float32)")
    return name


def _emit_forloop_accum(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    acc = op.attr("acc")
    form = em.spec_of(ref).accumulation
    if form in GEMV_ACCUMULATIONS:
        total = _gemv_accum(em, em.block.ops[op.inputs[0].op], ref, form)
        return Val(total, em.dims(ref), em.pad(ref), zero_pad=True, sec=POST)
    x = em.get(op.inputs[0], LOOP)
    if form is AccumForm.MERGED:
        return _merged_accum(em, op, ref, acc, x)
    if form is AccumForm.DEFERRED:
        name, total = _deferred_accum(em, op, ref, acc, x)
    else:
        name = total = _acc_init(em, ref, "0.0")
        term = _reduce_last(em, op, ref, em.f32(x, LOOP), acc, LOOP)
        _accumulate(em, ref, name, term)
    dims, pad = em.dims(ref), em.pad(ref)
    zp = x.zero_pad or acc is not AccumKind.NONE
    count = float(x.dims[-1] * em.block.forloop_range)
    if acc is AccumKind.MEAN:
        return em.assign(POST, f"b{ref.op}", f"{total} / {count}", dims, pad, zero_pad=zp)
    if acc is AccumKind.RMS:
        expr = f"tl.sqrt({total} / {count}{_eps_term(op)})"
        return em.assign(POST, f"b{ref.op}", expr, dims, pad, zero_pad=zp)
    return Val(total, dims, pad, zero_pad=zp, sec=POST)



GEMV_ACCUMULATIONS = frozenset({AccumForm.GEMV_DEFER, AccumForm.GEMV_DOT})


def _gemv_accum(em: KernelEmitter, product: Op, ref: TensorRef, form: AccumForm) -> str:
    """A matrix-vector product accumulated over the loop in ``form`` (the lowering's reading
    of ``gemv_form``), reduced after it: the name of the reduced [.., 1, N] total."""
    a = em.zero_pads(em.get(product.inputs[0], LOOP), LOOP)
    b = em.zero_pads(em.get(product.inputs[1], LOOP), LOOP)
    rank = len(em.pad(ref))
    if form is AccumForm.GEMV_DOT:
        return _gemv_dot(em, ref, a, b)
    k, n = a.pad[-1], b.pad[-1]
    shape = [*em.pad(ref)[:-1], k, n]
    a, b = em.f32(a, LOOP), em.f32(b, LOOP)
    left = f"{a.name}[{', '.join([':'] * rank)}, None]"
    right = f"{b.name}[{', '.join([':'] * (rank - 2) + ['None', ':', ':'])}]"
    return _summed_after_loop(em, ref, shape, f"{left} * {right}",
                              lambda acc: f"tl.sum({acc}, axis={rank - 1})")


def _gemv_dot(em: KernelEmitter, ref: TensorRef, a: Val, b: Val) -> str:
    """``[1, K] @ [K, N]`` as ``tl.dot`` of the row padded with zero rows to ``dot_min_dim``:
    the [M, N] accumulator's rows beyond the first stay zero, so their sum after the loop is
    the first row exactly."""
    m = em.options.dot_min_dim
    dtype = em.dtype(ref)
    a, _ = _dot_operand(em, a, dtype, a.sec)
    b, precision = _dot_operand(em, b, dtype, b.sec)
    kw = f", input_precision=\"{precision}\"" if precision else ""
    padded = _zero_rows_below(em, a, m)
    return _summed_after_loop(em, ref, [m, b.pad[-1]], f"tl.dot({padded.name}, {b.name}{kw})",
                              lambda acc: f"tl.expand_dims(tl.sum({acc}, axis=0), 0)")


def _summed_after_loop(em: KernelEmitter, ref: TensorRef, shape, term: str,
                       reduce: Callable[[str], str]) -> str:
    """A float32 accumulator of ``shape`` adding ``term`` every iteration, and after the loop
    ``reduce(accumulator)``: the name of that reduced value."""
    name = em.fresh(f"acc{ref.op}")
    em.emit(PRE, f"{name} = tl.zeros({list(shape)}, tl.float32)")
    em.emit(LOOP, f"{name} += {term}")
    total = em.fresh(f"acc{ref.op}r")
    em.emit(POST, f"{total} = {reduce(name)}")
    return total


def _zero_rows_below(em: KernelEmitter, row: Val, m: int) -> Val:
    """The [1, K] tile ``row`` as an [m, K] tile whose other rows are zero (once per tile)."""
    key = f"{row.name}@rows{m}"
    if key not in em.derived_memo:
        first = em.derived_memo.get(f"@first_row{m}")
        if first is None:
            first = em.assign(PRE, "first_row", f"tl.arange(0, {m})[:, None] == 0", (m, 1), (m, 1))
            em.derived_memo[f"@first_row{m}"] = first
        em.derived_memo[key] = em.assign(
            row.sec, f"{row.name}m", f"tl.where({first.name}, {row.name}, 0.0)",
            (m, row.dims[-1]), (m, row.pad[-1]), native=row.native)
    return em.derived_memo[key]


def _rescaled(em: KernelEmitter, ref: TensorRef) -> bool:
    """Whether an accumulator is rescaled by the stable exp every iteration (its reduction
    then stays in the loop: on an H100 a whole-tile accumulator made attention slower)."""
    return em.spec_of(ref).accumulation is AccumForm.RESCALED


def _accumulate(em: KernelEmitter, ref: TensorRef, name: str, term: str) -> None:
    """``name += term`` in the loop, or, for an accumulator of the stable exp's rows, the
    online-softmax update ``name = name * alpha + term``."""
    if _rescaled(em, ref):
        em.emit(LOOP, f"{name} = {name} * {em.row_max[1]} + {term}")
    else:
        em.emit(LOOP, f"{name} += {term}")


def _deferred_accum(em: KernelEmitter, op: Op, ref: TensorRef, acc: AccumKind, x: Val):
    """Whole tiles added in the loop (squares for rms), the last dim reduced once after it:
    (the accumulator's name, the name of its reduced value)."""
    x = em.f32(em.zero_pads(x, LOOP), LOOP)
    name = em.fresh(f"acc{ref.op}")
    em.emit(PRE, f"{name} = tl.zeros({list(x.pad)}, tl.float32)")
    _accumulate(em, ref, name, f"{x.name} * {x.name}" if acc is AccumKind.RMS else x.name)
    last = len(x.pad) - 1
    total = em.fresh(f"acc{ref.op}r")
    em.emit(POST, f"{total} = tl.expand_dims(tl.sum({name}, axis={last}), {last})")
    return name, total


def _merged_accum(em: KernelEmitter, op: Op, ref: TensorRef, acc: AccumKind, x: Val) -> Val:
    """A sum of rescaled partials with the log-sum-exp merge: ``R`` is the running maximum
    of the row scales seen, the accumulator holds its true value times exp(-R)."""
    x = em.f32(em.zero_pads(x, LOOP), LOOP)
    s = em.scales[op.inputs[0].op]
    dims, pad = em.dims(ref), em.pad(ref)
    name = _acc_init(em, ref, "0.0")
    row_pad = (*pad[:-1], 1)
    r = em.fresh(f"r{ref.op}")
    em.emit(PRE, f"{r} = tl.full({list(row_pad)}, float('-inf'), tl.float32)")
    term = _reduce_last(em, op, ref, x, acc, LOOP)  # the row scale is constant along it
    new = em.fresh(f"r{ref.op}n")
    em.emit(LOOP, f"{new} = tl.maximum({r}, {s.name})")
    em.emit(LOOP, f"{name} = {name} * tl.exp({r} - {new}) + ({term}) * tl.exp({s.name} - {new})")
    em.loop_tail.append(f"{r} = {new}")
    em.scales[ref.op] = Val(r, (*dims[:-1], 1), row_pad, sec=POST)
    return Val(name, dims, pad, zero_pad=True, sec=POST)


def _emit_forloop_accum_max(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    x = em.f32(em.get(op.inputs[0], LOOP), LOOP)
    name = _acc_init(em, ref, "float('-inf')")
    em.emit(LOOP, f"{name} = tl.maximum({name}, {x.name}, {NAN_MAXIMUM})")
    return Val(name, em.dims(ref), em.pad(ref), zero_pad=x.zero_pad, sec=POST)


def _emit_forloop_accum_rescale(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    acc = op.attr("acc")
    x = em.f32(em.get(op.inputs[0], LOOP), LOOP)
    r = em.f32(em.get(op.inputs[1], LOOP), LOOP)
    name = _acc_init(em, ref, "0.0")
    term = _reduce_last(em, op, ref, x, acc, LOOP)
    em.emit(LOOP, f"{name} = {name} * {r.name} + {term}")
    zp = (x.zero_pad or acc is not AccumKind.NONE) and r.zero_pad
    return Val(name, em.dims(ref), em.pad(ref), zero_pad=zp, sec=POST)


def _emit_output_operand(em: KernelEmitter, op: Op, ref: TensorRef, sec: Phase) -> Val:
    raise em.fail(op, ref, "block outputs are stored by the kernel driver, not evaluated")


TRITON_EMITTERS: dict[OpKind, Emitter] = {
    OpKind.BLOCK_INPUT: _emit_input,
    OpKind.BLOCK_OUTPUT: _emit_output_operand,
    **{kind: _emit_elementwise for kind in Group.ELEMENTWISE},
    OpKind.THREAD_GRAPH: _emit_thread_graph,
    OpKind.MATMUL: _emit_matmul,
    OpKind.REDUCTION: _emit_reduction,
    OpKind.REDUCTION_MAX: _emit_reduction_max,
    OpKind.RMS_NORM: _emit_rms_norm,
    OpKind.CONCAT: _emit_concat,
    OpKind.RESHAPE: _emit_reshape,
    OpKind.FORLOOP_ACCUM: _emit_forloop_accum,
    OpKind.FORLOOP_ACCUM_MAX: _emit_forloop_accum_max,
    OpKind.FORLOOP_ACCUM_RESCALE: _emit_forloop_accum_rescale,
}

assert set(TRITON_EMITTERS) == Group.BLOCK | Group.BOUNDARY - {OpKind.INPUT}


# ---- the kernel ------------------------------------------------------------------------


def _emit_store(em: KernelEmitter, spec: Spec, j: int) -> None:
    """Output ``j``'s store (``spec``), in its spec's section, where its global tile's
    steps place the block's (and iteration's) tile."""
    op = em.block.ops[spec.op]
    ref = op.inputs[0]
    fdim = op.attr("forloop_dim")
    sec = spec.phase
    val = em.get(ref, sec)
    full = em.full_dims(ref)
    target = em.kernel.output_tile(j)
    out_dims = target.tensor.dims
    base = em.placement(target.steps, fdim)
    strides = [f"out{j}_s{d}" for d in range(len(full))]
    offs = tiles.offsets(val.pad, strides, base, None, em.options.index64)
    mask = tiles.valid_mask(val.dims, val.pad)
    if accumulates(op):
        em.emit(sec, em.accumulate_text(op, f"out{j}_ptr + {offs}", f"{val.name}.to(tl.float32)",
                                        mask, val.pad))
        return
    value = f"{val.name}.to(out{j}_ptr.dtype.element_ty)"
    em.emit(sec, _store_text(f"out{j}_ptr + {offs}", value, mask))
    if SpecFlag.CARRIED in spec.flags:
        _store_scales(em, op, j, ref, sec, out_dims, val)


def _store_scales(em: KernelEmitter, op: Op, j: int, ref: TensorRef, sec: Phase, out_dims,
                  val: Val) -> None:
    """Store the row maxima of a rescaled accumulator (reached from ``ref`` back through
    reshapes that keep the last dim) into the scale tensor of output ``j``: one value per row
    of this block, at index ``[..., block's offset // width]``."""
    chain = []
    while em.block.ops[ref.op].kind is OpKind.RESHAPE:
        chain.append(ref)
        ref = em.block.ops[ref.op].inputs[0]
    expr = em.row_max[0]  # the final running row maximum: the accumulator's rows, then 1
    for step in reversed(chain):
        expr = f"tl.reshape({expr}, {[*em.pad(step)[:-1], 1]})"
    width = val.dims[-1]
    rows, row_pad = (*val.dims[:-1], 1), (*val.pad[:-1], 1)
    full_rows = (*em.full_dims(op.inputs[0])[:-1], 1)
    scale_dims = (*out_dims[:-1], out_dims[-1] // width)
    base = em.base_terms(scale_dims, full_rows, op.attr("omap"), op.attr("forloop_dim"))
    strides = [f"sout{j}_s{d}" for d in range(len(full_rows))]
    offs = tiles.offsets(row_pad, strides, base, None, em.options.index64)
    em.emit(sec, _store_text(f"sout{j}_ptr + {offs}", expr, tiles.valid_mask(rows, row_pad)))


def emit_outputs(em: KernelEmitter) -> None:
    """Emit the stores of every output (and, on demand, everything they need)."""
    for j, spec in enumerate(em.kernel.stores):
        _emit_store(em, spec, j)


def loop_header(em: KernelEmitter) -> list[str]:
    """The for-loop statement(s) of a kernel with a for-loop, before its indented body."""
    loop = "tl.static_range" if em.kernel.unrolled else "range"
    lines = [f"for it in {loop}(0, {em.block.forloop_range}):"]
    if em.options.index64:
        lines.append("    it_ = tl.full([], 0, tl.int64) + it")
    return lines


def _signature(block: BlockGraph, scratch: bool, carry: KernelCarry) -> list[str]:
    args = []
    for op in block.input_ops:
        i = op.attr("index")
        args.append(f"in{i}_ptr")
        args += [f"in{i}_s{d}" for d in range(len(op.outputs[0].dims))]
    for j, op in enumerate(block.output_ops):
        args.append(f"out{j}_ptr")
        args += [f"out{j}_s{d}" for d in range(len(block.tensor_type(op.inputs[0]).dims))]
    ranks = {op.attr("index"): len(op.outputs[0].dims) for op in block.input_ops}
    for i in sorted(carry.input_widths):
        args += [f"sin{i}_ptr"] + [f"sin{i}_s{d}" for d in range(ranks[i])]
    outs = block.output_ops
    for j in sorted(carry.carried_outputs):
        rank = len(block.tensor_type(outs[j].inputs[0]).dims)
        args += [f"sout{j}_ptr"] + [f"sout{j}_s{d}" for d in range(rank)]
    if scratch:
        args.append("scratch_ptr")
    return args


def block_coordinate(grid: tuple[int, int, int], axis: int, blk: str | None) -> str:
    """The block's coordinate on ``axis``: ``tl.program_id``, or from the linear block number
    ``blk`` (x fastest) when the kernel runs inside another launch."""
    if blk is None:
        return f"tl.program_id({axis})"
    gx, gy, _ = grid
    return (f"({blk} % {gx})", f"(({blk} // {gx}) % {gy})", f"({blk} // {gx * gy})")[axis]


def _prologue(em: KernelEmitter, blk: str | None = None) -> list[str]:
    lines = []
    grid = em.block.grid_dim
    for axis in range(3):
        if grid[axis] > 1:
            cast = ".to(tl.int64)" if em.options.index64 else ""
            lines.append(f"{em.pid(axis)} = {block_coordinate(grid, axis, blk)}{cast}")
    if em.scratch_used:
        gx, gy, _ = grid
        terms = []
        for axis, mult in ((0, 1), (1, gx), (2, gx * gy)):
            if grid[axis] > 1:
                terms.append(em.pid(axis) + (f" * {mult}" if mult != 1 else ""))
        block_id = " + ".join(terms) if terms else "0"
        lines.append(f"scratch_blk = scratch_ptr + ({block_id}) * {em.scratch_used}")
    return lines


def _body(em: KernelEmitter, blk: str | None = None) -> list[str]:
    pad = "    "
    lines = [pad + line for line in _prologue(em, blk) + em.lines[PRE]]
    if em.loop and em.lines[LOOP]:
        lines += [pad + line for line in loop_header(em)]
        lines += [pad * 2 + line for line in em.lines[LOOP] + em.loop_tail]
    else:
        lines += [pad + line for line in em.lines[LOOP] + em.loop_tail]
    lines += [pad + line for line in em.lines[POST]]
    return lines


def _check_grid(block: BlockGraph, label: str) -> None:
    if max(block.grid_dim[1:]) > TRITON_MAX_GRID_YZ:
        raise UnsupportedError(
            f"{label}: grid {block.grid_dim} exceeds the CUDA limit of {TRITON_MAX_GRID_YZ} "
            "blocks on the y and z axes"
        )


SOURCE_IMPORTS = ("import triton", "import triton.language as tl", "", "")


def emit_kernel(block: BlockGraph, name: str, label: str, options: CodegenOptions,
                carry: KernelCarry) -> KernelEmitter:
    """The emitter of one kernel with every output's code emitted (its lines, helpers and
    scratch use are then known)."""
    _check_grid(block, label)
    em = KernelEmitter(block, name, label, options, carry)
    emit_outputs(em)
    return em


def kernel_parameters(em: KernelEmitter) -> list[str]:
    """The parameter names of an emitted kernel (pointers and strides, in launch order)."""
    return _signature(em.block, em.scratch_used > 0, em.carry)


def kernel_function(em: KernelEmitter, name: str, blk: str | None = None) -> list[str]:
    """The ``@triton.jit`` function of an emitted kernel: a kernel of its own, or (``blk``
    given) a function taking the linear block number first, called inside another launch."""
    args = kernel_parameters(em)
    if blk is not None:
        args = [blk, *args]
    block = em.block
    return [
        "@triton.jit",
        f"def {name}({', '.join(args)}):",
        f"    # {em.label}: grid={block.grid_dim} forloop_range={block.forloop_range}",
        *_body(em, blk),
    ]


def generate_kernel(
    block: BlockGraph,
    name: str,
    label: str | None = None,
    options: CodegenOptions | None = None,
    carry: KernelCarry | None = None,
) -> KernelSource:
    """The Triton source of one graph-defined kernel operator (``carry``: its part in the
    kernel graph's softmax carry, :func:`mugraph.codegen.stable_exp.softmax_carry_plan`)."""
    options = options or CodegenOptions()
    carry = carry or KernelCarry()
    label = label or f"kernel {name}"
    em = emit_kernel(block, name, label, options, carry)
    header = [
        *SOURCE_IMPORTS,
        *[line for helper in em.helpers.values() for line in (*helper.splitlines(), "", "")],
        *kernel_function(em, name),
    ]
    source = "\n".join(header) + "\n"
    return KernelSource(
        name=name,
        source=source,
        grid=block.grid_dim,
        input_ranks=tuple(len(op.outputs[0].dims) for op in block.input_ops),
        output_ranks=tuple(len(block.tensor_type(op.inputs[0]).dims) for op in block.output_ops),
        scratch_per_block=em.scratch_used,
        label=label,
        scaled_inputs=tuple(sorted(carry.input_widths)),
        carried_outputs=tuple(sorted(carry.carried_outputs)),
    )
