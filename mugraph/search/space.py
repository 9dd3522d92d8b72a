"""Search spaces chosen from the program's shape class.

``superoptimize()`` without a preset looks at the program's matmuls and exponentials
(:class:`ProgramFacts`), takes the first of :data:`SHAPE_CLASSES` whose rule holds, and searches
the space of that class's preset (:data:`PRESETS`). A preset is a set of SearchConfig fields
written in tile sizes, part counts and block counts, not in absolute grid sizes, so one preset
fits every size of its class: the generator turns them into grids and for-loops for each index
of the program (:mod:`mugraph.search.generator`).

The user keeps the last word: ``superoptimize(config="generic")`` (or any preset name, or a
SearchConfig) replaces the automatic choice, and keyword options change single fields of
whichever space is used (``superoptimize(min_blocks=1)``). ``classify(program)`` says which
class and why; the config records the preset's name (``config.preset``).

The search verifies candidates with one round over finite fields in these presets (a
screen: a non-equivalent graph fails it with overwhelming probability); the graph
``superoptimize`` returns then gets the full final verification, its rounds spread over all
cores (:func:`mugraph.search.driver.verify_in_parallel`).

Why these spaces (H100 figures; ``gpu.multiprocessors`` = 132):

- attention — ``softmax(Q @ K) @ V``: one kernel over the whole KV sequence (FlashAttention,
  the form the search finds at small sizes) or two, the first splitting the KV sequence into
  parts whose partial numerators and denominators the second combines (FlashDecoding, paper
  Fig 4b/4c; decode rows have too few query rows to fill the GPU otherwise). Blocks take 16-128
  query rows and all or a slice of the head dim; heads (a batch index) may go one per block; the
  loop walks the KV sequence 32-128 keys at a time.
- gemv — a few rows against a large weight (RMSNorm+Linear, gated MLP, LoRA at decode batch):
  bandwidth-bound, so what matters is that every multiprocessor streams weights. One kernel
  (blocks over the output columns, a loop over K) or split-K: the first kernel cuts K into
  2-16 parts over its grid and writes partial sums, the second adds them up (and applies what
  follows the matmul).
- lora — ``X @ W + (X @ A) @ B`` with a small rank: concatenation fuses the low-rank product
  into the main one (paper Fig 9b).
- mlp — a chain through a small hidden dim (adapter MLP): partial sums of the first matmul
  over blocks, then a kernel that combines them (paper Fig 10b); the generic space has it.
- elementwise — no matmul (the norms in front of QK-norm attention): one kernel without a
  loop, reductions inside the block, blocks of 16-128 rows or columns.
- generic — anything else: the historical defaults (grid sizes dividing the dims, loops of
  1-64 iterations).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mugraph.gpu import GPUSpec
from mugraph.ir.ops import AccumKind, Group, OpKind

GEMV_MAX_ROWS = 64  # rows of the activation in a matmul that counts as matrix-vector shaped
GEMV_WEIGHT_RATIO = 16  # ... whose weight is at least this many times the activation
LOW_RANK = 32  # inner or outer dims up to this make a low-rank matmul


@dataclass(frozen=True)
class MatmulShape:
    """A matmul of the program: [batch.., rows, inner] @ [batch.., inner, cols]."""

    batch: int
    rows: int
    inner: int
    cols: int
    right_elements: int  # elements of the right operand (a weight, for a linear layer)


@dataclass(frozen=True)
class ProgramFacts:
    """What the shape classes look at."""

    matmuls: tuple[MatmulShape, ...]
    softmax: bool  # an exponential between two matmuls: softmax(Q @ K) @ V
    largest_input_bytes: int
    sum_of_products: bool  # an add whose operands are both matmul results (LoRA's shape)
    gpu: GPUSpec
    compute_ops: int = 0  # operators other than inputs

    @property
    def gemv(self) -> bool:
        return any(
            m.batch == 1 and m.rows <= GEMV_MAX_ROWS
            and m.right_elements >= GEMV_WEIGHT_RATIO * m.rows * m.inner
            for m in self.matmuls
        )

    @property
    def longest_reduction(self) -> int:
        """The longest inner dim of the program's matmuls (K, or the KV sequence)."""
        return max((m.inner for m in self.matmuls), default=0)

    @property
    def low_rank(self) -> bool:
        return len(self.matmuls) >= 2 and any(
            min(m.inner, m.cols) <= LOW_RANK for m in self.matmuls
        )


