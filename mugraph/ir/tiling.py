"""Tiles as layouts: the one place where imap / omap / forloop_dim divide a device tensor.

A block graph runs ``grid`` blocks, each ``forloop_range`` iterations (:mod:`mugraph.ir.maps`
validates the maps and gives the tile shapes). Here the division itself is a layout
(:mod:`mugraph.ir.layout`): each dim of the tensor, ``extent : stride``, is split by
``logical_divide`` into the tile (innermost), the iterations, then the blocks of the grid axis
mapped to it (outermost) — the nesting ``maps`` documents. Every interpretation reads its tiles
from here and computes no offset of its own:

- the reference and field semantics view a tensor as ``(F, gx, gy, gz, *tile)`` through
  :func:`lead_modes` (:mod:`mugraph.semantics.partition`);
- the code generators place a block's and an iteration's tile from :func:`block_steps`
  (the same division over coordinates: the stride of a dim is then 1);
- the persistent task graph's tile dependencies are :func:`block_box` and
  :func:`blocks_meeting`;
- the lowered IR prints :func:`tile_division`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mugraph.ir import maps
from mugraph.ir.layout import Layout, logical_divide, make_layout, row_major

GridMap = tuple[int, int, int]
Box = tuple[tuple[int, int], ...]  # a half-open interval per tensor dim


@dataclass(frozen=True)
class DimDivision:
    """One dim of a tensor divided: ``tile`` (the tile's elements), ``iteration`` (one
    step per for-loop iteration) and ``block`` (one step per block of the grid axis mapped
    to the dim), each a single mode ``size : stride`` into the tensor's memory."""

    tile: Layout
    iteration: Layout
    block: Layout


@functools.lru_cache(maxsize=8192)
def divide_dim(extent: int, stride: int, tile: int, iterations: int) -> DimDivision:
    """A dim of ``extent`` elements at ``stride``, split into blocks, each block's part into
    ``iterations``, each of those into tiles of ``tile`` elements."""
    inner, rest = logical_divide(Layout(extent, stride), Layout(tile, 1)).modes()
    per_iteration, per_block = logical_divide(rest, Layout(iterations, 1)).modes()
    return DimDivision(inner, per_iteration, per_block)


@dataclass(frozen=True)
class TileDivision:
    """One block's tile of a device tensor in one iteration, as three layouts into the
    tensor's memory: ``tile`` (over the tile's coordinates), ``iteration`` (over for-loop
    iterations) and ``grid`` (over block coordinates x, y, z; stride 0 along an axis that
    replicates the tile). Element ``coord`` of block ``b``'s tile in iteration ``i`` lies at
    ``grid(b) + iteration(i) + tile(coord)``."""

    tile: Layout
    iteration: Layout
    grid: Layout

    def offset(self, block: tuple[int, int, int], iteration: int,
               coord: tuple[int, ...]) -> int:
        return self.grid(tuple(block)) + self.iteration(iteration) + self.tile(tuple(coord))

    def __str__(self) -> str:
        return f"tile {self.tile}  iteration {self.iteration}  block {self.grid}"


def tile_division(layout: Layout, tile: tuple[int, ...], grid: tuple[int, int, int],
                  grid_map: GridMap, forloop_range: int, forloop_dim: int) -> TileDivision:
    """The division of a device tensor of ``layout`` (one mode per dim) into the tiles an
    imap / omap (``grid_map``) and ``forloop_dim`` give each block and iteration."""
    dims = [divide_dim(mode.shape, mode.stride, tile[d],
                       forloop_range if d == forloop_dim else 1)
            for d, mode in enumerate(layout.modes())]  # fmt: skip
    per_axis = [dims[d].block if d >= 0 else Layout(g, 0)
                for g, d in zip(grid, grid_map, strict=True)]  # fmt: skip
    iteration = dims[forloop_dim].iteration if forloop_dim >= 0 else Layout(forloop_range, 0)
    return TileDivision(make_layout(*(d.tile for d in dims)), iteration, make_layout(*per_axis))


def input_division(op: str, dims: tuple[int, ...], strides: tuple[int, ...],
                   grid: tuple[int, int, int], imap: GridMap, forloop_range: int,
                   forloop_dim: int) -> TileDivision:
    """The tiles a block input reads from a tensor of ``dims`` at ``strides`` (MapError, naming
    ``op``, when a split does not divide)."""
    tile = maps.input_tile_dims(op, dims, grid, imap, forloop_range, forloop_dim)
    return tile_division(Layout(tuple(dims), tuple(strides)), tile, grid, imap, forloop_range,
                         forloop_dim)


