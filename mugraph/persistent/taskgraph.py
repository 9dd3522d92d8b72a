"""The task graph of a persistent kernel: tasks, events, queues (after seed 003 §1.2.1).

From the kernel graph of a decode step (every operator a custom kernel), each kernel's blocks
are grouped into **tasks** (consecutive blocks, one task per group; a task runs on one
persistent program). Dependencies are computed at **tile** granularity: a block depends on
exactly the producer blocks whose output tile overlaps the region of the input it reads —
the region follows from the imap (and, for outputs, the omap) of the block graphs, so a
projection block that reads the rows of one token waits for the blocks that wrote those rows,
not for the whole previous kernel. A task depends on the union of its blocks' producers.

**Events** are counters: each task waits on at most one event (the set of tasks it depends
on, after dropping those that another dependency already implies — a transitive reduction),
and every task in an event's set adds one to it when done. Tasks with the same set share one
event. Under tensor parallelism an all-reduce task also depends on the tasks that produce its
tile on the other ranks (*remote producers*); those tasks trigger the event on every rank.

**Continuations**: a small task (at most ``continuation_bytes`` moved) that is the only
consumer of its event is not queued: the producer whose trigger completes the event (it learns
so from the atomic's old value) runs it at once, on its own program, and no program polls
for it (an attention combine after its partial products, say). The runtime builds them only
when asked (``continuations=True``): on the H100 they made the decode step slower.

**Queues**: tasks are ordered by depth (longest chain of dependencies), then kernel, then
block: a topological order. Each program runs its queue in that order, and every wait points
backwards in it, so a persistent launch with all programs resident cannot deadlock (the first
unfinished task in the global order always has its dependencies done; a continuation never
waits, its event is complete when it starts). Tasks are assigned to programs by list
scheduling on estimated times (bytes moved / bandwidth + an overhead).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from mugraph.errors import GraphStructureError, SerializationError, UnsupportedError
from mugraph.ir import tiling
from mugraph.ir.builder import KernelGraph
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import TensorRef

FORMAT = "mugraph-taskgraph"
VERSION = 1

Box = tiling.Box  # a half-open interval per tensor dim


# ---- tile regions ----------------------------------------------------------------------------


def block_coords(grid: tuple[int, int, int], linear: int) -> tuple[int, int, int]:
    """Block ``linear`` of a grid, x fastest (the order tasks group blocks in)."""
    gx, gy, _ = grid
    return linear % gx, (linear // gx) % gy, linear // (gx * gy)


def read_box(block: BlockGraph, input_op: Op, coords) -> Box:
    """The region of its kernel input that a block reads over all its for-loop iterations."""
    dtensor = input_op.attr("dtensor")
    return tiling.block_box(dtensor.dims, block.grid_dim, input_op.attr("imap"), coords)


def write_box(block: BlockGraph, output_index: int, out_dims, coords) -> Box:
    """The region of its kernel output that a block writes."""
    op = block.output_ops[output_index]
    return tiling.block_box(tuple(out_dims), block.grid_dim, op.attr("omap"), coords)


def overlapping_blocks(block: BlockGraph, output_index: int, out_dims, box: Box) -> list[int]:
    """The blocks of ``block``'s grid whose tile of output ``output_index`` meets ``box``."""
    omap = block.output_ops[output_index].attr("omap")
    return tiling.blocks_meeting(tuple(out_dims), block.grid_dim, omap, box)


