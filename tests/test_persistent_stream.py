"""The plan of the weights each task streams into L2 (``l2_stream``): every byte of a level's
weights is covered once, by the tasks the right depths before it, in pieces the copy engine
takes (16-byte aligned), and never more ranges per task than its descriptor holds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mugraph.errors import UnsupportedError
from mugraph.persistent.stream import ALIGN, PIECE_ALIGN, split_ranges, stream_plan


def _tasks(levels: list[tuple[int, int, int]]) -> list[SimpleNamespace]:
    """``levels``: (depth, kernel op, tasks); programs round-robin over 8."""
    found = []
    for depth, kernel, count in levels:
        for _ in range(count):
            i = len(found)
            found.append(SimpleNamespace(index=i, depth=depth, kernel=kernel, program=i % 8))
    return found


def _covered(pieces) -> list[tuple[int, int]]:
    """The pieces' ranges merged where they touch."""
    merged: list[list[int]] = []
    for a, n in sorted(r for piece in pieces for r in piece):
        if merged and merged[-1][1] == a:
            merged[-1][1] = a + n
        else:
            assert not merged or merged[-1][1] < a, "pieces overlap"
            merged.append([a, a + n])
    return [(a, b - a) for a, b in merged]


@pytest.mark.parametrize("parts", [1, 3, 64, 256, 1000])
def test_split_ranges_covers_every_byte_once_in_aligned_pieces(parts):
    ranges = [(1 << 20, 4 << 20), (16 << 20, 2 << 20), (64 << 20, 48)]
    pieces = split_ranges(ranges, parts)
    assert len(pieces) == parts
    assert _covered(pieces) == [(a, n) for a, n in ranges]
    for piece in pieces:
        for a, n in piece:
            assert a % ALIGN == 0 and n % ALIGN == 0 and n > 0
    sizes = [sum(n for _, n in p) for p in pieces]
    total = sum(n for _, n in ranges)
    assert max(sizes) <= -(-total // parts) + 2 * PIECE_ALIGN  # about equal


def test_each_level_is_streamed_by_the_tasks_ahead_of_it():
    # depth 0: 70 tasks of kernel 1; depth 1: 8 of kernel 2 (few); depth 2: 100 of kernel 3
    tasks = _tasks([(0, 1, 70), (1, 2, 8), (2, 3, 100)])
    regions = {2: [(1 << 20, 1 << 20)], 3: [(8 << 20, 3 << 20), (16 << 20, 1 << 20)]}
    assert all(len(r) <= 2 for r in stream_plan(tasks, regions, ahead=1).values())  # SLOTS
    plan = stream_plan(tasks, regions, ahead=1, slots=4)  # room for all: nothing dropped
    depth = {t.index: t.depth for t in tasks}
    by_target = {2: [], 3: []}
    for task, ranges in plan.items():
        for a, n in ranges:
            target = 2 if a < 8 << 20 else 3
            by_target[target].append((depth[task], (a, n)))
    # kernel 2 (depth 1) by the 70 tasks of depth 0
    assert {d for d, _ in by_target[2]} == {0}
    assert _covered([[r for _, r in by_target[2]]]) == regions[2]
    # kernel 3 (depth 2): depth 1 has 8 tasks, fewer than 64, so depth 0 joins them
    assert {d for d, _ in by_target[3]} == {0, 1}
    assert _covered([[r for _, r in by_target[3]]]) == regions[3]
    two_ahead = stream_plan(tasks, regions, ahead=2)
    assert {depth[t] for t in two_ahead} == {0}  # kernel 3 by depth 0; kernel 2 by none


def test_continuations_stream_nothing_and_slots_cap_a_task():
    tasks = _tasks([(0, 1, 2), (1, 2, 2)])
    tasks[1].program = -1  # a continuation
    regions = {2: [(1 << 20, 4096), (2 << 20, 4096), (3 << 20, 4096)]}
    plan = stream_plan(tasks, regions, ahead=1, slots=2)
    assert list(plan) == [0] and len(plan[0]) == 2  # the third range is dropped
    plan = stream_plan(tasks, regions, ahead=1, slots=4)
    assert _covered([plan[0]]) == regions[2]


def test_a_tensor_two_kernels_read_is_streamed_once():
    tasks = _tasks([(0, 1, 4), (1, 2, 4), (2, 3, 4)])
    shared = (1 << 20, 8192)
    plan = stream_plan(tasks, {2: [shared], 3: [shared]}, ahead=1)
    assert _covered(plan.values()) == [shared]
    assert all(tasks[t].depth == 0 for t in plan)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "1"])
def test_stream_plan_refuses_a_bad_distance(bad):
    with pytest.raises(UnsupportedError, match="l2_stream"):
        stream_plan(_tasks([(0, 1, 1)]), {}, ahead=bad)
