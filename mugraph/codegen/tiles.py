"""Index, mask and address expressions over padded register tiles (source text helpers).

A tile of true dims ``dims`` is held with padded dims ``pad`` (powers of two, see
:mod:`mugraph.codegen.padding`). Lane ``i`` of dim ``d`` is ``tl.arange(0, pad[d])`` broadcast
to the tile's rank; lanes with ``i >= dims[d]`` are padding and masked on every memory access.
"""

from __future__ import annotations

from collections.abc import Sequence

from mugraph.ir.tensor import contiguous_strides

AXES = "xyz"


def bcast_suffix(dim: int, rank: int) -> str:
    """``[:, None]``-style indexing that puts a 1-D vector at position ``dim`` of ``rank``."""
    if rank == 1:
        return ""
    parts = ["None"] * rank
    parts[dim] = ":"
    return "[" + ", ".join(parts) + "]"


def lane(dim: int, pad: Sequence[int], index64: bool = False) -> str:
    """The lane index of ``dim`` in a tile of padded shape ``pad``, broadcastable to it."""
    base = f"tl.arange(0, {pad[dim]})"
    if index64:
        base += ".to(tl.int64)"
    return base + bcast_suffix(dim, len(pad))


def valid_mask(
    dims: Sequence[int], pad: Sequence[int], only: Sequence[int] | None = None
) -> str | None:
    """``(lane < n) & ...`` over the padded dims (or just ``only``), None when nothing is padded."""
    picked = range(len(dims)) if only is None else only
    terms = [f"({lane(d, pad)} < {dims[d]})" for d in picked if pad[d] > dims[d]]
    return " & ".join(terms) if terms else None


def and_masks(*masks: str | None) -> str | None:
    parts = [m for m in masks if m]
    return " & ".join(f"({m})" if " & " in m else m for m in parts) if parts else None


def full_shape_term(pad: Sequence[int]) -> str | None:
    """A zero offset of the tile's full shape, needed when no lane term carries the shape."""
    if all(p == 1 for p in pad):
        return f"tl.zeros([{', '.join('1' for _ in pad)}], dtype=tl.int32)"
    return None


def offsets(
    pad: Sequence[int],
    strides: Sequence[str],
    base: Sequence[list[str]],
    shift: dict[int, int] | None = None,
    index64: bool = False,
) -> str:
    """Element offsets of a tile: ``sum_d (base_d + lane_d - shift_d) * stride_d``.

    ``base[d]`` lists scalar terms (block and iteration offsets) of dim ``d``; ``strides[d]``
    is a stride expression (a kernel argument or a literal). Where ``strides`` and ``base``
    have more dims than ``pad``, the first ones are dims of size 1 that the tile leaves out:
    only their scalar terms count (``shift`` is keyed by the tile's dims).
    """
    shift = shift or {}
    lead = len(strides) - len(pad)
    terms = []
    for d in range(lead):
        if base[d]:
            total = " + ".join(base[d])
            terms.append(total if strides[d] == "1" else f"({total}) * {strides[d]}")
    for d, p in enumerate(pad):
        parts = list(base[d + lead])
        if p > 1:
            index = lane(d, pad, index64)
            s = shift.get(d, 0)
            parts.append(index if not s else f"({index} - {s})" if s > 0 else f"({index} + {-s})")
        if parts:
            total = " + ".join(parts)
            stride = strides[d + lead]
            terms.append(total if stride == "1" else f"({total}) * {stride}")
    extra = full_shape_term(pad)
    if extra:
        terms.append(extra)
    return " + ".join(terms) if terms else "0"


def contiguous_offsets(
    dims: Sequence[int], pad: Sequence[int], shift: dict[int, int] | None = None, into=None
) -> str:
    """Offsets of a tile inside a dense row-major buffer of shape ``into`` (default ``dims``)."""
    target = tuple(into if into is not None else dims)
    strides = [str(s) for s in contiguous_strides(target)]
    lifted = {d: -s for d, s in (shift or {}).items()}
    return offsets(pad, strides, [[] for _ in pad], lifted)