def output_division(op: str, tile: tuple[int, ...], strides: tuple[int, ...] | None,
                    grid: tuple[int, int, int], omap: GridMap, forloop_range: int,
                    forloop_dim: int, accumulate: bool = False,
                    ) -> tuple[tuple[int, ...], TileDivision]:
    """(dims, division) of the tensor a block output assembles from tiles of ``tile``
    (stored row-major unless ``strides`` are given; ``accumulate``: the blocks the omap leaves
    out share their part)."""
    dims = maps.output_dims(op, tile, grid, omap, forloop_range, forloop_dim, accumulate)
    layout = row_major(dims) if strides is None else Layout(tuple(dims), tuple(strides))
    return dims, tile_division(layout, tile, grid, omap, forloop_range, forloop_dim)


# ---- the lead axes (F, gx, gy, gz) of a block value ---------------------------------------------


def lead_modes(division: TileDivision, grid_map: GridMap, forloop_dim: int) -> list[Layout]:
    """The modes of the axes (F, gx, gy, gz) in front of a block value's tile: the iteration
    and each grid axis, or ``1 : 0`` where the value is the same along the axis (no
    forloop_dim, an axis the map leaves out): NumPy broadcasting does the rest."""
    lead = [division.iteration if forloop_dim >= 0 else Layout(1, 0)]
    lead += [division.grid.mode(axis) if d >= 0 else Layout(1, 0)
             for axis, d in enumerate(grid_map)]  # fmt: skip
    return lead


# ---- offsets over coordinates: where a block's tile starts ----------------------------------


@dataclass(frozen=True)
class BlockSteps:
    """Per dim of a tensor, the coordinate steps that place one block's tile in one
    iteration: ``grid[d]`` lists ``(axis, step)`` for the grid axis mapped to dim ``d`` (block
    ``b`` along it starts at ``b * step``), ``iteration[d]`` is the step of one iteration (0
    where the for-loop does not walk dim ``d``)."""

    grid: tuple[tuple[tuple[int, int], ...], ...]
    iteration: tuple[int, ...]


@functools.lru_cache(maxsize=8192)
def block_steps(dims: tuple[int, ...], tile: tuple[int, ...], grid: tuple[int, int, int],
                grid_map: GridMap, forloop_range: int, forloop_dim: int) -> BlockSteps:
    """The division of each dim over coordinates (stride 1): the offsets a code generator
    multiplies by the tensor's run-time strides (arguments as tuples: the answer is cached)."""
    per_dim = [divide_dim(extent, 1, tile[d], forloop_range if d == forloop_dim else 1)
               for d, extent in enumerate(dims)]  # fmt: skip
    steps: list[list[tuple[int, int]]] = [[] for _ in dims]
    for axis, (g, d) in enumerate(zip(grid, grid_map, strict=True)):
        if d >= 0 and g > 1:
            steps[d].append((axis, _step(per_dim[d].block)))
    iteration = tuple(_step(per_dim[d].iteration) if d == forloop_dim else 0
                      for d in range(len(dims)))  # fmt: skip
    return BlockSteps(tuple(tuple(s) for s in steps), iteration)


def _step(mode: Layout) -> int:
    """The stride of a single-mode layout (0 for a mode of one element)."""
    return mode.stride if mode.size > 1 else 0


def block_box(dims: tuple[int, ...], grid: tuple[int, int, int], grid_map: GridMap,
              coords: tuple[int, int, int]) -> Box:
    """The part of a tensor of ``dims`` that the block at ``coords`` covers over all its
    iterations (a map never names one dim twice)."""
    box = [(0, extent) for extent in dims]
    for d, axes in enumerate(_part_steps(tuple(dims), grid, grid_map).grid):
        for axis, step in axes:
            box[d] = (coords[axis] * step, (coords[axis] + 1) * step)
    return tuple(box)


def blocks_meeting(dims: tuple[int, ...], grid: tuple[int, int, int], grid_map: GridMap,
                   box: Box) -> list[int]:
    """The blocks (linear index, x fastest) whose part of a tensor of ``dims`` meets ``box``."""
    ranges = [range(g) for g in grid]
    for d, axes in enumerate(_part_steps(tuple(dims), grid, grid_map).grid):
        for axis, step in axes:
            lo, hi = box[d]
            ranges[axis] = range(lo // step, (hi - 1) // step + 1)
    gx, gy, _ = grid
    return [x + gx * (y + gy * z) for z in ranges[2] for y in ranges[1] for x in ranges[0]]


@functools.lru_cache(maxsize=8192)
def _part_steps(dims: tuple[int, ...], grid: tuple[int, int, int],
                grid_map: GridMap) -> BlockSteps:
    """The steps of a block's part of ``dims`` over all its iterations."""
    part = maps.input_tile_dims("block part", dims, grid, grid_map, 1, -1)
    return block_steps(dims, part, grid, grid_map, 1, -1)


__all__ = [
    "BlockSteps",
    "Box",
    "DimDivision",
    "TileDivision",
    "block_box",
    "block_steps",
    "blocks_meeting",
    "divide_dim",
    "input_division",
    "lead_modes",
    "output_division",
    "tile_division",
]
