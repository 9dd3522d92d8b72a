"""Which weights each task streams into L2 ahead of the level that reads them (``l2_stream``).

A decode step's projections read their weights once, from DRAM, and most of their levels wait
for those loads; the attention's levels between them read little. With ``l2_stream=d`` the
tasks of depth ``X - d`` (and, where that depth has fewer than :data:`MIN_ISSUERS` tasks, the
depths before it until it has) each issue one bulk L2 prefetch (``cp.async.bulk.prefetch.L2``:
one instruction of one thread, served by the copy engine, not the load path the task's own
loads and polls take) of an equal, contiguous piece of the weights the kernels of depth ``X``
read. The pieces of a level's weights follow one another, so together they cover every byte.

What counts as a weight (:func:`stream_regions`): a kernel input that is a graph input
attached to a user's tensor whose storage no kernel of the step writes (so not a KV cache),
of :data:`MIN_BYTES` to :data:`MAX_BYTES` (a norm's weight stays in L2 anyway; an LM head
larger than L2 would evict what it streams). This module only plans; the runtime writes the
plan into the task descriptors and the dispatcher issues it (:mod:`mugraph.persistent.codegen`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

from mugraph.errors import UnsupportedError
from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import TensorRef
from mugraph.persistent.tensors import Attached

SLOTS = 2  # ranges per task: descriptor fields (address, bytes) each
MIN_ISSUERS = 64  # a level's weights are split over at least this many tasks where there are
MIN_BYTES = 64 * 1024
MAX_BYTES = 16 * 1024 * 1024  # about a third of the H100's 50 MB L2
ALIGN = 16  # cp.async.bulk: the address and the size are multiples of 16 bytes
PIECE_ALIGN = 4096  # pieces start on 4 KB boundaries (a region's own ends excepted)

Range = tuple[int, int]  # (address, bytes)


def stream_regions(kernel, specs, names: Sequence[str] | None = None) -> dict[int, list[Range]]:
    """The weights each kernel reads (kernel op -> (address, bytes) of each), bytes rounded
    out to :data:`ALIGN`. ``specs``: the runtime's kernel specs (their static inputs);
    ``names``: where given, only the weights whose attached name matches one of these
    shell-style patterns (``"*.down_proj"``)."""
    graph = kernel.graph
    written = _written_storages(kernel)
    regions: dict[int, list[Range]] = {}
    for spec in specs:
        op = graph.ops[spec.op]
        found = []
        for i in sorted(spec.static_inputs):
            ref = op.inputs[i]
            binding = kernel.binding(ref)
            if not isinstance(binding, Attached) or _storage(binding.tensor) in written:
                continue
            if names is not None and not _named(kernel.handle(ref), names):
                continue
            t = graph.tensor_type(ref)
            extent = 1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides, strict=True))
            start = binding.tensor.data_ptr() + binding.offset * t.dtype.itemsize
            end = start + extent * t.dtype.itemsize
            start, end = start - start % ALIGN, -(-end // ALIGN) * ALIGN
            if MIN_BYTES <= end - start <= MAX_BYTES:
                found.append((start, end - start))
        if found:
            regions[spec.op] = found
    return regions


def _named(handle, patterns: Sequence[str]) -> bool:
    return handle is not None and any(fnmatchcase(handle.name, p) for p in patterns)


def _storage(tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _written_storages(kernel) -> set[int]:
    """Storages that a kernel of the step writes through an attached or row binding."""
    graph = kernel.graph
    written = set()
    for k, op in enumerate(graph.ops):
        if op.kind is not OpKind.CUSTOMIZED:
            continue
        for j in range(len(op.outputs)):
            binding = kernel.binding(TensorRef(k, j))
            tensor = getattr(binding, "tensor", None) or getattr(binding, "table", None)
            if tensor is not None:
                written.add(_storage(tensor))
    return written


def stream_plan(
    tasks: Sequence, regions: dict[int, list[Range]], ahead: int, slots: int = SLOTS,
    min_issuers: int = MIN_ISSUERS,
) -> dict[int, list[Range]]:
    """Task index -> the ranges it streams. ``tasks``: the task graph's tasks (``depth``,
    ``kernel``, ``program``: -1 for a continuation, which issues nothing); ``regions``: per
    kernel op, its weights (:func:`stream_regions`); ``ahead``: how many depths before its
    readers a weight is streamed. A task given more than ``slots`` ranges keeps the first."""
    if not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
        raise UnsupportedError(
            f"l2_stream: the depths ahead must be a positive int, got {ahead!r}"
        )
    by_depth: dict[int, list[int]] = defaultdict(list)
    for t in tasks:
        if t.program >= 0:
            by_depth[t.depth].append(t.index)
    targets: dict[int, list[Range]] = defaultdict(list)
    seen: set[Range] = set()
    for k, ranges in sorted(regions.items()):
        depth = min(t.depth for t in tasks if t.kernel == k)
        for r in ranges:
            if r not in seen:  # a tensor two kernels read is streamed once
                seen.add(r)
                targets[depth].append(r)
    plan: dict[int, list[Range]] = defaultdict(list)
    for depth, ranges in sorted(targets.items()):
        issuers = _issuers(by_depth, depth - ahead, min_issuers)
        for task, piece in zip(issuers, split_ranges(ranges, len(issuers)), strict=True):
            room = slots - len(plan[task])
            plan[task] += piece[:max(0, room)]
    return {task: ranges for task, ranges in plan.items() if ranges}


def _issuers(by_depth: dict[int, list[int]], depth: int, least: int) -> list[int]:
    """The tasks of ``depth``, then of the depths before it while fewer than ``least``."""
    found: list[int] = []
    while depth >= 0 and len(found) < least:
        found += by_depth.get(depth, [])
        depth -= 1
    return found


def split_ranges(ranges: Iterable[Range], parts: int) -> list[list[Range]]:
    """``ranges`` laid end to end and cut into ``parts`` pieces of about equal bytes, each
    cut on a :data:`PIECE_ALIGN` boundary of its range; a piece is the list of the (parts of)
    ranges it covers (empty where there is less to cut than pieces)."""
    ranges = list(ranges)
    if parts <= 0:
        return []
    total = sum(n for _, n in ranges)
    pieces: list[list[Range]] = [[] for _ in range(parts)]
    offset = 0  # of the range's start in the stream laid end to end
    for address, nbytes in ranges:
        at = 0
        while at < nbytes:
            p = min(parts - 1, (offset + at) * parts // total)
            cut = -(-(p + 1) * total // parts) - offset  # the piece's end, in this range
            cut = min(nbytes, -(-cut // PIECE_ALIGN) * PIECE_ALIGN)
            pieces[p].append((address + at, cut - at))
            at = cut
        offset += nbytes
    return pieces
