"""The search space as one config object, with defaults derived from the program's shapes."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from mugraph.errors import MugraphError, UnsupportedError
from mugraph.ir.ops import AccumKind, Group, OpKind

# Block operators every search may use; elementwise functions come from the program itself.
_STRUCTURAL_BLOCK_KINDS = frozenset(
    {OpKind.MATMUL, OpKind.ADD, OpKind.MUL, OpKind.DIV, OpKind.FORLOOP_ACCUM}
)


_SIZE_TUPLES = ("grid_sizes", "forloop_ranges", "grid_tiles", "partial_splits", "loop_tiles")


class SearchOptionError(MugraphError):
    """A search option with a value the search cannot use (names the option and the value)."""


def is_int(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kinds_of(enum_type):
    return lambda v: isinstance(v, frozenset) and all(isinstance(k, enum_type) for k in v)


# What each field's value must be, as (test, what the error says it must be). A config that
# breaks one is refused when it is made (SearchConfig(...), with_overrides, a preset), before
# any search: a value the search cannot use never runs as a silently empty or broken space.
POSITIVE_INT = (lambda v: is_int(v) and v >= 1, "a positive integer")
_COUNT = (lambda v: is_int(v) and v >= 0, "an integer >= 0")
FLAG = (lambda v: isinstance(v, bool), "True or False")
_SIZES = (lambda v: v is None or (isinstance(v, tuple) and all(is_int(x) and x >= 1 for x in v)),
          "None or a tuple of positive integers")
_FIELD_RULES: dict[str, tuple] = {
    **{name: POSITIVE_INT for name in (
        "max_custom_kernels", "min_custom_kernels", "max_kernel_ops", "max_block_ops",
        "min_block_ops", "max_total_block_ops", "max_block_outputs", "max_kernel_inputs",
        "max_blocks", "min_tile", "max_full_split", "verify_rounds", "max_candidates",
        "min_blocks", "keep", "keep_per_structure", "max_structures")},
    # (a unit's config takes the counts of custom kernels and block operators it searches)
    "split_min_extent": _COUNT,
    **{name: FLAG for name in (
        "deepening", "split_before_boundary", "split_reads_largest", "abstract_pruning",
        "canonical_form", "label_pruning", "loop_reduced_only", "loop_required")},
    **{name: _SIZES for name in _SIZE_TUPLES},
    "max_grid_axes": (lambda v: is_int(v) and 0 <= v <= 3, "0, 1, 2 or 3"),
    "max_reread_bytes": (lambda v: v is None or (is_int(v) and v >= 0),
                         "None or an integer >= 0"),
    "time_limit": (lambda v: is_number(v) and math.isfinite(v) and v >= 0,
                   "a number of seconds >= 0 (0: no search, where a caller allows it)"),
    "workers": (lambda v: v is None or (is_int(v) and v >= 1), "None or a positive integer"),
    "delta": (lambda v: is_number(v) and 0 < v < 1, "a probability between 0 and 1"),
    "block_kinds": (lambda v: v is None or _kinds_of(OpKind)(v),
                    "None or a frozenset of mugraph.ir.ops.OpKind"),
    "kernel_kinds": (_kinds_of(OpKind), "a frozenset of mugraph.ir.ops.OpKind"),
    "accum_kinds": (_kinds_of(AccumKind), "a frozenset of mugraph.ir.ops.AccumKind"),
    "fmaps": (lambda v: v is None or (isinstance(v, tuple) and all(is_int(x) for x in v)),
              "None or a tuple of integers"),
    **{name: (lambda v: v is None or (isinstance(v, tuple) and all(
        isinstance(t, tuple) and len(t) == 3 and all(is_int(x) for x in t) for t in v)),
        "None or a tuple of (x, y, z) integer tuples") for name in ("griddims", "imaps", "omaps")},
    "preset": (lambda v: isinstance(v, str), "a preset name"),
    "extra": (lambda v: isinstance(v, dict), "a dict"),
}


@dataclass(frozen=True)
class SearchConfig:
    """What the generator may build. ``None`` fields are derived from the program.

    grid_sizes:     sizes a grid axis may take (each must divide the index it splits)
    forloop_ranges: for-loop ranges to try (1 = no loop)
    max_blocks:     most blocks in one custom kernel
    min_tile:       a grid axis or the for-loop leaves at least this many elements of the
                    index it splits per block / iteration (tensor cores want 16) ...
    max_full_split: ... unless it splits an index of at most this size completely (heads)
    max_total_block_ops: block operators of all custom kernels of a graph together (a split
                    form's combining kernel needs few once the first kernel has its share)
    max_reread_bytes: a program input an earlier kernel read is read again by a later one only
                    when it has at most this many bytes (None: any); a combining kernel may
                    re-read a GEMV's activation, not its weight
    split_before_boundary: a custom kernel that is not the last splits an index the
                    program reduces over its grid, so its outputs are partial results a
                    later kernel combines (otherwise the two kernels could be one)
    split_reads_largest: the first kernel of a graph of several reads the program's largest
                    input (the split kernel streams the weight, or the KV cache: a first
                    kernel that leaves the largest input to a later one adds a launch to a
                    one-kernel form's traffic)
    block_kinds:    block operator kinds to enumerate (default: matmul, add, mul, div,
                    accumulators, plus every elementwise kind the program uses)
    accum_kinds:    accumulator kinds to enumerate

    Shape-derived schedules (None / 0 / False: no restriction; the class presets of
    :mod:`mugraph.search.space` set them, and their sizes follow from the program's shapes):

    grid_tiles:     a grid axis over an index of the program's output leaves one of these
                    extents per block (rows, columns, head-dim slices); a batch index (one
                    every input and the output share, e.g. heads) may also be split completely
    partial_splits: a grid axis over an index the program reduces (partial results for a
                    combining kernel: split-K, split-KV) cuts it into one of these part counts
    split_min_extent: an index the program reduces is split (over the grid, or by the
                    for-loop) only when at least this long: presets split only the longest
                    reduction (K of a GEMV, the KV sequence of attention), since a short one
                    is cheaper whole in one block than accumulated or combined from partials
    loop_tiles:     the for-loop leaves one of these extents per iteration
    loop_reduced_only: the for-loop runs over a reduced index (or over partial results)
    loop_required:  every custom kernel has a for-loop (a class representative whose answer is
                    tiled for a long reduction: its kernel must stream that reduction)
    min_blocks:     a custom kernel has at least this many blocks, or the most its indices
                    allow under the rules above (keep the multiprocessors busy)
    keep, keep_per_structure, max_structures: unused — the search engine verifies every
                    complete graph a unit finds (up to ``max_candidates`` per unit) and the
                    GPU ranking picks the best by estimate and of each kernel structure
                    (:mod:`mugraph.optimize.ranking`). Kept so that the result cache's keys
                    (a hash of every field) stay those of the stored suite searches
    preset:         the name of the space this config came from (informational)
    """

    max_custom_kernels: int = 2
    min_custom_kernels: int = 1
    max_kernel_ops: int = 2
    max_block_ops: int = 7
    max_total_block_ops: int = 1 << 30
    min_block_ops: int = 3
    deepening: bool = True
    max_block_outputs: int = 2
    max_kernel_inputs: int = 4
    max_reread_bytes: int | None = None
    grid_sizes: tuple[int, ...] | None = None
    max_grid_axes: int = 3
    forloop_ranges: tuple[int, ...] | None = None
    max_blocks: int = 1024
    min_tile: int = 16
    max_full_split: int = 64
    split_before_boundary: bool = True
    split_reads_largest: bool = False
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
    grid_tiles: tuple[int, ...] | None = None
    partial_splits: tuple[int, ...] | None = None
    split_min_extent: int = 0
    loop_tiles: tuple[int, ...] | None = None
    loop_reduced_only: bool = False
    loop_required: bool = False
    min_blocks: int = 1
    keep: int = 8
    keep_per_structure: int = 2
    max_structures: int = 8
    preset: str = "generic"
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name, (valid, wanted) in _FIELD_RULES.items():
            value = getattr(self, name)
            if not valid(value):
                raise SearchOptionError(
                    f"superoptimize: search option {name!r} must be {wanted}, got {value!r}")

    def with_overrides(self, **overrides) -> SearchConfig:
        if "franges" in overrides:  # upstream's name for the for-loop ranges
            overrides["forloop_ranges"] = _int_tuple("franges", overrides.pop("franges"))
        for name in ("griddims", "imaps", "omaps"):
            if overrides.get(name) is not None:
                overrides[name] = tuple(_grid_tuple(name, v) for v in _items(name, overrides[name]))
        for name in ("fmaps", *_SIZE_TUPLES):
            if overrides.get(name) is not None:
                overrides[name] = _int_tuple(name, overrides[name])
        for name in ("block_kinds", "kernel_kinds", "accum_kinds"):
            if overrides.get(name) is not None and not isinstance(overrides[name], frozenset):
                overrides[name] = frozenset(_items(name, overrides[name]))
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise UnsupportedError(f"superoptimize: unknown search option(s) {sorted(unknown)}")
        return replace(self, **overrides)

    @property
    def worker_count(self) -> int:
        return self.workers if self.workers else (os.cpu_count() or 1)


def _items(name: str, value) -> tuple:
    """``value`` as a tuple of its items (a search option given as a list, set...)."""
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise SearchOptionError(
            f"superoptimize: search option {name!r} must be a sequence, got {value!r}")
    return tuple(value)


def _int_tuple(name: str, value) -> tuple[int, ...]:
    """A sequence of whole numbers (ints, or floats / NumPy integers of integral value) as a
    tuple of ints; anything else is refused naming the option."""
    items = _items(name, value)
    if not all(_whole(v) for v in items):
        raise SearchOptionError(
            f"superoptimize: search option {name!r} must hold integers, got {value!r}")
    return tuple(int(v) for v in items)


def _whole(value) -> bool:
    """An int or NumPy integer (not a bool), or a float of integral value."""
    if isinstance(value, float):
        return value.is_integer()
    return hasattr(value, "__index__") and not isinstance(value, bool)


def _grid_tuple(name: str, value) -> tuple[int, int, int]:
    items = tuple(value)
    if not 1 <= len(items) <= 3 or not all(isinstance(v, int) for v in items):
        raise UnsupportedError(
            f"superoptimize: {name} entries are (x, y, z) int tuples, got {value!r}"
        )
    pad = 1 if name == "griddims" else -1
    return (*items, *(pad,) * (3 - len(items)))  # type: ignore[return-value]


def default_config(program, preset: str | None = None, **overrides) -> SearchConfig:
    """A config for ``program``: the space of ``preset``, or of the program's shape class when
    ``preset`` is None (:mod:`mugraph.search.space`), with its elementwise kinds and grid sizes
    dividing its dims; ``overrides`` change single fields."""
    from mugraph.search.space import PRESETS, preset_fields

    if preset is not None and preset not in PRESETS:
        raise UnsupportedError(
            f"superoptimize: unknown config preset {preset!r}; use one of {sorted(PRESETS)}"
        )
    name, extra = preset_fields(program, preset)
    used = {op.kind for op in program.ops}
    kinds = set(_STRUCTURAL_BLOCK_KINDS) | {k for k in used if k in Group.ELEMENTWISE}
    if OpKind.RMS_NORM in used:
        # the rms accumulated over a for-loop that splits the row (norm + projection); for a
        # norm with no matmul, also the whole row normalised inside a block (the norms of
        # QK-norm attention, searched apart from it)
        kinds.add(OpKind.FORLOOP_ACCUM)
        if OpKind.MATMUL not in used:
            kinds.add(OpKind.RMS_NORM)
    kinds |= extra.pop("block_kinds_extra", frozenset())
    accum = {AccumKind.NONE, AccumKind.SUM}
    if OpKind.RMS_NORM in used:
        accum.add(AccumKind.RMS)
    accum |= extra.pop("accum_kinds", frozenset())
    config = SearchConfig(
        block_kinds=frozenset(kinds),
        accum_kinds=frozenset(accum),
        grid_sizes=_default_grid_sizes(program),
        forloop_ranges=(1, 2, 4, 8, 16, 32, 64),
        preset=name,
    )
    return config.with_overrides(**{**extra, **overrides})


def _default_grid_sizes(program) -> tuple[int, ...]:
    largest = max(max(t.dims) for t in program.input_types)
    sizes = [s for s in (2, 4, 8, 16, 32, 64, 96, 128, 192, 256) if s <= largest]
    return tuple(sizes)