def program_facts(program) -> ProgramFacts:
    """Matmul shapes and the softmax / sum-of-products patterns of ``program``."""
    ops = program.ops
    matmuls = []
    from_matmul: set[int] = set()  # ops whose value is computed from a matmul result
    reaches_matmul: set[int] = set()  # ops whose value flows into a matmul
    for i, op in enumerate(ops):
        if op.kind is OpKind.MATMUL:
            a, b = (program.tensor_type(r).dims for r in op.inputs)
            out = op.outputs[0].dims
            matmuls.append(
                MatmulShape(math.prod(out[:-2]), a[-2], a[-1], b[-1], math.prod(b))
            )
        if op.kind is OpKind.MATMUL or any(r.op in from_matmul for r in op.inputs):
            from_matmul.add(i)
    consumers: dict[int, list[int]] = {}
    for j, op in enumerate(ops):
        for r in op.inputs:
            consumers.setdefault(r.op, []).append(j)
    for i in range(len(ops) - 1, -1, -1):
        if any(ops[j].kind is OpKind.MATMUL or j in reaches_matmul for j in consumers.get(i, [])):
            reaches_matmul.add(i)
    softmax = any(
        op.kind in Group.EXPONENTIAL and i in reaches_matmul
        and any(r.op in from_matmul for r in op.inputs)
        for i, op in enumerate(ops)
    )
    products = {i for i, op in enumerate(ops) if op.kind is OpKind.MATMUL}
    sum_of_products = any(
        op.kind is OpKind.ADD and all(r.op in products for r in op.inputs) for op in ops
    )
    largest = max((t.num_bytes for t in program.input_types), default=0)
    compute = sum(1 for op in ops if op.kind is not OpKind.INPUT)
    return ProgramFacts(tuple(matmuls), softmax, largest, sum_of_products, program.gpu, compute)


# ---- presets: SearchConfig fields as functions of the facts ----------------------------------


@dataclass(frozen=True)
class Preset:
    """A named search space: ``fields(facts)`` gives the SearchConfig fields it sets."""

    name: str
    purpose: str
    fields: Callable[[ProgramFacts], dict]


def _split_reduction_fields(facts: ProgramFacts) -> dict:
    """What the attention and gemv spaces share: one or two kernels, the longest reduction
    split over the grid or looped over, block tiles of 16-128, at least :func:`_min_blocks`
    blocks, 6 block operators, a one-round verification screen."""
    return {
        "max_custom_kernels": 2,
        "grid_tiles": (16, 32, 64, 128),
        "split_min_extent": facts.longest_reduction,
        "loop_reduced_only": True,
        "min_blocks": _min_blocks(facts),
        "min_block_ops": 6,
        "max_block_ops": 6,
        "max_total_block_ops": 8,
        "max_reread_bytes": facts.largest_input_bytes // 8,
        "split_reads_largest": True,
        "verify_rounds": 1,
    }


SOFTMAX_ATTENTION_OPS = 5  # matmul, exp, its sum, the division, matmul


def _attention_fields(facts: ProgramFacts) -> dict:
    """The split-KV form of softmax(Q K) V has 8 block operators over its two kernels; each
    operator the program adds (a mask's multiply, a scale) is one more in the first."""
    extra = max(0, facts.compute_ops - SOFTMAX_ATTENTION_OPS)
    fields = {
        **_split_reduction_fields(facts),
        "accum_kinds": frozenset({AccumKind.NONE, AccumKind.SUM}),
        "partial_splits": (2, 4, 8, 16, 32, 64, 128),
        "loop_tiles": (32, 64, 128),
        "forloop_ranges": (1, 2, 4, 8, 16, 32, 64, 128),
        "max_full_split": 4096,
        "max_blocks": 4096,
    }
    fields["max_total_block_ops"] += extra
    return fields


