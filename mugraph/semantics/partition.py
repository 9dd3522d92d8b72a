"""How imap / forloop_dim split a device tensor into tiles, and omap / forloop_dim put tiles
back together: pure index manipulation on NumPy arrays, shared by every interpretation
(reference floats, finite field) so the partitioning means one thing everywhere.

Block-level values are arrays of shape ``(F, gx, gy, gz, *tile)``: the for-loop iteration,
the three grid axes, then the tile. Any of the first four axes may have size 1 where the value
is the same along it (an input replicated over a grid axis, a value that does not change with
the iteration, an accumulator's result); NumPy broadcasting does the rest.
"""

from __future__ import annotations

import numpy as np

LEAD = 4  # (F, gx, gy, gz) axes in front of every block-level value
_F = 0


def split_input(
    array: np.ndarray,
    grid: tuple[int, int, int],
    imap: tuple[int, int, int],
    forloop_range: int,
    forloop_dim: int,
) -> np.ndarray:
    """Tiles of ``array`` as an array ``(F|1, gx|1, gy|1, gz|1, *tile)`` (a view when possible)."""
    labels: list[int] = []  # lead position (0=F, 1..3=grid) or LEAD + dim for tile axes
    sizes: list[int] = []
    for dim, extent in enumerate(array.shape):
        rest = extent
        for axis, (g, mapped) in enumerate(zip(grid, imap, strict=True)):
            if mapped == dim:
                labels.append(1 + axis)
                sizes.append(g)
                rest //= g
        if forloop_dim == dim:
            labels.append(_F)
            sizes.append(forloop_range)
            rest //= forloop_range
        labels.append(LEAD + dim)
        sizes.append(rest)
    split = array.reshape(sizes)
    order = sorted(range(len(labels)), key=lambda i: labels[i])
    split = split.transpose(order)
    present = sorted(labels)
    for lead in range(LEAD):
        if lead not in present:
            split = np.expand_dims(split, lead)
    return split


def assemble_output(
    value: np.ndarray,
    tile: tuple[int, ...],
    grid: tuple[int, int, int],
    omap: tuple[int, int, int],
    forloop_range: int,
    forloop_dim: int,
) -> np.ndarray:
    """The device tensor made of every block's (and, with forloop_dim, iteration's) tile."""
    loops = forloop_range if forloop_dim >= 0 else 1
    full = np.broadcast_to(value, (loops, *grid, *tile))
    order: list[int] = []
    sizes: list[int] = []
    for dim, extent in enumerate(tile):
        size = extent
        for axis, (g, mapped) in enumerate(zip(grid, omap, strict=True)):
            if mapped == dim:
                order.append(1 + axis)
                size *= g
        if forloop_dim == dim:
            order.append(_F)
            size *= forloop_range
        order.append(LEAD + dim)
        sizes.append(size)
    # lead axes not mapped anywhere have size 1 (validated by omap checks): drop them
    dropped = [a for a in range(LEAD) if a not in order]
    arranged = full.transpose(dropped + order)
    arranged = arranged.reshape(arranged.shape[len(dropped):])
    return np.ascontiguousarray(arranged).reshape(sizes)


def broadcast_iterations(value: np.ndarray, forloop_range: int) -> np.ndarray:
    """View a block value with its iteration axis at full length (for accumulators)."""
    return np.broadcast_to(value, (forloop_range, *value.shape[1:]))
