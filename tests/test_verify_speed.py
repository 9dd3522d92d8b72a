"""What the verifier does for speed never changes a value or reuses live memory: input memory
kept from round to round and call to call is taken again only when nothing refers to it;
large sums reordered and split over threads equal NumPy's; exponentials in large blocks over
threads equal the serial ones; a thread's work arrays are reused."""

from __future__ import annotations

import numpy as np
import pytest

from mugraph.library import WORKLOADS
from mugraph.search import verify as verify_module
from mugraph.search.verify import InputBuffers, input_buffers
from mugraph.semantics import field_arith as fa
from mugraph.semantics.field_arith import FieldContext, P


def test_input_buffers_are_reused_when_nothing_refers_to_them() -> None:
    buffers = InputBuffers()
    first = buffers.get(0, 1000, True, np.float64)
    again = buffers.get(0, 1000, True, np.float64)
    assert again[0] is first[0] and again[1] is first[1]


def test_input_buffers_are_not_reused_while_a_view_is_alive() -> None:
    buffers = InputBuffers()
    p, _ = buffers.get(0, 1000, False)
    view = p.reshape(10, 100)[2:]  # a value of an earlier round still held somewhere
    fresh, _ = buffers.get(0, 1000, False)
    assert fresh is not p and not np.shares_memory(fresh, view)
    address = fresh.__array_interface__["data"][0]
    del view, p, fresh
    assert buffers.get(0, 1000, False)[0].__array_interface__["data"][0] == address


def test_input_buffers_keep_only_what_the_last_call_used() -> None:
    buffers = InputBuffers()
    buffers.get(0, 100, False)
    buffers.keep_used(1 << 20)
    kept = buffers.get(1, 200, True)
    buffers.keep_used(1 << 20)
    assert buffers.get(1, 200, True)[0] is kept[0]
    assert buffers.nbytes == 2 * 200 * 8  # input 0 was not asked for in the last call
    buffers.keep_used(100)  # over the cap: everything goes
    assert buffers.nbytes == 0


def test_verify_calls_share_input_memory_and_give_the_same_results() -> None:
    work = WORKLOADS["rmsnorm_linear"]
    candidate, program = work.optimized(work.small), work.naive(work.small)
    shared = verify_module._SHARED_BUFFERS

    def addresses() -> dict:
        return {k: v[0].__array_interface__["data"][0] for k, v in shared._held.items()}

    first = verify_module.verify(candidate, program, 1e-9, seed=4)
    kept = addresses()
    assert kept  # kept from the call
    second = verify_module.verify(candidate, program, 1e-9, seed=4)
    assert addresses() == kept
    assert first.passed and second.passed and first.rounds == second.rounds


def test_a_second_thread_verifying_gets_its_own_buffers() -> None:
    with input_buffers() as outer, input_buffers() as inner:
        assert inner is not outer


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_large_sums_equal_numpy(workers: int) -> None:
    rng = np.random.default_rng(0)
    e = rng.integers(0, P, (4, 256, 2048))
    tiles = e.reshape(4, 8, 32, 16, 128).transpose(3, 0, 1, 2, 4)[:, :, None]
    cases = [(e, 2), (e, (0, 2)), (e, None), (tiles, 0), (tiles, (0, 5)), (e[:, :3, :5], 1)]
    with fa.parallel_evaluation(workers):
        for x, axis in cases:
            for keepdims in (False, True):
                got = fa.sum_mod(x, P, axis=axis, keepdims=keepdims)
                expect = np.sum(x, axis=axis, keepdims=keepdims, dtype=np.int64) % P
                assert got.shape == expect.shape
                np.testing.assert_array_equal(got, expect)


def test_exp_over_threads_equals_serial_and_powers() -> None:
    rng = np.random.default_rng(1)
    ctx = FieldContext.from_rng(rng)
    e = rng.integers(0, ctx.q, 3 * (1 << 16) + 5)
    serial = ctx._exp_p(e)
    with fa.parallel_evaluation(2):
        np.testing.assert_array_equal(ctx._exp_p(e), serial)
    some = rng.integers(0, e.size, 50)
    assert all(serial[i] == pow(ctx.omega, int(e[i]), ctx.p) for i in some)


def test_thread_scratch_is_kept() -> None:
    scratch = fa.thread_scratch()
    a = scratch.get("test", (10, 10))
    assert fa.thread_scratch() is scratch
    assert np.shares_memory(scratch.get("test", (5, 4)), a)


def test_large_results_reuse_memory_only_when_unused() -> None:
    recycler = fa._Recycler(keep=1 << 30)
    first = recycler.empty((512, 512))
    address = first.__array_interface__["data"][0]
    second = recycler.empty((512, 512))  # first is alive: fresh memory
    assert not np.shares_memory(first, second)
    view = first[3:, ::2]
    del first
    third = recycler.empty((256, 1024))  # a view of first is alive, second too
    assert not np.shares_memory(third, view) and not np.shares_memory(third, second)
    del view, third
    again = recycler.empty((1024, 256))
    assert again.__array_interface__["data"][0] == address  # the oldest unused one
    del second, again
    recycler.release()
    assert recycler._held == []