# ---- the graph ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTasks:
    """One custom kernel's share of the task graph."""

    op: int
    label: str
    grid: tuple[int, int, int]
    num_blocks: int
    first_task: int
    num_tasks: int
    bytes_per_block: int

    def blocks(self, task: int) -> range:
        """The blocks of the kernel's ``task``-th task: the blocks are spread evenly (sizes
        differ by at most one)."""
        n, t = self.num_blocks, self.num_tasks
        return range(task * n // t, (task + 1) * n // t)

    def task_of(self, block: int) -> int:
        n, t = self.num_blocks, self.num_tasks
        return self.first_task + ((block + 1) * t + n - 1) // n - 1


@dataclass(frozen=True)
class Task:
    index: int
    kernel: int  # operator position of its kernel in the kernel graph
    first_block: int
    num_blocks: int
    depth: int
    program: int
    wait: int  # event index, -1 for none
    triggers: tuple[int, ...]  # events of this rank it adds one to
    remote_triggers: tuple[tuple[int, int], ...] = ()  # (rank, event) on other ranks
    # program is -1 for a continuation: it runs on the program of its event's last producer


@dataclass(frozen=True)
class Event:
    index: int
    producers: tuple[int, ...]  # local tasks that trigger it
    consumers: tuple[int, ...]
    remote_producers: tuple[tuple[int, int], ...] = ()  # (rank, task)
    continuation: int = -1  # the consumer its last producer runs (-1: none)

    @property
    def count(self) -> int:
        """How many triggers make the event fire (per step)."""
        return len(self.producers) + len(self.remote_producers)


@dataclass
class TaskGraph:
    num_programs: int
    kernels: list[KernelTasks]
    tasks: list[Task]
    events: list[Event]
    queues: list[list[int]]  # task indices per program, in execution order
    order: list[int]  # the global topological order
    rank: int = 0
    world_size: int = 1
    raw_dependencies: list[frozenset[int]] = field(default_factory=list, repr=False)

    def kernel(self, op: int) -> KernelTasks:
        for k in self.kernels:
            if k.op == op:
                return k
        raise KeyError(op)

    @property
    def continuations(self) -> frozenset[int]:
        """Tasks run by their event's last producer instead of from a queue."""
        return frozenset(e.continuation for e in self.events if e.continuation >= 0)

    @property
    def queued_order(self) -> list[int]:
        """The global order without the continuations (the one queue of topological mode)."""
        skip = self.continuations
        return [t for t in self.order if t not in skip]

    def dependencies(self, task: int) -> frozenset[int]:
        """The local tasks ``task`` waits for directly (its event's producers)."""
        w = self.tasks[task].wait
        return frozenset(self.events[w].producers) if w >= 0 else frozenset()

    def label(self, task: int) -> str:
        t = self.tasks[task]
        k = self.kernel(t.kernel)
        last = t.first_block + t.num_blocks - 1
        blocks = f"b{t.first_block}" if t.num_blocks == 1 else f"b{t.first_block}-{last}"
        return f"{k.label} {blocks}"

    def summary(self) -> str:
        waits = sum(1 for t in self.tasks if t.wait >= 0)
        triggers = sum(len(t.triggers) + len(t.remote_triggers) for t in self.tasks)
        depth = 1 + max((t.depth for t in self.tasks), default=-1)
        busiest = max((len(q) for q in self.queues), default=0)
        follow = len(self.continuations)
        return (
            f"task graph: {len(self.kernels)} kernels, {len(self.tasks)} tasks, "
            f"{len(self.events)} events ({waits} waits, {triggers} triggers), depth {depth}, "
            f"{self.num_programs} programs (longest queue {busiest})"
            + (f", {follow} continuations" if follow else "")
        )

    def check(self) -> None:
        """Every queue follows the global order and every wait points backwards in it; the
        queues hold every task but the continuations, exactly once."""
        position = {t: i for i, t in enumerate(self.order)}
        seen: list[int] = []
        for program, queue in enumerate(self.queues):
            for a, b in zip(queue, queue[1:], strict=False):
                if position[a] >= position[b]:
                    raise GraphStructureError(f"queue {program} is out of order at task {b}")
            seen += queue
        follow = self.continuations
        if len(seen) != len(set(seen)) or set(seen) != set(range(len(self.tasks))) - follow:
            raise GraphStructureError(
                "the queues do not hold every task but the continuations exactly once"
            )
        handing: set[int] = set()
        for e in self.events:
            if e.continuation < 0:
                continue
            if e.consumers != (e.continuation,) or e.remote_producers:
                raise GraphStructureError(
                    f"event e{e.index}: continuation t{e.continuation} is not its only, local "
                    "consumer"
                )
            if not handing.isdisjoint(e.producers):
                raise GraphStructureError(
                    f"event e{e.index}: a producer already completes another event with a "
                    "continuation (a task runs one continuation at most)"
                )
            handing.update(e.producers)
        for t in self.tasks:
            for p in self.dependencies(t.index):
                if position[p] >= position[t.index]:
                    raise GraphStructureError(
                        f"task {t.index} ({self.label(t.index)}) waits for a later task {p}"
                    )

    # ---- serialization --------------------------------------------------------------------

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "num_programs": self.num_programs,
            "rank": self.rank,
            "world_size": self.world_size,
            "kernels": [asdict(k) for k in self.kernels],
            "tasks": [asdict(t) for t in self.tasks],
            "events": [asdict(e) for e in self.events],
            "queues": self.queues,
            "order": self.order,
        }
        return json.dumps(doc, indent=1)

    @staticmethod
    def from_json(text: str) -> TaskGraph:
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise SerializationError(
                    f"not a task graph document (format {doc.get('format')!r})"
                )
            kernels = [KernelTasks(**{**k, "grid": tuple(k["grid"])}) for k in doc["kernels"]]
            tasks = [
                Task(
                    **{
                        **t,
                        "triggers": tuple(t["triggers"]),
                        "remote_triggers": tuple(tuple(r) for r in t["remote_triggers"]),
                    }
                )
                for t in doc["tasks"]
            ]
            events = [
                Event(
                    e["index"],
                    tuple(e["producers"]),
                    tuple(e["consumers"]),
                    tuple(tuple(r) for r in e["remote_producers"]),
                    e.get("continuation", -1),
                )
                for e in doc["events"]
            ]
            return TaskGraph(
                doc["num_programs"],
                kernels,
                tasks,
                events,
                doc["queues"],
                doc["order"],
                doc["rank"],
                doc["world_size"],
            )
        except SerializationError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise SerializationError(f"malformed task graph document: {error}") from None


