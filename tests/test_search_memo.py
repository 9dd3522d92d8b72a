"""Continuations shared by the workers of one search (mugraph.search.memo): what one worker
computed another replays, a claimed key is waited for rather than computed twice, damaged or
foreign entries are never trusted, and sharing never changes the answer."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from mugraph.dtypes import DType
from mugraph.ir.tensor import TensorType
from mugraph.library import WORKLOADS
from mugraph.search import memo as memo_module
from mugraph.search.driver import superoptimize
from mugraph.search.memo import LocalMemo, SharedMemo, key_digest
from mugraph.semantics import abstract as ab

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("program-hash", (("max_custom_kernels", "2"),))


def memo_key(name: str = "in0"):
    """A key shaped like ``Enumerator.kernel_dfs``'s: tensors (type, labels, expression,
    uses), then counters."""
    expr = ab.add(ab.var(name), ab.var("in1"))
    labels = ((("i0.0", 4),), (("i0.1", 64),))
    tensor = (TensorType((4, 64), DType.float16, (64, 1)), labels, expr, 1)
    return ((tensor,), 1, 1, (3, (0, 1)), 6, 4, True)


def test_a_continuation_one_worker_computed_is_replayed_by_another(tmp_path):
    first, second = SharedMemo({}, tmp_path, SCOPE), SharedMemo({}, tmp_path, SCOPE)
    key, value = memo_key(), [(("op",), ("out",))]
    assert second.get(key) is None
    first.put(key, value)
    assert second.get(key) == value and second.shared_hits == 1
    assert second.get(key) == value and second.shared_hits == 1  # now in its own table


def test_a_damaged_or_foreign_entry_is_never_trusted(tmp_path):
    shared = SharedMemo({}, tmp_path, SCOPE)
    key, other = memo_key("in0"), memo_key("in2")
    path = tmp_path / f"{key_digest(SCOPE, key)}.pkl"
    path.write_bytes(pickle.dumps((other, ["someone else's continuation"])))
    assert shared.get(key) is None  # a file under this key's name that holds another key
    path.write_bytes(pickle.dumps((key, ["x"]))[:-7])
    assert shared.get(key) is None  # truncated
    path.write_bytes(b"not a pickle")
    assert shared.get(key) is None and shared.shared_hits == 0


def test_a_claimed_key_is_waited_for_not_computed_twice(tmp_path):
    owner, waiter = SharedMemo({}, tmp_path, SCOPE), SharedMemo({}, tmp_path, SCOPE)
    key, value = memo_key(), [("continuation",)]
    assert owner.claim(key)
    answers = []
    thread = threading.Thread(target=lambda: answers.append(waiter.claim(key)))
    thread.start()
    time.sleep(0.1)
    assert thread.is_alive()  # waiting for the owner
    owner.put(key, value)
    owner.release(key)
    thread.join(10)
    assert answers == [False] and waiter.get(key) == value and waiter.waits == 1
    assert not list(tmp_path.glob("*.claim"))


def test_a_key_finished_between_a_look_and_a_claim_is_not_computed_again(tmp_path):
    """A worker looks (no entry), the owner writes its entry and drops its claim, then the
    worker claims: the claim succeeds, but the entry is there, so the worker replays it
    rather than counting the continuation's states a second time (a 16-worker gqa_b1 search
    on the H100 machine counted 255 states more than the others, 2026-11-27)."""
    owner, late = SharedMemo({}, tmp_path, SCOPE), SharedMemo({}, tmp_path, SCOPE)
    key, value = memo_key(), [("continuation",)]
    assert owner.claim(key)
    assert late.get(key) is None  # the late worker's look, before the owner is done
    owner.put(key, value)
    owner.release(key)
    assert late.claim(key) is False and late.get(key) == value
    assert not list(tmp_path.glob("*.claim"))


def test_a_caller_told_a_key_is_claimed_may_go_on_with_other_work(tmp_path):
    """Before waiting for a claimed key, ``claim`` calls the caller's ``busy``: raising
    there goes elsewhere (counted as a hand-back, no wait); returning waits as before."""
    owner, other = SharedMemo({}, tmp_path, SCOPE), SharedMemo({}, tmp_path, SCOPE)
    key = memo_key()
    assert owner.claim(key)

    class Elsewhere(Exception):
        pass

    def go_elsewhere():
        raise Elsewhere

    with pytest.raises(Elsewhere):
        other.claim(key, None, go_elsewhere)
    assert other.counts()["memo_hand_backs"] == 1 and other.waits == 0
    asked = []
    threading.Timer(0.1, lambda: (owner.put(key, ["done"]), owner.release(key))).start()
    assert other.claim(key, None, lambda: asked.append(1)) is False  # waited, then read it
    assert asked == [1] and other.waits == 1 and other.counts()["memo_hand_backs"] == 1


def test_a_claim_left_by_a_dead_worker_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(memo_module, "CLAIM_WAIT_S", 0.05)
    dead, alive = SharedMemo({}, tmp_path, SCOPE), SharedMemo({}, tmp_path, SCOPE)
    key = memo_key()
    assert dead.claim(key)  # never released: its worker was killed
    started = time.monotonic()
    assert alive.claim(key) and time.monotonic() - started < 5
    alive.release(key)  # not its claim: the dead worker's file stays
    assert (tmp_path / f"{key_digest(SCOPE, key)}.claim").exists()
    assert alive.claim(key, deadline=time.monotonic() - 1)  # past the deadline: no wait


def test_without_sharing_every_key_is_computed_here():
    local = LocalMemo({})
    assert local.claim(memo_key()) and local.get(memo_key()) is None
    local.put(memo_key(), ["v"])
    assert local.get(memo_key()) == ["v"]


def test_key_names_do_not_depend_on_the_process_hash_seed():
    code = (
        "import sys; sys.path.insert(0, 'tests');"
        "from test_search_memo import SCOPE, memo_key;"
        "from mugraph.search.memo import key_digest; print(key_digest(SCOPE, memo_key()))"
    )
    names = set()
    for seed in ("1", "2", "3"):
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True,
            text=True,
        )  # fmt: skip
        names.add(out.stdout.strip())
    assert names == {key_digest(SCOPE, memo_key())}


@pytest.fixture(scope="module")
def gqa_small():
    workload = WORKLOADS["attention_mirage_gqa"]
    return workload.naive(workload.small)


def test_workers_sharing_continuations_find_what_one_worker_finds(gqa_small, monkeypatch, tmp_path):
    """A search of two kernels (the split-KV forms, whose combining kernels are continuations
    met from many first kernels) on one worker and on three that share them: same candidates
    in the same order; the memo directory is removed at the end."""
    options = {"max_block_ops": 6, "deepening": False, "time_limit": 200}
    alone = superoptimize(gqa_small, workers=1, **options)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = superoptimize(gqa_small, workers=3, **options)
    assert not alone.timed_out and not shared.timed_out
    assert alone.stats.pruned["memo_replay"] > 0
    assert [c.hash for c in shared.candidates] == [c.hash for c in alone.candidates]
    assert not list(tmp_path.glob("mugraph-memo-*"))


def test_a_continuation_that_cannot_be_pickled_stays_with_its_worker(tmp_path):
    first, second = SharedMemo({}, tmp_path, SCOPE), SharedMemo({}, tmp_path, SCOPE)
    value = [(lambda: None,)]  # a lambda does not pickle
    first.put(memo_key(), value)
    assert first.get(memo_key()) is value and second.get(memo_key()) is None
