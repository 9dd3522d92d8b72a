"""Tiles as layouts (mugraph.ir.tiling) against the maps' definition, enumerated by brute force.

:mod:`mugraph.ir.maps` defines a split: within one tensor dim, block ``b`` of the grid axis
mapped to it takes the ``b``-th contiguous chunk, iteration ``i`` the ``i``-th contiguous
sub-chunk of that. Every test here draws maps at random and checks the layouts (and the
interpretations built on them: the NumPy views of the semantics, the code generator's steps,
the persistent task graph's boxes) against that sentence.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from mugraph.errors import MapError
from mugraph.ir import tiling
from mugraph.ir.layout import Layout
from mugraph.semantics.partition import assemble_output, split_input

SEEDS = range(40)


def random_split(rng: random.Random):
    """(dims, grid, grid_map, forloop_range, forloop_dim, tile) with every split exact."""
    rank = rng.randint(1, 3)
    grid = [1, 1, 1]
    grid_map = [-1, -1, -1]
    dims, tile = [], []
    axes = rng.sample(range(3), 3)
    for _ in range(rank):
        dims.append(rng.choice([1, 2, 3, 4]))
        tile.append(dims[-1])
    for axis in axes[: rng.randint(0, min(rank, 3))]:
        d = rng.choice([d for d in range(rank) if d not in grid_map] or [None])
        if d is None:
            break
        g = rng.choice([2, 3])
        grid[axis], grid_map[axis] = g, d
        dims[d] *= g
    forloop_range, forloop_dim = 1, -1
    if rng.random() < 0.7:
        forloop_dim = rng.randrange(rank)
        forloop_range = rng.choice([2, 4])
        dims[forloop_dim] *= forloop_range
    return tuple(dims), tuple(grid), tuple(grid_map), forloop_range, forloop_dim, tuple(tile)


def coordinate(dims, grid, grid_map, forloop_range, forloop_dim, block, iteration, coord):
    """The tensor coordinate of tile element ``coord`` (the maps' sentence, literally)."""
    index = list(coord)
    for axis, d in enumerate(grid_map):
        if d >= 0:
            index[d] += block[axis] * (dims[d] // grid[axis])
    if forloop_dim >= 0:
        part = dims[forloop_dim] // (grid[grid_map.index(forloop_dim)]
                                     if forloop_dim in grid_map else 1)  # fmt: skip
        index[forloop_dim] += iteration * (part // forloop_range)
    return tuple(index)


def every_element(grid, forloop_range, tile):
    for block in itertools.product(*(range(g) for g in grid)):
        for iteration in range(forloop_range):
            for coord in itertools.product(*(range(t) for t in tile)):
                yield block, iteration, coord


@pytest.mark.parametrize("seed", SEEDS)
def test_a_division_places_every_tile_element_where_the_maps_say(seed):
    rng = random.Random(seed)
    dims, grid, grid_map, forloop_range, forloop_dim, tile = random_split(rng)
    strides = tuple(rng.choice([1, 2, 5, 7]) * (i + 1) for i in range(len(dims)))
    division = tiling.input_division("t", dims, strides, grid, grid_map, forloop_range,
                                     forloop_dim)  # fmt: skip
    for block, iteration, coord in every_element(grid, forloop_range, tile):
        at = coordinate(dims, grid, grid_map, forloop_range, forloop_dim, block, iteration, coord)
        want = sum(c * s for c, s in zip(at, strides, strict=True))
        assert division.offset(block, iteration, coord) == want


@pytest.mark.parametrize("seed", SEEDS)
def test_the_semantics_views_are_the_division(seed):
    """split_input reads, and assemble_output writes, exactly the division's elements, for a
    row-major, a transposed and a broadcast array."""
    rng = random.Random(seed)
    dims, grid, grid_map, forloop_range, forloop_dim, tile = random_split(rng)
    data = np.arange(int(np.prod(dims)), dtype=np.int64).reshape(dims)
    arrays = [data, np.ascontiguousarray(data.T).T]
    arrays.append(np.broadcast_to(data[..., :1], dims))
    for array in arrays:
        tiles = split_input(array, grid, grid_map, forloop_range, forloop_dim)
        assert np.shares_memory(tiles, array) or array.size == 0
        for block, iteration, coord in every_element(grid, forloop_range, tile):
            lead = (iteration if forloop_dim >= 0 else 0,
                    *(b if d >= 0 else 0 for b, d in zip(block, grid_map, strict=True)))
            at = coordinate(dims, grid, grid_map, forloop_range, forloop_dim, block, iteration,
                            coord)  # fmt: skip
            assert tiles[(*lead, *coord)] == array[at]
    # every block's tile, put back by an omap equal to the imap, is the tensor again
    tiles = split_input(data, grid, grid_map, forloop_range, forloop_dim)
    tiles = np.broadcast_to(tiles, (forloop_range, *grid, *tile)) if forloop_dim >= 0 else tiles
    if all(d >= 0 or g == 1 for g, d in zip(grid, grid_map, strict=True)):
        back = assemble_output(tiles, tile, grid, grid_map, forloop_range, forloop_dim)
        np.testing.assert_array_equal(back, data)


@pytest.mark.parametrize("seed", SEEDS)
def test_block_steps_are_the_division_over_coordinates(seed):
    rng = random.Random(seed)
    dims, grid, grid_map, forloop_range, forloop_dim, tile = random_split(rng)
    steps = tiling.block_steps(dims, tile, grid, grid_map, forloop_range, forloop_dim)
    for block, iteration, coord in every_element(grid, forloop_range, tile):
        origin = [0] * len(dims)
        for d, axes in enumerate(steps.grid):
            origin[d] += sum(block[axis] * step for axis, step in axes)
            origin[d] += iteration * steps.iteration[d]
        at = coordinate(dims, grid, grid_map, forloop_range, forloop_dim, block, iteration, coord)
        assert tuple(o + c for o, c in zip(origin, coord, strict=True)) == at


@pytest.mark.parametrize("seed", SEEDS)
def test_block_boxes_and_the_blocks_meeting_a_box(seed):
    rng = random.Random(seed)
    dims, grid, grid_map, _, _, _ = random_split(rng)
    blocks = list(itertools.product(*(range(g) for g in grid)))
    for block in blocks:
        box = tiling.block_box(dims, grid, grid_map, block)
        covered = {coordinate(dims, grid, grid_map, 1, -1, block, 0, c)
                   for c in itertools.product(*(range(d // _part(grid, grid_map, i))
                                                for i, d in enumerate(dims)))}  # fmt: skip
        assert covered == set(itertools.product(*(range(lo, hi) for lo, hi in box)))
    probe = tuple(sorted((rng.randrange(d), rng.randrange(d))) for d in dims)
    probe = tuple((lo, hi + 1) for lo, hi in probe)
    want = sorted(x + grid[0] * (y + grid[1] * z) for x, y, z in blocks
                  if _meets(tiling.block_box(dims, grid, grid_map, (x, y, z)), probe))
    assert sorted(tiling.blocks_meeting(dims, grid, grid_map, probe)) == want


def _part(grid, grid_map, d):
    return next((g for g, m in zip(grid, grid_map, strict=True) if m == d), 1)


def _meets(a, b) -> bool:
    return all(lo < h and l2 < hi for (lo, hi), (l2, h) in zip(a, b, strict=True))


def test_a_division_that_does_not_divide_names_the_operator():
    with pytest.raises(MapError, match="my_input: imap splits dim 1"):
        tiling.input_division("my_input", (4, 6), (6, 1), (4, 1, 1), (1, -1, -1), 1, -1)


def test_the_division_of_a_gqa_key_tensor_reads_as_layouts():
    """K of (2, 64, 4096) row-major, grid (2, 16) over dims 0 and 2, 4 iterations over dim
    2: a (1, 64, 64) tile, iterations 64 keys apart, blocks 256 keys apart."""
    division = tiling.input_division("K", (2, 64, 4096), (262144, 4096, 1), (2, 16, 1),
                                     (0, 2, -1), 4, 2)  # fmt: skip
    assert division.tile == Layout((1, 64, 64), (0, 4096, 1))
    assert division.iteration == Layout(4, 64)
    assert division.grid == Layout((2, 16, 1), (262144, 256, 0))
