"""Shape classes: search a small representative of a program, then tile the answer for the
program's real sizes.

The search's cost grows with the number of block operators, not with tensor sizes, but
verifying candidates does grow with sizes, and so does the number of grid and for-loop
choices. A model's partitions come in a few *shape classes* (RMSNorm + projection, the gated
MLP, attention, LoRA, a projection with an epsilon-free epilogue), each with a preset
(:data:`mugraph.search.space.PRESETS`) that limits the search to one custom kernel on one
block, looping over the reduced index. So a program is optimized in three steps:

1. :func:`representative` rebuilds the program with every large dim made 64 and every small
   one 2 (1 stays 1; the batch dims in front of a matmul's last two are small whatever their
   size): the same operators and layouts, sizes where the search completes in
   seconds. Its structural hash is the class's cache key, so a new sequence length or batch
   of the same class reuses the search.
2. The representative is searched under its class preset (one block: ``grid (1, 1, 1)``).
3. :func:`instantiate` rebuilds the μGraph found for the program's sizes: the same block
   operators, the for-loop over the same index (atoms of :mod:`mugraph.semantics.labels` name
   indices by position, so they match between the two programs) with tiles of 16-1024, and a
   grid over the *output* indices with tiles of 8-128 (each block computes its own rows /
   columns / heads, which needs no communication). Candidates are ranked by the cost model;
   the caller verifies the one it uses against the real program, so a tiling never goes
   unverified.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from mugraph.errors import MugraphError
from mugraph.ir.builder import KernelGraph, ThreadBlockGraph, new_kernel_graph
from mugraph.ir.graph import BlockGraph
from mugraph.ir.ops import Group, OpKind
from mugraph.semantics import labels as lab

LARGE = 64  # a large dim in the representative (the for-loop of 4 leaves tiles of 16)
SMALL = 2  # a small dim (heads, groups, short sequences) in the representative
SMALL_LIMIT = 16  # dims up to this size are "small"
# tile sizes of the real kernel, best first: of an output index split over the grid, and of
# the reduced index the for-loop walks. Small grid tiles and long loop tiles are for
# matrix-vector products: at one token, Llama-3.2-1B's down projection (K 8192) ran in 20 us
# with 256 blocks of 8 columns and 1024-long loop tiles, against 51 us for the tiling chosen
# among tiles of 16-128 (H100, `benchmarks/probe_tilings.py`); the cost model ranks them, the
# GPU times the cheapest few
GRID_TILES = (64, 128, 32, 16, 8)
LOOP_TILES = (64, 128, 32, 16, 256, 512, 1024)
MAX_TILINGS = 96  # most tilings built per program


# ---- classes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeClass:
    """A family of programs, recognised by the operator kinds they use."""

    name: str
    description: str
    matches: Callable[[Counter], bool]
    preset: str
    extra_ops: int  # block operators beyond the program's compute operators
    # block kinds of a second search when the first finds nothing (a reduced index too short
    # to loop over must be reduced inside the block)
    retry_kinds: frozenset = frozenset()


def _kinds(program) -> Counter:
    return Counter(op.kind for op in program.ops if op.kind is not OpKind.INPUT)


def _only(counts: Counter, allowed: set[OpKind]) -> bool:
    return set(counts) <= allowed


_EPILOGUE = {OpKind.ADD, OpKind.MUL, OpKind.MUL_SCALAR, OpKind.SILU, OpKind.RESHAPE}

SHAPE_CLASSES: tuple[ShapeClass, ...] = (
    ShapeClass(
        "attention", "softmax(Q K) V, optionally masked (a 0/1 multiplier) and scaled",
        lambda c: c[OpKind.MATMUL] == 2 and c[OpKind.EXP] == 1 and c[OpKind.DIV] == 1
        and c[OpKind.REDUCTION] == 1
        and _only(c, {OpKind.MATMUL, OpKind.EXP, OpKind.DIV, OpKind.REDUCTION, OpKind.MUL,
                      OpKind.MUL_SCALAR, OpKind.RESHAPE}),
        "attention_block", 1, frozenset({OpKind.REDUCTION}),
    ),
    ShapeClass(
        "gated_mlp", "silu(X W1) * (X W3), optionally after an RMSNorm of X",
        lambda c: c[OpKind.MATMUL] == 2 and c[OpKind.SILU] == 1 and c[OpKind.MUL] == 1
        and c[OpKind.RMS_NORM] <= 1
        and _only(c, {OpKind.MATMUL, OpKind.SILU, OpKind.MUL, OpKind.RMS_NORM, OpKind.ADD}),
        "gated_mlp", 4,
    ),
    ShapeClass(
        "lora", "X W + (X A) B",
        lambda c: c[OpKind.MATMUL] == 3 and _only(c, {OpKind.MATMUL, OpKind.ADD}),
        "lora_block", 2,
    ),
    ShapeClass(
        "norm_linear", "RMSNorm(X) W (+ bias), one projection",
        lambda c: c[OpKind.MATMUL] == 1 and c[OpKind.RMS_NORM] == 1
        and _only(c, {OpKind.MATMUL, OpKind.RMS_NORM, OpKind.ADD, OpKind.RESHAPE}),
        "norm_linear", 3,
    ),
    ShapeClass(
        "linear_epilogue", "X W followed by elementwise operators (bias, residual)",
        lambda c: c[OpKind.MATMUL] == 1 and _only(c, {OpKind.MATMUL} | _EPILOGUE),
        "linear_epilogue", 1,
    ),
)


def classify(program) -> ShapeClass | None:
    """The shape class of ``program`` (None: no class, search it as it is)."""
    counts = _kinds(program)
    for cls in SHAPE_CLASSES:
        if cls.matches(counts):
            return cls
    return None


def splits_reduction(cls: ShapeClass, program) -> bool:
    """Whether ``program``'s sizes want its reduction split over the grid, which no tiling
    of a class answer does (:class:`Tiler` splits output indices only): attention with at
    most SMALL_LIMIT query rows per head (a decode step) would run on few blocks, each
    walking the whole KV sequence. Such a program is also searched as it is (the attention
    preset's split-KV form)."""
    if cls.name != "attention":
        return False
    scores = next(op for op in program.ops if op.kind is OpKind.MATMUL).outputs[0]
    return len(scores.dims) >= 2 and scores.dims[-2] <= SMALL_LIMIT


def class_overrides(cls: ShapeClass, program, retry: bool = False) -> dict:
    """Search overrides for a representative of class ``cls``: its preset, and room for the
    block operators the fused form needs (``retry``: with the class's retry kinds too)."""
    compute = sum(_kinds(program).values())
    overrides = {"preset": cls.preset, "max_block_ops": compute + cls.extra_ops}
    if retry:
        from mugraph.search.config import default_config

        kinds = default_config(program, cls.preset).block_kinds or frozenset()
        overrides["block_kinds"] = frozenset(kinds | cls.retry_kinds)
    return overrides


# ---- the representative ------------------------------------------------------------------------


def small_size(size: int) -> int:
    if size == 1:
        return 1
    return SMALL if size <= SMALL_LIMIT else LARGE


def _small_strides(dims: tuple[int, ...], strides: tuple[int, ...] | None) -> tuple[int, ...]:
    """Strides with the same order of dims (innermost first) as ``strides``, packed."""
    order = range(len(dims)) if strides is None else sorted(
        range(len(dims)), key=lambda d: (strides[d], -d), reverse=True
    )
    out = [0] * len(dims)
    step = 1
    for d in reversed(list(order)):
        out[d] = step
        step *= dims[d]
    return tuple(out)


def _small_attrs(op) -> dict | None:
    attrs = op.attr_dict
    if op.kind is OpKind.RESHAPE:
        attrs["dims"] = tuple(small_size(d) for d in attrs["dims"])
    if op.kind is OpKind.RMS_NORM:
        attrs["normalized_shape"] = tuple(small_size(d) for d in attrs["normalized_shape"])
    return attrs


def _batch_dims_small(program) -> bool:
    """Whether the dims in front of the last two of every input are batch dims (matmul
    broadcasting: heads, sequences of a batch), made small in the representative whatever
    their size: the representative is searched on one block, which would otherwise hold 64
    heads (no tiling fits its shared memory; a Llama-1B attention with its 32 expanded heads
    found 0 states). Not with a reshape, whose sizes must still multiply out."""
    kinds = _kinds(program)
    return OpKind.MATMUL in kinds and OpKind.RESHAPE not in kinds


def _representative_dims(dims: tuple[int, ...], batch_small: bool) -> tuple[int, ...]:
    lead = len(dims) - 2 if batch_small and len(dims) >= 3 else 0
    return tuple(min(d, SMALL) if i < lead else small_size(d) for i, d in enumerate(dims))


def representative(program) -> KernelGraph | None:
    """``program`` with small sizes (see the module docstring); None when it does not rebuild
    (a reshape whose sizes no longer multiply out, a custom kernel)."""
    graph = new_kernel_graph()
    handles: list = []
    batch_small = _batch_dims_small(program)
    try:
        for op in program.ops:
            if op.kind is OpKind.INPUT:
                t = op.outputs[0]
                dims = _representative_dims(t.dims, batch_small)
                handles.append([graph.new_input(dims, _small_strides(dims, t.strides), t.dtype)])
                continue
            if op.kind not in Group.KERNEL or op.kind is OpKind.CUSTOMIZED:
                return None
            args = [handles[r.op][r.index] for r in op.inputs]
            handles.append(graph._append(op.kind, args, _small_attrs(op)))
        for r in program.outputs:
            graph.mark_output(handles[r.op][r.index])
    except MugraphError:
        return None
    return graph


# ---- tiling the answer for the real sizes --------------------------------------------------------


class NotInstantiable(Exception):
    """The representative's μGraph has a form :func:`instantiate` does not tile."""


@dataclass(frozen=True)
class _Kernel:
    """The one custom kernel of a representative's μGraph."""

    inputs: tuple[int, ...]  # program input positions it reads, in order
    block: BlockGraph


def _single_kernel(best) -> _Kernel:
    n_in = len(best.input_ops)
    ops = best.ops[n_in:]
    if len(ops) != 1 or ops[0].kind is not OpKind.CUSTOMIZED:
        raise NotInstantiable("not exactly one custom kernel over the program's inputs")
    op = ops[0]
    if any(r.op >= n_in or r.index for r in op.inputs):
        raise NotInstantiable("the custom kernel reads a computed tensor")
    if len(best.outputs) != len(op.outputs):
        raise NotInstantiable("the outputs are not the custom kernel's")
    block = op.attr("graph")
    if any(o.kind is OpKind.RESHAPE for o in block.ops):
        raise NotInstantiable("a block-level reshape (its sizes are the representative's)")
    return _Kernel(tuple(r.op for r in op.inputs), block)


def _loop_atom(small_program, kernel: _Kernel) -> str | None:
    if kernel.block.forloop_range <= 1:
        return None
    labels, _ = lab.program_labels(small_program)
    for pos, op in zip(kernel.inputs, kernel.block.input_ops, strict=True):
        fdim = op.attr("forloop_dim")
        if fdim >= 0:
            return lab.outer_atom(labels[pos][fdim])
    return None


def _extent(labels: list, atom: str) -> int:
    for labs in labels:
        for label in labs:
            if label and label[0][0] == atom:
                return label[0][1]
    raise NotInstantiable(f"index {atom} not found in the program")


def _tile_options(extent: int, for_loop: bool) -> list[int]:
    """Parts to cut an index of ``extent`` into (grid size or for-loop range)."""
    if extent <= SMALL_LIMIT and not for_loop:
        return [extent, 1]
    tiles = LOOP_TILES if for_loop else GRID_TILES
    options = [extent // t for t in tiles if extent % t == 0 and t <= extent]
    if extent <= max(tiles):
        options.append(1)
    return list(dict.fromkeys(options)) or [1]


def _dim_of(labels, atom: str | None) -> int:
    if atom is None:
        return -1
    for d, label in enumerate(labels):
        if lab.outer_atom(label) == atom:
            return d
    return -1


def _build(program, kernel: _Kernel, axes: list[tuple[str, int]], loop: tuple[str, int] | None,
           in_labels: list, out_labels: list) -> KernelGraph:
    """The real μGraph with grid ``axes`` (atom, parts) and for-loop ``loop``."""
    graph = new_kernel_graph()
    inputs = [graph.new_input(t.dims, t.strides, t.dtype) for t in program.input_types]
    grid = tuple([g for _, g in axes] + [1] * (3 - len(axes)))
    tb = ThreadBlockGraph(grid, kernel.block.block_dim, loop[1] if loop else 1,
                          kernel.block.reduction_dimx)
    handles: list = []
    outs = iter(range(len(program.outputs)))
    for op in kernel.block.ops:
        args = [handles[r.op][r.index] for r in op.inputs]
        if op.kind is OpKind.BLOCK_INPUT:
            pos = kernel.inputs[op.attr("index")]
            labels = in_labels[pos]
            imap = tuple([_dim_of(labels, a) for a, _ in axes] + [-1] * (3 - len(axes)))
            fdim = _dim_of(labels, loop[0]) if loop else -1
            handles.append([tb.new_input(inputs[pos], imap, fdim)])
        elif op.kind is OpKind.BLOCK_OUTPUT:
            labels = out_labels[next(outs)]
            omap = tuple([_dim_of(labels, a) for a, _ in axes] + [-1] * (3 - len(axes)))
            fdim = _dim_of(labels, loop[0]) if loop and op.attr("forloop_dim") >= 0 else -1
            tb.new_output(args[0], omap, fdim)
            handles.append([])
        else:
            attrs = op.attr_dict
            if op.kind is OpKind.RMS_NORM:
                attrs["normalized_shape"] = (args[0].dims[-1],)
            handles.append(tb._append(op.kind, args, attrs))
    for out in graph.customized([inputs[p] for p in kernel.inputs], tb):
        graph.mark_output(out)
    return graph


@dataclass(frozen=True)
class Tiling:
    """One tiling of the representative's kernel for a program: grid axes (index, parts), the
    for-loop (index, range), and the μGraph they give."""

    axes: tuple[tuple[str, int], ...]
    loop: tuple[str, int] | None
    graph: KernelGraph

    @property
    def loop_tile(self) -> int | None:
        """How much of the for-loop's index one iteration covers (None without a loop)."""
        if self.loop is None:
            return None
        kernels = [op for op in self.graph.ops if op.kind is OpKind.CUSTOMIZED]
        for op in kernels[0].attr("graph").input_ops:
            fdim = op.attr("forloop_dim")
            if fdim >= 0:
                return op.outputs[0].dims[fdim]
        return None


class Tiler:
    """Tilings of a representative's single-kernel μGraph for ``program`` (module docstring)."""

    def __init__(self, best_small, small_program, program) -> None:
        self.kernel = _single_kernel(best_small)
        self.program = program
        self.in_labels, self.out_labels = lab.program_labels(program)
        self.loop_atom = _loop_atom(small_program, self.kernel)
        out_atoms = {lab.outer_atom(x) for labels in self.out_labels for x in labels}
        concatenated = any(o.attr("forloop_dim") >= 0 for o in self.kernel.block.output_ops)
        if concatenated and self.loop_atom not in out_atoms:
            raise NotInstantiable("an output concatenated over a loop that is not its index")
        if concatenated:
            # a loop over an output index (each iteration writes its own rows) is a grid split
            # of that index: the real kernel splits it over its grid instead
            if any(o.kind in Group.ACCUMULATOR for o in self.kernel.block.ops):
                raise NotInstantiable("accumulators in a loop over an output index")
            self.loop_atom = None

    @property
    def looped(self) -> bool:
        """Whether the representative's kernel has a for-loop."""
        return self.kernel.block.forloop_range > 1

    def tilings(self, cost: Callable | None = None) -> list[Tiling]:
        """Every tiling that fits the GPU (at most MAX_TILINGS), cheapest first by ``cost``
        (default: the cost model)."""
        loops: list[tuple[str, int] | None] = [None]
        if self.loop_atom is not None:
            extent = _extent(self.in_labels, self.loop_atom)
            loops = [(self.loop_atom, f) for f in _tile_options(extent, for_loop=True)]
        atoms = {lab.outer_atom(x) for labels in self.out_labels for x in labels}
        out_atoms = sorted(atoms - {None, self.loop_atom})
        axis_options = [[(a, g) for g in _tile_options(_extent(self.out_labels, a), False)]
                        for a in out_atoms]
        built = []
        for loop in loops:
            for combo in itertools.product(*axis_options):
                axes = tuple((a, g) for a, g in combo if g > 1)
                if len(axes) > 3:
                    continue
                try:
                    graph = _build(self.program, self.kernel, list(axes), loop,
                                   self.in_labels, self.out_labels)
                except MugraphError:
                    continue
                built.append(Tiling(axes, loop, graph))
                if len(built) >= MAX_TILINGS:
                    break
        if cost is None:
            from mugraph.search.driver import default_cost as cost
        return sorted(built, key=lambda t: (cost(t.graph), t.graph.structural_hash()))

    def tiling(self, axes: tuple, loop: tuple[str, int] | None) -> Tiling | None:
        """The one tiling of grid ``axes`` ((index, parts), ...) and for-loop ``loop``, or
        None when it does not fit the GPU (what :meth:`tilings` would skip)."""
        try:
            graph = _build(self.program, self.kernel, list(axes), loop, self.in_labels,
                           self.out_labels)
        except MugraphError:
            return None
        return Tiling(tuple(axes), loop, graph)

    def reduced(self, tiling: Tiling) -> tuple[KernelGraph, KernelGraph]:
        """(program, μGraph) with every split index cut to at most two tiles (grid parts and
        for-loop iterations at most 2) and the same block graph: the tiles, operators and
        maps of ``tiling`` exactly, on tensors small enough to verify quickly."""
        cuts = {a: min(g, 2) for a, g in tiling.axes}
        if tiling.loop is not None:
            cuts[tiling.loop[0]] = min(tiling.loop[1], 2)
        extents = {}
        for atom, parts in cuts.items():
            whole = _extent(self.in_labels + self.out_labels, atom)
            splits = dict(tiling.axes).get(atom) or (tiling.loop[1] if tiling.loop else 1)
            extents[atom] = whole // splits * parts
        program = _resized(self.program, self.in_labels, extents)
        in_labels, out_labels = lab.program_labels(program)
        axes = [(a, cuts[a]) for a, _ in tiling.axes]
        loop = (tiling.loop[0], cuts[tiling.loop[0]]) if tiling.loop else None
        return program, _build(program, self.kernel, axes, loop, in_labels, out_labels)


def _resized(program, in_labels: list, extents: dict[str, int]) -> KernelGraph:
    """``program`` with the dims over the indices in ``extents`` resized (same layouts)."""
    graph = new_kernel_graph()
    handles: list = []
    inputs = iter(range(len(program.input_ops)))
    for op in program.ops:
        if op.kind is OpKind.INPUT:
            t, labels = op.outputs[0], in_labels[next(inputs)]
            dims = []
            for d, label in zip(t.dims, labels, strict=True):
                if label and len(label) > 1 and label[0][0] in extents:
                    raise NotInstantiable("a compound index is split")
                dims.append(extents.get(lab.outer_atom(label), d))
            dims = tuple(dims)
            handles.append([graph.new_input(dims, _small_strides(dims, t.strides), t.dtype)])
            continue
        if op.kind is OpKind.RESHAPE:
            raise NotInstantiable("a reshape in the program")
        args = [handles[r.op][r.index] for r in op.inputs]
        attrs = op.attr_dict
        if op.kind is OpKind.RMS_NORM:
            n = len(attrs["normalized_shape"])
            attrs["normalized_shape"] = tuple(args[0].dims[-n:])
        handles.append(graph._append(op.kind, args, attrs))
    for r in program.outputs:
        graph.mark_output(handles[r.op][r.index])
    return graph
