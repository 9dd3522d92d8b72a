"""Layouts: hierarchical shapes and strides, and their algebra (issue 17, first part).

A layout maps a coordinate to an offset: ``(shape, stride)``, each an int or a nested tuple of
ints of the same nesting ("int tuples"). An integer index ``i < size`` names a coordinate
colexicographically (the leftmost mode varies fastest), so ``Layout((4, 8), (1, 4))`` is a
column-major 4x8 matrix and ``Layout((4, 8), (8, 1))`` a row-major one. Nesting groups modes:
``Layout(((2, 2), 8), ((1, 16), 2))`` is still 32 elements, its first mode two-level.

The algebra, after Graphene / CuTe (``../shared/seeds/001``), each a function stated by the
law it satisfies (``tests/test_layout.py`` checks each against brute-force enumeration):

- :func:`coalesce` — the same function with the fewest modes: ``coalesce(A)(i) == A(i)``.
- :func:`composition` — ``composition(A, B)(i) == A(B(i))`` for ``i < size(B)``, its shape
  B's (where A's modes divide B's strides and sizes as tiling needs).
- :func:`complement` — the layout that fills the holes of ``A`` up to ``bound``:
  ``(A, complement(A, bound))`` is injective and its image covers ``[0, bound)``.
- :func:`logical_divide` — ``A`` tiled by ``tiler``: mode 0 is one tile (``A ∘ tiler``), mode
  1 walks the tiles (``A ∘ complement(tiler, size(A))``): the imap / for-loop split of a
  tensor's index space.
- :func:`logical_product` — ``A`` repeated by ``B``: ``(A, complement(A) ∘ B)``.

:mod:`mugraph.ir.tiling` divides device tensors into the tiles of imap / omap / forloop_dim
with :func:`logical_divide`; every interpretation reads its tiles from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import Union

from mugraph.errors import UnsupportedError

IntTuple = Union[int, tuple["IntTuple", ...]]  # noqa: UP007 - a recursive alias


class LayoutError(UnsupportedError):
    """A layout operation whose operands do not fit (names the operation and the operands)."""


# ---- int tuples ---------------------------------------------------------------------------------


def flatten(t: IntTuple) -> tuple[int, ...]:
    """The leaves of ``t``, left to right."""
    if isinstance(t, int):
        return (t,)
    return tuple(x for item in t for x in flatten(item))


def product(t: IntTuple) -> int:
    return math.prod(flatten(t))


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """Whether ``a`` and ``b`` have the same nesting."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int)
    return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b, strict=True))


def _unflatten(flat: list[int], like: IntTuple) -> IntTuple:
    """``flat`` (consumed from the front) in the nesting of ``like``."""
    if isinstance(like, int):
        return flat.pop(0)
    return tuple(_unflatten(flat, item) for item in like)


# ---- layouts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """``shape`` : ``stride``; a function from ``[0, size)`` (or coordinates) to offsets."""

    shape: IntTuple
    stride: IntTuple

    def __post_init__(self) -> None:
        if not congruent(self.shape, self.stride):
            raise LayoutError(f"layout: shape {self.shape} and stride {self.stride} differ in "
                              "nesting")
        if any(s < 1 for s in flatten(self.shape)):
            raise LayoutError(f"layout: shape {self.shape} has a mode of size below 1")

    @property
    def size(self) -> int:
        return product(self.shape)

    @property
    def cosize(self) -> int:
        """One past the largest offset (strides are not negative here)."""
        return sum((s - 1) * d for s, d in self.flat()) + 1

    @property
    def rank(self) -> int:
        return 1 if isinstance(self.shape, int) else len(self.shape)

    def mode(self, i: int) -> Layout:
        if isinstance(self.shape, int):
            if i != 0:
                raise LayoutError(f"layout {self}: mode {i} of a rank-1 layout")
            return self
        return Layout(self.shape[i], self.stride[i])  # type: ignore[index]

    def modes(self) -> list[Layout]:
        return [self.mode(i) for i in range(self.rank)]

    def flat(self) -> list[tuple[int, int]]:
        """(size, stride) of every leaf mode, left to right."""
        return list(zip(flatten(self.shape), flatten(self.stride), strict=True))

    def __call__(self, index: int | IntTuple) -> int:
        """The offset of an integer index (colexicographic) or of a coordinate congruent
        with the shape."""
        if isinstance(index, int):
            if not 0 <= index < max(self.size, 1):
                raise LayoutError(f"layout {self}: index {index} outside [0, {self.size})")
            offset = 0
            for size, stride in self.flat():
                offset += (index % size) * stride
                index //= size
            return offset
        if isinstance(self.shape, int) or len(index) != len(self.shape):
            raise LayoutError(f"layout {self}: coordinate {index} does not fit the shape")
        return sum(self.mode(i)(c) for i, c in enumerate(index))

    def offsets(self) -> list[int]:
        """Every offset, index order (for tests and small layouts)."""
        return [self(i) for i in range(self.size)]

    def __str__(self) -> str:
        return f"{_text(self.shape)}:{_text(self.stride)}"


def _text(t: IntTuple) -> str:
    return str(t) if isinstance(t, int) else "(" + ",".join(_text(x) for x in t) + ")"


def make_layout(*layouts: Layout) -> Layout:
    """The layout whose modes are ``layouts`` (concatenation: a rank-n layout)."""
    return Layout(tuple(a.shape for a in layouts), tuple(a.stride for a in layouts))


