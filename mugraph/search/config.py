"""The search space as one config object, with defaults derived from the program's shapes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from mugraph.errors import UnsupportedError
from mugraph.ir.ops import AccumKind, Group, OpKind

# Block operators every search may use; elementwise functions come from the program itself.
_STRUCTURAL_BLOCK_KINDS = frozenset(
    {OpKind.MATMUL, OpKind.ADD, OpKind.MUL, OpKind.DIV, OpKind.FORLOOP_ACCUM}
)


@dataclass(frozen=True)
class SearchConfig:
    """What the generator may build. ``None`` fields are derived from the program.

    grid_sizes:     sizes a grid axis may take (each must divide the index it splits)
    forloop_ranges: for-loop ranges to try (1 = no loop)
    max_blocks:     most blocks in one custom kernel
    min_tile:       a grid axis or the for-loop leaves at least this many elements of the
                    index it splits per block / iteration (tensor cores want 16) ...
    max_full_split: ... unless it splits an index of at most this size completely (heads)
    split_before_boundary: a custom kernel that is not the last splits an index the
                    program reduces over its grid, so its outputs are partial results a
                    later kernel combines (otherwise the two kernels could be one)
    block_kinds:    block operator kinds to enumerate (default: matmul, add, mul, div,
                    accumulators, plus every elementwise kind the program uses)
    accum_kinds:    accumulator kinds to enumerate
    """

    max_custom_kernels: int = 2
    min_custom_kernels: int = 1
    max_kernel_ops: int = 2
    max_block_ops: int = 7
    min_block_ops: int = 3
    deepening: bool = True
    max_block_outputs: int = 2
    max_kernel_inputs: int = 4
    grid_sizes: tuple[int, ...] | None = None
    max_grid_axes: int = 3
    forloop_ranges: tuple[int, ...] | None = None
    max_blocks: int = 1024
    min_tile: int = 16
    max_full_split: int = 64
    split_before_boundary: bool = True
    block_kinds: frozenset[OpKind] | None = None
    kernel_kinds: frozenset[OpKind] = frozenset()
    accum_kinds: frozenset[AccumKind] = frozenset({AccumKind.NONE, AccumKind.SUM})
    time_limit: float = 60.0
    workers: int | None = None
    delta: float = 1e-9
    verify_rounds: int = 4
    abstract_pruning: bool = True
    canonical_form: bool = True
    label_pruning: bool = True
    max_candidates: int = 64
    # upstream-style restrictions (None: no restriction): allowed grid dims (x, y, z), imaps
    # of custom-kernel inputs, omaps of their outputs, forloop dims of their inputs
    griddims: tuple[tuple[int, int, int], ...] | None = None
    imaps: tuple[tuple[int, int, int], ...] | None = None
    omaps: tuple[tuple[int, int, int], ...] | None = None
    fmaps: tuple[int, ...] | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def with_overrides(self, **overrides) -> SearchConfig:
        if "franges" in overrides:  # upstream's name for the for-loop ranges
            overrides["forloop_ranges"] = tuple(overrides.pop("franges"))
        for name in ("griddims", "imaps", "omaps"):
            if overrides.get(name) is not None:
                overrides[name] = tuple(_grid_tuple(name, v) for v in overrides[name])
        if overrides.get("fmaps") is not None:
            overrides["fmaps"] = tuple(int(v) for v in overrides["fmaps"])
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise UnsupportedError(f"superoptimize: unknown search option(s) {sorted(unknown)}")
        return replace(self, **overrides)

    @property
    def worker_count(self) -> int:
        return self.workers if self.workers else (os.cpu_count() or 1)


def _grid_tuple(name: str, value) -> tuple[int, int, int]:
    items = tuple(value)
    if not 1 <= len(items) <= 3 or not all(isinstance(v, int) for v in items):
        raise UnsupportedError(
            f"superoptimize: {name} entries are (x, y, z) int tuples, got {value!r}"
        )
    pad = 1 if name == "griddims" else -1
    return (*items, *(pad,) * (3 - len(items)))  # type: ignore[return-value]


PRESETS: dict[str, dict] = {
    # matmul chains with a small inner dim: concatenation fuses the low-rank path
    "lora": {"block_kinds_extra": frozenset({OpKind.CONCAT}), "max_block_ops": 5},
    # attention: exp, partial sums of the denominators, two kernels
    "attention": {"accum_kinds": frozenset({AccumKind.NONE, AccumKind.SUM})},
    # MLPs: split-K partial sums over blocks, then a combining kernel
    "mlp": {},
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
PRESETS.update({
    # RMSNorm (with its epsilon) + projection: rms accumulated beside the matmul
    "norm_linear": dict(_ONE_BLOCK),
    # silu(X W1) * (X W3), after an RMSNorm: both matmuls, the rms and the gate in one loop
    "gated_mlp": dict(_ONE_BLOCK),
    # softmax(Q K) V with a 0/1 mask: exp, its sum and (exp) V accumulated over the keys
    "attention_block": {**_ONE_BLOCK, "accum_kinds": frozenset({AccumKind.NONE, AccumKind.SUM})},
    # X W + (X A) B: both paths accumulated in one loop
    "lora_block": {**_ONE_BLOCK, "block_kinds_extra": frozenset({OpKind.CONCAT})},
    # a projection with its bias / residual applied in the epilogue
    "linear_epilogue": dict(_ONE_BLOCK),
})


def default_config(program, preset: str | None = None, **overrides) -> SearchConfig:
    """A config for ``program``: its elementwise kinds, grid sizes dividing its dims."""
    used = {op.kind for op in program.ops}
    kinds = set(_STRUCTURAL_BLOCK_KINDS) | {k for k in used if k in Group.ELEMENTWISE}
    if OpKind.RMS_NORM in used:
        kinds.add(OpKind.FORLOOP_ACCUM)
    extra = dict(PRESETS.get(preset or "", {}))
    if preset is not None and preset not in PRESETS:
        raise UnsupportedError(
            f"superoptimize: unknown config preset {preset!r}; use one of {sorted(PRESETS)}"
        )
    kinds |= extra.pop("block_kinds_extra", frozenset())
    accum = {AccumKind.NONE, AccumKind.SUM}
    if OpKind.RMS_NORM in used:
        accum.add(AccumKind.RMS)
    config = SearchConfig(
        block_kinds=frozenset(kinds),
        accum_kinds=frozenset(accum),
        grid_sizes=_default_grid_sizes(program),
        forloop_ranges=(1, 2, 4, 8, 16, 32, 64),
    )
    return config.with_overrides(**{**extra, **overrides})


def _default_grid_sizes(program) -> tuple[int, ...]:
    largest = max(max(t.dims) for t in program.input_types)
    sizes = [s for s in (2, 4, 8, 16, 32, 64, 96, 128, 192, 256) if s <= largest]
    return tuple(sizes)