def _min_blocks(facts: ProgramFacts) -> int:
    """An eighth of the multiprocessors, rounded down to a power of two (16 on an H100):
    fewer blocks leave most of the GPU idle. (Decode attention split 16 ways can still win:
    its combining kernel reads fewer partials.)"""
    return 1 << max(0, (facts.gpu.multiprocessors // 8).bit_length() - 1)


def _pow2_between(low: int, high: int) -> tuple[int, ...]:
    return tuple(1 << e for e in range(4, 16) if low <= 1 << e <= high)


def _gemv_fields(facts: ProgramFacts) -> dict:
    k = facts.longest_reduction
    return {
        **_split_reduction_fields(facts),
        "partial_splits": (2, 4, 8, 16),
        "loop_tiles": _pow2_between(max(16, k // 64), max(16, k // 4)),
        "max_grid_axes": 2,
    }


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "attention",
            "softmax(Q @ K) @ V: one kernel over the KV sequence, or a split-KV kernel of "
            "partial sums and a combining kernel; blocks of 16-128 query rows, heads one per "
            "block, at least half a wave of blocks",
            _attention_fields,
        ),
        Preset(
            "gemv",
            "a few rows against a large weight: one kernel over the output columns looping "
            "over K, or split-K (partial sums over 2-16 parts of K, then a combining kernel); "
            "at least half a wave of blocks",
            _gemv_fields,
        ),
        Preset(
            "lora",
            "matmuls added through a small rank: concatenation fuses the low-rank product "
            "into the main one (Fig 9b)",
            lambda facts: {"block_kinds_extra": frozenset({OpKind.CONCAT}), "max_block_ops": 5},
        ),
        Preset(
            "mlp",
            "a chain through a small hidden dim: partial sums over blocks, then a combining "
            "kernel (Fig 10b); the generic space",
            lambda facts: {},
        ),
        Preset(
            "elementwise",
            "no matmul (norms, elementwise chains): one kernel without a for-loop, blocks of "
            "16-128 rows or columns, reductions inside the block",
            lambda facts: {
                "max_custom_kernels": 1,
                "block_kinds_extra": frozenset({OpKind.REDUCTION}),
                "grid_tiles": (16, 32, 64, 128),
                "forloop_ranges": (1,),
                "max_grid_axes": 2,
                "max_full_split": 4096,
                "min_blocks": _min_blocks(facts),
                "min_block_ops": 6,
                "max_block_ops": 6,
            },
        ),
        Preset("generic", "grid sizes dividing the dims, loops of 1-64 iterations",
               lambda facts: {}),
    ]
}

# The shape classes of model partitions (mugraph.search.shape_class): each is searched on a
# small representative as ONE custom kernel on ONE block that loops over the reduced index;
# the answer is tiled for the real sizes afterwards. So these searches complete in seconds.
_ONE_BLOCK = {
    "max_custom_kernels": 1,
    "griddims": ((1, 1, 1),),
    "forloop_ranges": (4,),
    "deepening": False,
}


def _one_block(name: str, purpose: str, **extra) -> Preset:
    return Preset(name, purpose + " (one block, tiled afterwards)",
                  lambda facts: {**_ONE_BLOCK, **extra})


PRESETS.update({
    p.name: p
    for p in [
        _one_block("norm_linear", "RMSNorm (with its epsilon) + projection: the rms "
                   "accumulated beside the matmul"),
        _one_block("gated_mlp", "silu(X W1) * (X W3) after an RMSNorm: both matmuls, the rms "
                   "and the gate in one loop"),
        _one_block("attention_block", "softmax(Q K) V with a 0/1 mask: exp, its sum and "
                   "(exp) V accumulated over the keys",
                   accum_kinds=frozenset({AccumKind.NONE, AccumKind.SUM})),
        _one_block("lora_block", "X W + (X A) B: both paths accumulated in one loop",
                   block_kinds_extra=frozenset({OpKind.CONCAT})),
        _one_block("linear_epilogue", "a projection with its bias / residual applied in the "
                   "epilogue"),
    ]
})


# ---- shape classes: which preset a program gets ------------------------------------------------


@dataclass(frozen=True)
class SpaceRule:
    """A rule that picks a preset: ``law`` says when it applies (first match wins). (Not to
    be confused with :class:`mugraph.search.shape_class.ShapeClass`: the families of model
    partitions searched on a small representative under torch.compile.)"""

    name: str
    law: str
    applies: Callable[[ProgramFacts], bool]
    preset: str


SHAPE_CLASSES: tuple[SpaceRule, ...] = (
    SpaceRule(
        "attention",
        "an exponential is computed from a matmul and flows into another matmul",
        lambda f: f.softmax,
        "attention",
    ),
    SpaceRule(
        "gemv",
        f"a matmul of at most {GEMV_MAX_ROWS} rows (no batch) whose weight is at least "
        f"{GEMV_WEIGHT_RATIO}x its activation: weight-bandwidth-bound, all multiprocessors "
        "must stream",
        lambda f: f.gemv,
        "gemv",
    ),
    SpaceRule(
        "lora",
        f"two matmul products added, one through a dim of at most {LOW_RANK}",
        lambda f: f.low_rank and f.sum_of_products,
        "lora",
    ),
    SpaceRule(
        "mlp",
        f"a chain of matmuls through a dim of at most {LOW_RANK}",
        lambda f: f.low_rank,
        "mlp",
    ),
    SpaceRule("elementwise", "no matmul", lambda f: not f.matmuls, "elementwise"),
    SpaceRule("generic", "anything else", lambda f: True, "generic"),
)


def classify(program) -> SpaceRule:
    """The first shape class whose rule holds for ``program``."""
    facts = program_facts(program)
    return next(c for c in SHAPE_CLASSES if c.applies(facts))


def preset_fields(program, preset: str | None) -> tuple[str, dict]:
    """(preset name, its SearchConfig fields) for ``program``; None picks it by class."""
    name = preset if preset is not None else classify(program).preset
    return name, dict(PRESETS[name].fields(program_facts(program)))