def is_task_graph_document(text: str) -> bool:
    return f'"format": "{FORMAT}"' in text[:200]


# ---- construction ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """What the construction needs from a persistent kernel (or a bare kernel graph)."""

    graph: KernelGraph
    labels: dict[int, str]
    peers: dict[tuple[int, int], tuple[int, TensorRef]]  # input ref -> (rank, local source ref)
    rank: int
    world_size: int


def _source(obj) -> _Source:
    from mugraph.persistent.kernel import PersistentKernel
    from mugraph.persistent.parallel import Peer

    if isinstance(obj, KernelGraph):
        labels = {i: f"%{i}" for i, op in enumerate(obj.ops) if op.kind is OpKind.CUSTOMIZED}
        return _Source(obj, labels, {}, 0, 1)
    if not isinstance(obj, PersistentKernel):
        raise GraphStructureError(
            "build_task_graph: expected a PersistentKernel or KernelGraph, got "
            f"{type(obj).__name__}"
        )
    labels = {op: f"%{op} {role.label}" for op, role in obj.roles.items()}
    peers = {}
    for t in obj.tensors.values():
        if isinstance(t.binding, Peer):
            source = obj.tensor(t.binding.source).dtensor
            peers[(t.dtensor.ref.op, 0)] = (t.binding.rank, source.ref)
    return _Source(obj.graph, labels, peers, obj.rank, obj.world_size)


def _kernel_ops(graph: KernelGraph) -> list[int]:
    ops = []
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.CUSTOMIZED:
            ops.append(i)
        elif op.kind is not OpKind.INPUT:
            raise UnsupportedError(
                f"task graph: operator %{i} ({op.kind.value}) is a pre-defined kernel; a "
                "persistent kernel runs custom kernels only (write it as a block graph)"
            )
    if not ops:
        raise GraphStructureError("task graph: the kernel graph has no custom kernel")
    return ops


def _block_bytes(graph: KernelGraph, op: Op) -> int:
    """Bytes one block of a kernel reads and writes (tiles of every input and output)."""
    block: BlockGraph = op.attr("graph")
    total = 0
    for inp in block.input_ops:
        total += inp.attr("dtensor").dtype.itemsize * math.prod(
            hi - lo for lo, hi in read_box(block, inp, (0, 0, 0))
        )
    for t in op.outputs:
        total += t.num_bytes // block.num_blocks
    return total