def column_major(shape: IntTuple) -> Layout:
    """The compact layout of ``shape`` whose leftmost mode is contiguous."""
    flat = flatten(shape)
    strides = [1, *accumulate(flat[:-1], lambda a, b: a * b)]
    return Layout(shape, _unflatten(list(strides), shape))


def row_major(dims: tuple[int, ...]) -> Layout:
    """A tensor of ``dims`` stored row-major (the last dim contiguous), modes in dim order."""
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    return Layout(tuple(dims), tuple(strides))


# ---- coalesce -----------------------------------------------------------------------------------


def coalesce(layout: Layout) -> Layout:
    """The same function as ``layout`` on ``[0, size)`` with the fewest modes: size-1 modes
    dropped, and a mode merged into the previous one when it continues it (its stride is
    the previous mode's size times stride)."""
    modes: list[tuple[int, int]] = []
    for size, stride in layout.flat():
        if size == 1:
            continue
        if modes and stride == modes[-1][0] * modes[-1][1]:
            modes[-1] = (modes[-1][0] * size, modes[-1][1])
        else:
            modes.append((size, stride))
    if not modes:
        return Layout(1, 0)
    if len(modes) == 1:
        return Layout(*modes[0])
    return Layout(tuple(s for s, _ in modes), tuple(d for _, d in modes))


# ---- composition --------------------------------------------------------------------------------


def composition(a: Layout, b: Layout) -> Layout:
    """``a ∘ b``: ``composition(a, b)(i) == a(b(i))`` for every ``i < size(b)``, with the
    shape of ``b`` (each leaf of ``b`` may become a tuple of modes of ``a``). ``a``'s modes
    must divide ``b``'s strides and sizes where they meet (the tiling case); otherwise a
    LayoutError names both."""
    if isinstance(b.shape, tuple):
        parts = [composition(a, mode) for mode in b.modes()]
        return Layout(tuple(p.shape for p in parts), tuple(p.stride for p in parts))
    return _compose_leaf(coalesce(a), b.shape, b.stride, a, b)


def _compose_leaf(a: Layout, size: int, stride: int, left: Layout, right: Layout) -> Layout:
    """``a`` (coalesced) composed with the single mode ``size : stride``."""
    if stride == 0 or size == 1:
        return Layout(size, 0)  # every index reads a(0) = 0
    modes = a.flat()
    shapes: list[int] = []
    strides: list[int] = []
    rest_stride, rest_size = stride, size
    for k, (mode_size, mode_stride) in enumerate(modes):
        last = k == len(modes) - 1
        if not last and rest_stride >= mode_size:
            if rest_stride % mode_size:
                raise _indivisible(left, right, f"stride {rest_stride} over mode size {mode_size}")
            rest_stride //= mode_size
            continue
        if not last and mode_size % rest_stride:
            raise _indivisible(left, right, f"mode size {mode_size} by stride {rest_stride}")
        available = math.inf if last else mode_size // rest_stride
        take = min(available, rest_size)
        if not last and take == available and rest_size % take:
            raise _indivisible(left, right, f"size {rest_size} over {take} elements of a mode")
        shapes.append(int(take))
        strides.append(mode_stride * rest_stride)
        rest_size //= int(take)
        rest_stride = 1
        if rest_size == 1:
            break
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(tuple(shapes), tuple(strides))


def _indivisible(a: Layout, b: Layout, what: str) -> LayoutError:
    return LayoutError(f"composition of {a} with {b}: {what} does not divide (a tile must "
                       "split the layout's modes evenly)")


# ---- complement, divide, product ----------------------------------------------------------------


def complement(layout: Layout, bound: int) -> Layout:
    """The layout filling the holes of ``layout`` up to ``bound``: ``(layout, complement)``
    is injective and covers ``[0, bound)`` (when ``bound`` is a multiple of what the modes
    reach; else up to the next such multiple)."""
    modes = sorted((d, s) for s, d in coalesce(layout).flat() if s > 1 and d > 0)
    shapes: list[int] = []
    strides: list[int] = []
    current = 1
    for stride, size in modes:
        if stride % current:
            raise LayoutError(f"complement of {layout}: stride {stride} is not a multiple of "
                              f"{current} (the modes overlap)")
        shapes.append(stride // current)
        strides.append(current)
        current = size * stride
    shapes.append(max(1, -(-bound // current)))
    strides.append(current)
    return coalesce(Layout(tuple(shapes), tuple(strides)))


def logical_divide(layout: Layout, tiler: Layout) -> Layout:
    """``layout`` split into tiles of ``tiler``: mode 0 indexes inside a tile, mode 1 the
    tiles (``layout ∘ (tiler, complement(tiler, size(layout)))``)."""
    return composition(layout, make_layout(tiler, complement(tiler, layout.size)))


def logical_product(layout: Layout, repeat: Layout) -> Layout:
    """``layout`` repeated as ``repeat`` says: mode 0 is ``layout``, mode 1 places its copies
    (``complement(layout, size(layout) * cosize(repeat)) ∘ repeat``)."""
    rest = complement(layout, layout.size * repeat.cosize)
    return make_layout(layout, composition(rest, repeat))


__all__ = [
    "IntTuple",
    "Layout",
    "LayoutError",
    "coalesce",
    "column_major",
    "complement",
    "composition",
    "congruent",
    "flatten",
    "logical_divide",
    "logical_product",
    "make_layout",
    "product",
    "row_major",
]
