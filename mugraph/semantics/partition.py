"""How imap / forloop_dim split a device tensor into tiles, and omap / forloop_dim put tiles
back together, on NumPy arrays: strided views of the divisions :mod:`mugraph.ir.tiling` gives
(the same layouts the code generators and the persistent task graph read), shared by every
interpretation (reference floats, finite field) so the partitioning means one thing everywhere.

Block-level values are arrays of shape ``(F, gx, gy, gz, *tile)``: the for-loop iteration,
the three grid axes, then the tile. Any of the first four axes may have size 1 where the value
is the same along it (an input replicated over a grid axis, a value that does not change with
the iteration, an accumulator's result); NumPy broadcasting does the rest.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mugraph.ir import tiling

LEAD = 4  # (F, gx, gy, gz) axes in front of every block-level value


def split_input(
    array: np.ndarray,
    grid: tuple[int, int, int],
    imap: tuple[int, int, int],
    forloop_range: int,
    forloop_dim: int,
) -> np.ndarray:
    """Tiles of ``array`` as a view ``(F|1, gx|1, gy|1, gz|1, *tile)`` of its memory: the
    division :mod:`mugraph.ir.tiling` gives (the array's own strides are its layout, so a
    transposed or broadcast array divides without a copy)."""
    view = _input_view(array.shape, _element_strides(array), tuple(grid), tuple(imap),
                       forloop_range, forloop_dim)
    return _strided(array, view)


def assemble_output(
    value: np.ndarray,
    tile: tuple[int, ...],
    grid: tuple[int, int, int],
    omap: tuple[int, int, int],
    forloop_range: int,
    forloop_dim: int,
    accumulate: bool = False,
) -> np.ndarray:
    """The device tensor made of every block's (and, with forloop_dim, iteration's) tile,
    placed by the division :mod:`mugraph.ir.tiling` gives (a view of ``value`` where its
    memory is already in the tensor's order). ``accumulate``: ``value`` is already summed
    over the blocks the omap leaves out (one element along their axes)."""
    dims, shape, order = _output_order(tuple(tile), tuple(grid), tuple(omap), forloop_range,
                                       forloop_dim, accumulate)
    full = np.broadcast_to(value, shape)
    return np.ascontiguousarray(full.transpose(order)).reshape(dims)


View = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, element strides) of an array view


@functools.lru_cache(maxsize=4096)
def _input_view(shape, strides, grid, imap, forloop_range: int, forloop_dim: int) -> View:
    division = tiling.input_division("block input", shape, strides, grid, imap, forloop_range,
                                     forloop_dim)
    return _single_modes(tiling.lead_modes(division, imap, forloop_dim) + division.tile.modes())


@functools.lru_cache(maxsize=4096)
def _output_order(tile, grid, omap, forloop_range: int, forloop_dim: int, accumulate: bool):
    """(dims, the value's full shape, the order of its axes in the row-major tensor): its
    axes of several elements by decreasing stride in the division (compact, so the
    transposed value reshapes to the tensor), its axes of one element first."""
    dims, division = tiling.output_division("block output", tile, None, grid, omap,
                                            forloop_range, forloop_dim, accumulate)
    shape, strides = _single_modes(tiling.lead_modes(division, omap, forloop_dim)
                                   + division.tile.modes())  # fmt: skip
    order = sorted(range(len(shape)), key=lambda a: (shape[a] > 1, -strides[a]))
    return dims, shape, tuple(order)


def _single_modes(modes) -> View:
    return tuple(m.shape for m in modes), tuple(m.stride for m in modes)


def _element_strides(array: np.ndarray) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


def _strided(array: np.ndarray, view: View) -> np.ndarray:
    """The view of ``array``'s memory with one axis per (size, element stride)."""
    shape, strides = view
    return np.lib.stride_tricks.as_strided(
        array, shape=shape, strides=tuple(s * array.itemsize for s in strides)
    )


def broadcast_iterations(value: np.ndarray, forloop_range: int) -> np.ndarray:
    """View a block value with its iteration axis at full length (for accumulators)."""
    return np.broadcast_to(value, (forloop_range, *value.shape[1:]))


# ---- matrix products: batch axes folded into the free dims ---------------------------------------


@dataclass(frozen=True)
class MatmulLayout:
    """How a batched product ``a @ b`` (np.matmul broadcasting) becomes a smaller batch.

    Each batch axis (after padding both operands to ``ndim`` batch axes) is one of:
    ``batch`` (both operands vary along it: it stays a batch axis), ``rows`` (only ``a``
    varies: it joins a's row dim M), ``cols`` (only ``b`` varies: it joins b's column dim N)
    or ``unit`` (neither varies). ``rows`` and ``cols`` are listed outermost first: the order
    in which they join M and N (any order gives the same dot products).
    """

    ndim: int
    batch: tuple[int, ...]
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    unit: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def folds(self) -> bool:
        return bool(self.rows or self.cols)


def _outermost_first(axes: list[int], strides: Sequence[int] | None, pad: int) -> tuple[int, ...]:
    """``axes`` by decreasing |stride| in the operand (so that joining them to M or N is a view
    of its memory where it can be); in axis order without strides."""
    if strides is None:
        return tuple(axes)
    return tuple(sorted(axes, key=lambda axis: -abs(strides[axis - pad])))


def matmul_layout(
    a_shape: Sequence[int],
    b_shape: Sequence[int],
    a_strides: Sequence[int] | None = None,
    b_strides: Sequence[int] | None = None,
) -> MatmulLayout:
    """Classify the batch axes of ``a @ b`` (see :class:`MatmulLayout`); with the operands'
    strides, rows and columns are ordered as the operands' memory is."""
    ndim = max(len(a_shape), len(b_shape)) - 2
    pad_a, pad_b = ndim + 2 - len(a_shape), ndim + 2 - len(b_shape)
    ba = (1,) * pad_a + tuple(a_shape[:-2])
    bb = (1,) * pad_b + tuple(b_shape[:-2])
    groups: dict[str, list[int]] = {"batch": [], "rows": [], "cols": [], "unit": []}
    for axis, (x, y) in enumerate(zip(ba, bb, strict=True)):
        if x > 1 and y > 1:
            groups["batch"].append(axis)
        elif x > 1:
            groups["rows"].append(axis)
        elif y > 1:
            groups["cols"].append(axis)
        else:
            groups["unit"].append(axis)
    sizes = tuple(max(x, y) for x, y in zip(ba, bb, strict=True))
    return MatmulLayout(
        ndim,
        tuple(groups["batch"]),
        _outermost_first(groups["rows"], a_strides, pad_a),
        _outermost_first(groups["cols"], b_strides, pad_b),
        tuple(groups["unit"]),
        sizes,
    )


def _pad(x: np.ndarray, ndim: int) -> np.ndarray:
    """x with leading size-1 axes up to ``ndim`` batch axes (np.matmul broadcasting)."""
    return x.reshape((1,) * (ndim + 2 - x.ndim) + x.shape)


def _sizes(lay: MatmulLayout, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(lay.sizes[i] for i in axes)


def fold_rows(x: np.ndarray, lay: MatmulLayout) -> np.ndarray:
    """``a`` as (*batch, prod(rows)·M, K): its row axes joined in front of M (a view if it can)."""
    x = _pad(x, lay.ndim)
    m, k = x.shape[-2:]
    x = x.transpose(lay.batch + lay.cols + lay.unit + lay.rows + (lay.ndim, lay.ndim + 1))
    return x.reshape(_sizes(lay, lay.batch) + (math.prod(_sizes(lay, lay.rows)) * m, k))


def fold_cols(x: np.ndarray, lay: MatmulLayout) -> np.ndarray:
    """``b`` as (*batch, K, prod(cols)·N): its column axes joined in front of N."""
    x = _pad(x, lay.ndim)
    k, n = x.shape[-2:]
    x = x.transpose(lay.batch + lay.rows + lay.unit + (lay.ndim,) + lay.cols + (lay.ndim + 1,))
    return x.reshape(_sizes(lay, lay.batch) + (k, math.prod(_sizes(lay, lay.cols)) * n))


def unfold(c: np.ndarray, lay: MatmulLayout) -> np.ndarray:
    """The folded product (*batch, rows·M, cols·N) back as (*broadcast batch, M, N)."""
    m = c.shape[-2] // math.prod(_sizes(lay, lay.rows))
    n = c.shape[-1] // math.prod(_sizes(lay, lay.cols))
    c = c.reshape(
        (1,) * len(lay.unit)
        + _sizes(lay, lay.batch)
        + _sizes(lay, lay.rows)
        + (m,)
        + _sizes(lay, lay.cols)
        + (n,)
    )
    labels = lay.unit + lay.batch + lay.rows + (-2,) + lay.cols + (-1,)
    position = {label: i for i, label in enumerate(labels)}
    return c.transpose([position[a] for a in (*range(lay.ndim), -2, -1)])