class _Dependencies:
    """Block-level producer lookups, cached by (tensor, region)."""

    def __init__(self, graph: KernelGraph) -> None:
        self.graph = graph
        self.cache: dict[tuple[int, int, Box], tuple[int, ...]] = {}

    def producer_blocks(self, ref: TensorRef, box: Box) -> tuple[int, ...]:
        """Blocks (of the kernel producing ``ref``) whose output tile meets ``box``."""
        key = (ref.op, ref.index, box)
        if key not in self.cache:
            op = self.graph.ops[ref.op]
            if op.kind is OpKind.INPUT:
                self.cache[key] = ()
            else:
                block = op.attr("graph")
                dims = op.outputs[ref.index].dims
                self.cache[key] = tuple(overlapping_blocks(block, ref.index, dims, box))
        return self.cache[key]

    def block_reads(self, op_index: int, linear: int) -> list[tuple[int, TensorRef, Box]]:
        """(input position, tensor, region) of every input of one block."""
        op = self.graph.ops[op_index]
        block: BlockGraph = op.attr("graph")
        coords = block_coords(block.grid_dim, linear)
        return [
            (i, ref, read_box(block, inp, coords))
            for i, (ref, inp) in enumerate(zip(op.inputs, block.input_ops, strict=True))
        ]


def block_dependencies(graph: KernelGraph) -> dict[tuple[int, int], frozenset[tuple[int, int]]]:
    """For every block (kernel op, linear index): the producer blocks it depends on."""
    deps = _Dependencies(graph)
    out = {}
    for k in _kernel_ops(graph):
        block = graph.ops[k].attr("graph")
        for b in range(block.num_blocks):
            found = set()
            for _, ref, box in deps.block_reads(k, b):
                found.update((ref.op, p) for p in deps.producer_blocks(ref, box))
            out[(k, b)] = frozenset(found)
    return out


def kernel_depths(graph: KernelGraph, ops: list[int]) -> dict[int, int]:
    """Longest chain of custom kernels ending at each kernel (0 for those reading only inputs)."""
    depth: dict[int, int] = {}
    for k in ops:
        producers = [depth[r.op] for r in graph.ops[k].inputs if r.op in depth]
        depth[k] = 1 + max(producers, default=-1)
    return depth


