"""imap / omap / forloop_dim: validation and the tile shapes they imply.

A block graph runs ``grid_dim`` = (x, y, z) blocks, each executing ``forloop_range``
iterations. An input's imap gives, for grid axis x, y, z, the tensor dim split evenly across
the blocks along that axis (-1: every block sees the whole dim, i.e. replication). Its
forloop_dim is the dim each block's part is split into across iterations (-1: the same tile
every iteration). An output's omap gives, for each grid axis, the output dim along which the
blocks' tiles are concatenated; its forloop_dim concatenates the iterations' tiles (-1: the
tile is an accumulator's result, written once). An *accumulating* output (``accumulate``)
sums instead: the blocks along a grid axis its omap leaves out (-1) add their tiles into the
same part of the output (a split-K product whose partial products meet in one tensor; the
persistent kernel, the one code generator that emits it, keeps the sum in float32).

Within one tensor dim, the split is nested in the order grid axis, then for-loop: block b
takes the b-th contiguous chunk, and iteration i the i-th contiguous sub-chunk of it.
"""

from __future__ import annotations

from mugraph.errors import MapError

AXES = "xyz"
GridMap = tuple[int, int, int]


def normalize_grid(op: str, grid_dim: tuple[int, ...]) -> tuple[int, int, int]:
    grid = tuple(grid_dim) if isinstance(grid_dim, (tuple, list)) else ()
    if not 1 <= len(grid) <= 3 or any(not isinstance(g, int) or g < 1 for g in grid):
        raise MapError(f"{op}: grid_dim must be 1 to 3 positive ints, got {grid_dim!r}")
    return (*grid, *(1,) * (3 - len(grid)))  # type: ignore[return-value]


def normalize_map(op: str, name: str, grid_map: tuple[int, ...], rank: int) -> GridMap:
    """Check a 3-tuple map: every entry -1 or an existing dim, no dim named twice."""
    entries = tuple(grid_map) if isinstance(grid_map, (tuple, list)) else ()
    if len(entries) != 3 or any(not isinstance(e, int) or isinstance(e, bool) for e in entries):
        raise MapError(f"{op}: {name} must be a 3-tuple of ints (x, y, z), got {grid_map!r}")
    for axis, dim in zip(AXES, entries, strict=True):
        if not -1 <= dim < rank:
            raise MapError(
                f"{op}: {name} maps grid axis {axis} to dim {dim}, "
                f"which does not exist in a {rank}-d tensor"
            )
    named = [d for d in entries if d >= 0]
    if len(named) != len(set(named)):
        raise MapError(f"{op}: {name} {entries} maps two grid axes to the same dim")
    return entries  # type: ignore[return-value]


def summed_axes(grid: tuple[int, int, int], omap: GridMap) -> tuple[int, ...]:
    """The grid axes an accumulating output sums over: several blocks, left out of omap."""
    return tuple(axis for axis, (g, d) in enumerate(zip(grid, omap, strict=True))
                 if g > 1 and d < 0)  # fmt: skip


def check_forloop_dim(op: str, forloop_dim: int, rank: int) -> int:
    valid = isinstance(forloop_dim, int) and not isinstance(forloop_dim, bool)
    if not valid or not -1 <= forloop_dim < rank:
        raise MapError(
            f"{op}: forloop_dim {forloop_dim!r} does not exist in a {rank}-d tensor "
            f"(use -1 for none)"
        )
    return forloop_dim


def input_tile_dims(
    op: str,
    dims: tuple[int, ...],
    grid: tuple[int, int, int],
    imap: GridMap,
    forloop_range: int,
    forloop_dim: int,
) -> tuple[int, ...]:
    """The tile one block loads in one iteration; MapError when a split does not divide."""
    tile = list(dims)
    for axis, (g, dim) in enumerate(zip(grid, imap, strict=True)):
        if dim < 0:
            continue
        if tile[dim] % g:
            raise MapError(
                f"{op}: imap splits dim {dim} (size {dims[dim]}) over grid axis "
                f"{AXES[axis]} of size {g}, which does not divide it"
            )
        tile[dim] //= g
    if forloop_dim >= 0:
        if tile[forloop_dim] % forloop_range:
            raise MapError(
                f"{op}: forloop_range {forloop_range} does not divide dim {forloop_dim} "
                f"of the block's part (size {tile[forloop_dim]} of {dims[forloop_dim]})"
            )
        tile[forloop_dim] //= forloop_range
    return tuple(tile)


def output_dims(
    op: str,
    tile: tuple[int, ...],
    grid: tuple[int, int, int],
    omap: GridMap,
    forloop_range: int,
    forloop_dim: int,
    accumulate: bool = False,
) -> tuple[int, ...]:
    """The device tensor assembled from every block's (and iteration's) tile (with
    ``accumulate``, summed over the grid axes the omap leaves out)."""
    left_out = [axis for axis, (g, dim) in enumerate(zip(grid, omap, strict=True))
                if g > 1 and dim < 0]  # fmt: skip
    if accumulate and not left_out:
        raise MapError(
            f"{op}: an accumulating output sums the blocks along a grid axis that omap "
            f"{omap} leaves out (-1), but every grid axis of {grid} with several blocks is "
            f"mapped: there is nothing to sum"
        )
    if accumulate and forloop_dim >= 0:
        raise MapError(
            f"{op}: an accumulating output cannot also concatenate the for-loop's iterations "
            f"(forloop_dim={forloop_dim}): accumulate them first (forloop_accum)"
        )
    if left_out and not accumulate:
        axis = left_out[0]
        raise MapError(
            f"{op}: omap {omap} does not cover the output: grid axis {AXES[axis]} "
            f"has {grid[axis]} blocks but is mapped to no dim, so they would overwrite each "
            f"other (accumulate=True sums them instead)"
        )
    dims = list(tile)
    for g, dim in zip(grid, omap, strict=True):
        if dim >= 0:
            dims[dim] *= g
    if forloop_dim >= 0:
        dims[forloop_dim] *= forloop_range
    return tuple(dims)
