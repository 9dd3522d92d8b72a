"""Text and pictures of task graphs (``mugraph show TASKS.json``).

The picture uses the layered layout of :mod:`mugraph.visualize`: tasks are boxes in rows by
depth, events are small boxes just above the tasks that wait for them, with an edge from each
producer to the event and from the event to each consumer (seed 003's picture of a task graph:
tasks and events, trigger edges and dependency edges). A graph with more than ``max_tasks``
tasks is drawn at kernel granularity instead: one box per kernel, with its task and block
counts, and an edge where a task of one waits for a task of the other.
"""

from __future__ import annotations

from mugraph.persistent.taskgraph import TaskGraph
from mugraph.visualize import (
    BLOCK_GAPS,
    MARGIN,
    TEXT_STYLES,
    Box,
    Edge,
    LayeredLayout,
    Layout,
    _box_size,
    _draw,
    _lines,
    _shift,
    text_width,
)

MAX_TASKS = 300


def render_text(tg: TaskGraph, max_lines: int = 60) -> str:
    """A summary, every kernel's tasks, and the head of each program's queue."""
    lines = [tg.summary()]
    if tg.world_size > 1:
        lines.append(f"rank {tg.rank} of {tg.world_size}")
    lines.append("kernels:")
    for k in tg.kernels:
        lines.append(
            f"  {k.label}: grid {k.grid}, {k.num_blocks} blocks in {k.num_tasks} tasks "
            f"(t{k.first_task}-t{k.first_task + k.num_tasks - 1})"
        )
    shown = 0
    for p, queue in enumerate(tg.queues):
        if shown >= max_lines:
            lines.append(f"  ... ({len(tg.queues) - p} more programs)")
            break
        lines.append(f"program {p}: {len(queue)} tasks")
        for t in queue[:4]:
            task = tg.tasks[t]
            wait = f"waits e{task.wait} ({tg.events[task.wait].count})" if task.wait >= 0 else "-"
            lines.append(f"    t{t} {tg.label(t)}: {wait}; triggers {_triggers(tg, task)}")
            shown += 1
        if len(queue) > 4:
            lines.append(f"    ... {len(queue) - 4} more")
    follow = sorted(tg.continuations)
    if follow:
        shown = ", ".join(f"t{t} {tg.label(t)}" for t in follow[:4])
        more = f" and {len(follow) - 4} more" if len(follow) > 4 else ""
        lines.append(f"continuations (run by their event's last producer): {shown}{more}")
    return "\n".join(lines)


def _triggers(tg: TaskGraph, task) -> str:
    """A task's events, each with the continuation its last producer runs (``e3->t9``)."""
    parts = []
    for e in task.triggers:
        follow = tg.events[e].continuation
        parts.append(f"e{e}->t{follow}" if follow >= 0 else f"e{e}")
    return ", ".join(parts) or "-"


def caption(tg: TaskGraph) -> str:
    return f"task graph: {len(tg.tasks)} tasks, {len(tg.events)} events, {tg.num_programs} programs"


def layout(tg: TaskGraph, max_tasks: int = MAX_TASKS) -> Layout:
    """Boxes and edges of the task graph (or of its kernels, when it is large)."""
    engine = LayeredLayout(*BLOCK_GAPS)
    texts: dict[str, tuple[str, list]] = {}
    if len(tg.tasks) <= max_tasks:
        _task_nodes(tg, engine, texts)
    else:
        _kernel_nodes(tg, engine, texts)
    engine.solve()
    top = MARGIN + TEXT_STYLES["caption"][1] + 12
    boxes = []
    for key, (kind, text) in texts.items():
        node = engine.nodes[key]
        boxes.append(
            Box(key, kind, node.x - node.w / 2 + MARGIN, node.y + top, node.w, node.h, text)
        )
    edges = [Edge(_shift(engine.route(link), MARGIN, top), "kernel") for link in engine.links]
    width = max(engine.width, text_width(caption(tg), "caption")) + 2 * MARGIN
    return Layout(width, engine.height + top + MARGIN, boxes, edges, [], caption(tg))


def _task_nodes(tg: TaskGraph, engine: LayeredLayout, texts: dict) -> None:
    for t in tg.tasks:
        where = f"program {t.program}" if t.program >= 0 else "continuation"
        text = _lines((f"t{t.index} {tg.label(t.index)}", "name"), (where, "type"))
        texts[f"t{t.index}"] = ("op", text)
        engine.add_node(f"t{t.index}", *_box_size(text), 2 * t.depth)
    for e in tg.events:
        depth = min(tg.tasks[c].depth for c in e.consumers)
        note = f"e{e.index}: {e.count}" + (
            f" ({len(e.remote_producers)} remote)" if e.remote_producers else ""
        )
        text = _lines((note, "note"))
        texts[f"e{e.index}"] = ("accum", text)
        engine.add_node(f"e{e.index}", *_box_size(text), 2 * depth - 1)
        for p in e.producers:
            engine.add_link(f"t{p}", f"e{e.index}")
        for c in e.consumers:
            engine.add_link(f"e{e.index}", f"t{c}")


def _kernel_nodes(tg: TaskGraph, engine: LayeredLayout, texts: dict) -> None:
    owner = {}
    depth = {}
    for k in tg.kernels:
        for t in range(k.first_task, k.first_task + k.num_tasks):
            owner[t] = k.op
        depth[k.op] = min(
            tg.tasks[t].depth for t in range(k.first_task, k.first_task + k.num_tasks)
        )
        text = _lines((k.label, "name"), (f"{k.num_tasks} tasks, {k.num_blocks} blocks", "type"))
        texts[f"k{k.op}"] = ("op", text)
        engine.add_node(f"k{k.op}", *_box_size(text), depth[k.op])
    links = set()
    for t in tg.tasks:
        for p in tg.dependencies(t.index):
            links.add((owner[p], t.kernel))
    for a, b in sorted(links):
        if depth[b] > depth[a]:
            engine.add_link(f"k{a}", f"k{b}")


def to_svg(tg: TaskGraph, max_tasks: int = MAX_TASKS) -> str:
    return _draw(layout(tg, max_tasks))