def allocate_tasks(
    graph: KernelGraph,
    ops: list[int],
    num_programs: int,
    allocation: str,
    tasks_per_kernel: int | None = None,
    block_overhead_bytes: int = 0,
    level_programs: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """How many tasks each kernel gets.

    "kernel": up to ``tasks_per_kernel`` (default ``num_programs``) per kernel;
    "level": the kernels at one depth share ``num_programs`` tasks in proportion to what their
    blocks cost — the bytes they move plus ``block_overhead_bytes`` a block (a block's fixed
    time, as bytes) — so each program runs about one task per level (one wait, one trigger);
    where the level's blocks are no more than the programs, every block is a task. A kernel of
    small blocks counted by its bytes alone would get one task, whose blocks run one after
    another: the KV-cache append beside the attention partials (nineteenth session; its 8
    blocks in one task took 16.6 µs of a 17.4 µs level on the H100 when Qwen3-0.6B's
    attention level had 132 programs for 136 blocks, thirty-fourth session).
    ``level_programs`` maps a kernel depth to the programs its level runs on where that is not
    ``num_programs`` (under program sets, :func:`spread_levels`).
    """
    blocks = {k: graph.ops[k].attr("graph").num_blocks for k in ops}
    if allocation == "kernel":
        cap = tasks_per_kernel or num_programs
        return {k: min(blocks[k], cap) for k in ops}
    if allocation != "level":
        raise UnsupportedError(f"task allocation {allocation!r}: expected 'kernel' or 'level'")
    depth = kernel_depths(graph, ops)
    weight = {k: blocks[k] * (_block_bytes(graph, graph.ops[k]) + block_overhead_bytes)
              for k in ops}
    total: dict[int, int] = {}
    for k in ops:
        total[depth[k]] = total.get(depth[k], 0) + weight[k]
    level_blocks = _level_blocks(graph, ops, depth)
    programs = {d: (level_programs or {}).get(d, num_programs) for d in total}
    return {
        k: blocks[k]
        if level_blocks[depth[k]] <= programs[depth[k]]
        else max(1, min(blocks[k], round(programs[depth[k]] * weight[k] / total[depth[k]])))
        for k in ops
    }


def spread_levels(
    graph: KernelGraph, ops: list[int], set_programs: int, spread_blocks: int
) -> frozenset[int]:
    """The kernel depths whose levels run on every program although the programs form sets:
    those with more than ``spread_blocks`` blocks per program of one set (0: none).

    A set's program loads its next task's first tiles while the other set runs the level
    before; a task of many blocks streams the rest of them after its wait anyway, so such a
    level (the LM head: 72 blocks a task on one of Qwen3-0.6B's two sets) gains more from
    twice the programs streaming than from the head start (on the H100, thirty-eighth
    session: the step in 872 µs against 901 with two blocks loaded ahead).
    """
    if spread_blocks <= 0:
        return frozenset()
    level_blocks = _level_blocks(graph, ops, kernel_depths(graph, ops))
    return frozenset(d for d, n in level_blocks.items() if n > spread_blocks * set_programs)


def _level_blocks(graph: KernelGraph, ops: list[int], depth: Mapping[int, int]) -> dict[int, int]:
    """The blocks of the kernels at each kernel depth."""
    out: dict[int, int] = {}
    for k in ops:
        out[depth[k]] = out.get(depth[k], 0) + graph.ops[k].attr("graph").num_blocks
    return out


def build_task_graph(
    source,
    num_programs: int,
    *,
    allocation: str = "level",
    tasks_per_kernel: int | None = None,
    reduce: bool = True,
    continuation_bytes: int = 0,
    task_overhead_s: float = 2e-6,
    bandwidth_per_program: float = 2.5e10,
    program_sets: int = 1,
    set_layout: str = "halves",
    spread_blocks: int = 0,
) -> TaskGraph:
    """The task graph of a persistent kernel (or of any kernel graph of custom kernels).

    ``allocation`` decides how many tasks each kernel gets (:func:`allocate_tasks`); a
    kernel's blocks are spread evenly over its tasks. ``reduce`` drops dependencies implied by
    others before making events. A task moving at most ``continuation_bytes`` that is its
    event's only consumer becomes a continuation (0: none).

    ``program_sets`` (S > 1) splits the programs into S sets that take the levels in turn: the
    tasks at depth d run on set d % S only (the allocation counts num_programs / S programs a
    level). A program then has a whole level between its tasks, in which it loads its next
    task's tiles ahead of its wait, instead of the end of the previous level.
    ``set_layout``: "halves" (program p in set p * S // num_programs) or "interleaved"
    (p % S); which one puts every set on every SM depends on how the GPU places programs
    (``benchmarks/probe_sm_placement.py``: on the H100, "halves" nearly). With
    ``spread_blocks`` > 0, a kernel level of more than that many blocks per program of a set
    runs on every program instead (:func:`spread_levels`). Not the runtime's
    default: on the H100 (thirty-fourth session) S = 2 made both decoders' steps 1.27-1.66x
    slower, a task of a big level holding two or three blocks of which only the first loads
    before the wait (and the KV-cache append's 8 blocks in one task, which the allocation
    now spreads: :func:`allocate_tasks`); with two blocks loaded before the wait, and the LM
    head spread, Qwen3-0.6B's step still took 872 µs against 711 (thirty-eighth session).
    """
    if not isinstance(num_programs, int) or num_programs < 1:
        raise GraphStructureError(
            f"build_task_graph: num_programs must be >= 1, got {num_programs!r}"
        )
    sets = _program_sets(num_programs, program_sets, set_layout)
    if isinstance(spread_blocks, bool) or not isinstance(spread_blocks, int) or spread_blocks < 0:
        raise UnsupportedError(
            f"build_task_graph: spread_blocks must be an int >= 0, got {spread_blocks!r}"
        )
    src = _source(source)
    graph = src.graph
    ops = _kernel_ops(graph)
    spread = (
        spread_levels(graph, ops, num_programs // program_sets, spread_blocks)
        if program_sets > 1
        else frozenset()
    )
    counts = allocate_tasks(
        graph, ops, num_programs // program_sets, allocation, tasks_per_kernel,
        block_overhead_bytes=round(task_overhead_s * bandwidth_per_program),
        level_programs={d: num_programs for d in spread},
    )
    kernel_depth = kernel_depths(graph, ops)
    everywhere = frozenset(k for k in ops if kernel_depth[k] in spread)
    kernels: dict[int, KernelTasks] = {}
    first = 0
    for k in ops:
        op = graph.ops[k]
        block: BlockGraph = op.attr("graph")
        count = counts[k]
        kernels[k] = KernelTasks(
            k,
            src.labels.get(k, f"%{k}"),
            block.grid_dim,
            block.num_blocks,
            first,
            count,
            _block_bytes(graph, op),
        )
        first += count
    deps = _Dependencies(graph)
    task_sets: dict[tuple, frozenset[int]] = {}

    def producer_tasks(ref: TensorRef, box: Box) -> frozenset[int]:
        """The tasks whose blocks write part of ``box`` of ``ref`` (cached)."""
        key = (ref.op, ref.index, box)
        if key not in task_sets:
            kt = kernels.get(ref.op)
            blocks = deps.producer_blocks(ref, box) if kt else ()
            task_sets[key] = frozenset(kt.task_of(p) for p in blocks) if kt else frozenset()
        return task_sets[key]

    raw: list[set[int]] = []
    remote: list[set[tuple[int, int]]] = []
    owners: list[tuple[int, int, int]] = []  # (kernel op, first block, blocks)
    for k, kt in kernels.items():
        for t in range(kt.num_tasks):
            blocks = kt.blocks(t)
            local: dict[int, frozenset[int]] = {}  # distinct sets, by identity
            far: set[tuple[int, int]] = set()
            for b in blocks:
                for _, ref, box in deps.block_reads(k, b):
                    peer = src.peers.get((ref.op, ref.index))
                    found = producer_tasks(peer[1] if peer else ref, box)
                    if peer:
                        far.update((peer[0], p) for p in found)
                    else:
                        local[id(found)] = found
            raw.append(set().union(*local.values()))
            remote.append(far)
            owners.append((k, blocks.start, len(blocks)))
    depth = _depths(raw)
    kept = _transitive_reduction(raw) if reduce else [frozenset(s) for s in raw]
    order = sorted(range(len(raw)), key=lambda t: (depth[t], owners[t][0], t))
    events, waits, triggers, remote_triggers = _events(kept, remote, src)
    if continuation_bytes > 0:
        moved = {t: owners[t][2] * kernels[owners[t][0]].bytes_per_block for t in range(len(raw))}
        events = _with_continuations(events, moved, continuation_bytes)
    follow = {e.continuation for e in events if e.continuation >= 0}
    programs = _schedule(
        order, raw, owners, kernels, sets, task_overhead_s, bandwidth_per_program, follow, depth,
        everywhere,
    )
    tasks = [
        Task(
            t,
            owners[t][0],
            owners[t][1],
            owners[t][2],
            depth[t],
            programs[t],
            waits[t],
            tuple(sorted(triggers[t])),
            tuple(sorted(remote_triggers[t])),
        )
        for t in range(len(raw))
    ]
    queues: list[list[int]] = [[] for _ in range(num_programs)]
    for t in order:
        if t not in follow:
            queues[programs[t]].append(t)
    graph_out = TaskGraph(
        num_programs,
        list(kernels.values()),
        tasks,
        events,
        queues,
        order,
        src.rank,
        src.world_size,
        [frozenset(s) for s in raw],
    )
    graph_out.check()
    return graph_out


def _depths(raw: list[set[int]]) -> list[int]:
    depth = [0] * len(raw)
    for t, ds in enumerate(raw):  # producers always come first: kernels are in graph order
        depth[t] = 1 + max((depth[p] for p in ds), default=-1)
    return depth


def _transitive_reduction(raw: list[set[int]]) -> list[frozenset[int]]:
    """Each task's dependencies minus those another dependency already implies.

    Ancestor sets are bit sets (Python ints); the union of the ancestors of a dependency set
    is cached, since the tasks of one kernel mostly share theirs.
    """
    ancestors = [0] * len(raw)
    cache: dict[frozenset[int], tuple[int, frozenset[int]]] = {}
    kept: list[frozenset[int]] = []
    for t, ds in enumerate(raw):
        key = frozenset(ds)
        if key not in cache:
            implied = 0
            for p in key:
                implied |= ancestors[p]
            mine = sum(1 << p for p in key)
            cache[key] = (implied | mine, frozenset(p for p in key if not (implied >> p) & 1))
        ancestors[t], reduced = cache[key]
        kept.append(reduced)
    return kept


def _events(kept, remote, src: _Source):
    """One event per distinct dependency set (local and remote); waits and triggers."""
    index: dict[tuple[frozenset[int], frozenset[tuple[int, int]]], int] = {}
    producers: list[tuple[int, ...]] = []
    remote_producers: list[tuple[tuple[int, int], ...]] = []
    consumers: list[list[int]] = []
    waits = [-1] * len(kept)
    triggers: list[set[int]] = [set() for _ in kept]
    remote_triggers: list[set[tuple[int, int]]] = [set() for _ in kept]
    for t, ds in enumerate(kept):
        far = frozenset(remote[t])
        if not ds and not far:
            continue
        key = (ds, far)
        if key not in index:
            index[key] = len(producers)
            producers.append(tuple(sorted(ds)))
            remote_producers.append(tuple(sorted(far)))
            consumers.append([])
        e = index[key]
        waits[t] = e
        consumers[e].append(t)
        for p in ds:
            triggers[p].add(e)
        # the same tasks on the other ranks trigger this event; by symmetry of the rank
        # graphs, this rank's copies of them trigger event e on those ranks
        for rank, p in far:
            remote_triggers[p].add((rank, e))
    events = [
        Event(e, producers[e], tuple(consumers[e]), remote_producers[e])
        for e in range(len(producers))
    ]
    return events, waits, triggers, remote_triggers


def _with_continuations(events: list[Event], moved: dict[int, int], limit: int) -> list[Event]:
    """``events`` with their continuation set where the only consumer is local and moves at
    most ``limit`` bytes, and no producer already completes another event with one: a task
    hands its dispatcher one continuation at most (were it the last producer of two such
    events, the second continuation would never run)."""
    out = []
    handing: set[int] = set()  # tasks that trigger an event with a continuation
    for e in events:
        small = len(e.consumers) == 1 and moved[e.consumers[0]] <= limit
        if small and not e.remote_producers and handing.isdisjoint(e.producers):
            e = replace(e, continuation=e.consumers[0])
            handing.update(e.producers)
        out.append(e)
    return out


SET_LAYOUTS = ("halves", "interleaved")


def _program_sets(num_programs: int, sets: int, layout: str) -> list[list[int]]:
    """The programs of each set (see ``build_task_graph``'s ``program_sets``)."""
    if isinstance(sets, bool) or not isinstance(sets, int) or not 1 <= sets <= num_programs:
        raise UnsupportedError(
            f"build_task_graph: program_sets must be an int in [1, num_programs = "
            f"{num_programs}], got {sets!r}"
        )
    if layout not in SET_LAYOUTS:
        raise UnsupportedError(
            f"build_task_graph: set_layout must be one of {SET_LAYOUTS}, got {layout!r}"
        )
    if layout == "halves":
        return [[p for p in range(num_programs) if p * sets // num_programs == s]
                for s in range(sets)]
    return [list(range(s, num_programs, sets)) for s in range(sets)]


def _schedule(
    order, raw, owners, kernels, sets, overhead, bandwidth, follow, depth, everywhere=frozenset()
) -> list[int]:
    """List scheduling: each task (in order) goes to the program of its set (the set of its
    depth, in turn; one set of every program by default) free earliest; a task of a kernel in
    ``everywhere``, to the program of any set free earliest. A continuation (in ``follow``)
    takes no program: it starts when its producers are done (its program is -1)."""
    free = [[(0.0, p) for p in members] for members in sets]
    finish = [0.0] * len(raw)
    program = [0] * len(raw)
    for t in order:
        k, _, nb = owners[t]
        cost = overhead + nb * kernels[k].bytes_per_block / bandwidth
        ready = max((finish[p] for p in raw[t]), default=0.0)
        if t in follow:
            finish[t], program[t] = ready + cost, -1
            continue
        if k in everywhere:  # the earliest free program of all is the least of the sets' firsts
            heap = min((h for h in free if h), key=lambda h: h[0])
        else:
            heap = free[depth[t] % len(sets)]
        at, p = heapq.heappop(heap)
        start = max(at, ready)
        finish[t] = start + cost
        program[t] = p
        heapq.heappush(heap, (finish[t], p))
    return program


def task_ancestors(graph: TaskGraph) -> list[int]:
    """Per task, the bit set of the tasks its events make it wait for, transitively."""
    anc: list[int] = [0] * len(graph.tasks)
    for t in graph.order:
        bits = 0
        for p in graph.dependencies(t):
            bits |= anc[p] | (1 << p)
        anc[t] = bits
    return anc
