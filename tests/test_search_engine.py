"""The search engine's reliability: worker pools that cannot hang on the e-graph library
(whatever the start method), one result type for split programs, clear errors for search
options, splitting of work items, and fault tests with real processes and real signals
(a search killed with SIGINT or SIGKILL at a random point resumes from its checkpoint and ends
with the same result as one never interrupted)."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

import mugraph as mi
from mugraph.errors import MugraphError
from mugraph.search import pool as pool_module
from mugraph.search.config import default_config
from mugraph.search.driver import (
    SearchOptionError,
    _OracleAdapter,
    plan_units,
    program_terms,
    superoptimize,
)
from mugraph.search.generator import Stats
from mugraph.search.journal import CheckpointError, Journal
from mugraph.search.work import SearchSetup, WorkItem, run_item

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
# a search of about 2 s on one core: 60 units, 12 verified candidates
SMALL = {"max_custom_kernels": 1, "max_block_ops": 5}


def tiny_rmsnorm_linear():
    g = mi.new_kernel_graph()
    x = g.new_input((4, 64), dtype=mi.float32)
    w = g.new_input((64, 32), dtype=mi.float32)
    g.mark_output(g.matmul(g.rms_norm(x, 64), w))
    return g


def two_exps_program():
    g = mi.new_kernel_graph()
    x = g.new_input((8, 64), dtype=mi.float16)
    w = g.new_input((64, 64), dtype=mi.float16)
    g.mark_output(g.exp(g.exp(g.matmul(x, w))))
    return g


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted search every other run must agree with."""
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=1, **SMALL)
    assert not result.timed_out and result.candidates
    return result


def hashes(result):
    return [c.hash for c in result.candidates]


# ---- the hang: e-graphs freed in forked workers ------------------------------------------------


def _collect_in_child(queue) -> None:
    gc.collect()  # the old oracle left its e-graph to this: a forked child then hung here
    queue.put("collected")


def test_oracle_frees_its_egraph_before_a_fork_can_inherit_it():
    """The cause of the hangs: egglog leaves an e-graph that ran rules in a reference cycle,
    so the cyclic collector freed it later, anywhere: in a forked child that waits forever
    for rayon threads that exist only in the parent. The oracle now frees it at once."""
    ctx = multiprocessing.get_context("fork")
    gc.collect()
    gc.disable()  # nothing collects the oracle's garbage in this process before the fork
    try:
        oracle = _OracleAdapter(program_terms(tiny_rmsnorm_linear()))
        queue = ctx.Queue()
        child = ctx.Process(target=_collect_in_child, args=(queue,))
        child.start()
    finally:
        gc.enable()
    assert oracle.is_subexpr(program_terms(tiny_rmsnorm_linear())[0])
    child.join(30)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung and queue.get(timeout=1) == "collected"


@pytest.mark.parametrize("method", ["zygote", "exec", "fork", "spawn", "forkserver"])
def test_every_start_method_gives_the_same_answer(method, reference):
    available = [*multiprocessing.get_all_start_methods(), "exec"]
    if "fork" in available:
        available.append("zygote")
    if method not in available:
        pytest.skip(f"{method} is not available here")
    result = superoptimize(
        tiny_rmsnorm_linear(), time_limit=120, workers=2, start_method=method, **SMALL
    )
    assert result.engine == "local, 2 workers"
    assert not result.timed_out and hashes(result) == hashes(reference)
    assert result.stats.states == reference.stats.states


def test_zygote_workers_share_the_programs_rounds_and_a_dead_zygote_is_replaced(reference):
    """The default start: workers forked by the zygote hold the program's verification
    rounds when they say "ready"; when the zygote has died, the next search starts another,
    with the same answer."""
    pool_module.shutdown()
    first = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, **SMALL)
    assert any("forked holding 4-4 verification rounds" in line for line in first.log)
    pool = pool_module._SHARED["zygote"]
    tasks = Path(f"/proc/{pool._zygote.process.pid}/task")
    if tasks.is_dir():  # Linux: the zygote runs one thread (it forks)
        assert len(list(tasks.iterdir())) == 1
    pool._zygote.process.kill()
    pool._zygote.process.wait(10)
    again = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, **SMALL)
    assert hashes(first) == hashes(again) == hashes(reference)
    assert again.stats.states == reference.stats.states
    assert pool._zygote.alive()
    pool_module.shutdown()


def test_the_program_side_of_a_setup_draws_the_rounds_and_runs_no_item():
    """A setup's program side (sent while the driver builds the oracle) loads the program
    and draws its verification rounds; the complete setup of the same search then finds the
    same program with its rounds, and carries the oracle. No item runs on the program side."""
    from mugraph.search import work

    program = tiny_rmsnorm_linear()
    cfg = default_config(program).with_overrides(**SMALL)
    oracle = _OracleAdapter(program_terms(program))
    complete = SearchSetup("program-side-test", program.to_json(), cfg, oracle)
    side = complete.program_side()
    assert side.oracle is None and side.oracle_pending and side.token == complete.token
    assert work.prepare_rounds(side, 1) == cfg.verify_rounds > 0
    loaded, _, none = work.prepared(side)
    assert none is None
    again, config, kept_oracle = work.prepared(complete)
    assert again is loaded and kept_oracle is oracle and config is cfg
    assert work.rounds_held() == cfg.verify_rounds  # not drawn again
    (kernels, cap, choice), *_ = plan_units(program, cfg)
    with pytest.raises(MugraphError, match="oracle is not built"):
        run_item(side, WorkItem(kernels, cap, choice), time.monotonic() + 60)
    assert run_item(complete, WorkItem(kernels, cap, choice), time.monotonic() + 60).complete


def test_the_zygote_draws_the_rounds_while_the_driver_builds_the_oracle(monkeypatch, reference):
    """The zygote is sent the program side of the search before the oracle is built (it
    draws the program's rounds meanwhile), then the complete setup, with which it forks the
    workers: the answer is the one-worker search's."""
    pool_module.shutdown()
    events = []
    load, send = pool_module._Zygote.load, pool_module._Zygote._send_setup
    build = _OracleAdapter.__init__

    def loading(self, setup, hunger_path):
        events.append("program side" if setup.oracle_pending else "complete")
        load(self, setup, hunger_path)

    def sent(self, setup, hunger_path):
        if not setup.oracle_pending:
            events.append("complete")
        send(self, setup, hunger_path)

    def built(self, targets):
        build(self, targets)
        events.append("oracle")

    monkeypatch.setattr(pool_module._Zygote, "load", loading)
    monkeypatch.setattr(pool_module._Zygote, "_send_setup", sent)
    monkeypatch.setattr(_OracleAdapter, "__init__", built)
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, **SMALL)
    assert events == ["program side", "oracle", "complete"]
    assert hashes(result) == hashes(reference) and result.stats.states == reference.stats.states
    assert any("forked holding 4-4 verification rounds" in line for line in result.log)
    pool_module.shutdown()


SCRIPT_TWO_EXPS = """
import mugraph as mi
g = mi.new_kernel_graph()
x = g.new_input((8, 64), dtype=mi.float16)
w = g.new_input((64, 64), dtype=mi.float16)
g.mark_output(g.exp(g.exp(g.matmul(x, w))))
best = g.superoptimize(time_limit=4, workers=2, start_method={method!r})
print(type(best.search_result).__name__, len(best.search_result.parts))
print(best.verification.passed, best.search_result.summary().splitlines()[0])
"""


@pytest.mark.parametrize("method", ["zygote", "exec", "fork"])
def test_two_exponentials_with_two_workers_end(method):
    """Issue 15: exp(exp(X @ W)) with the default workers hung (a forked worker freed an
    e-graph inherited from the parent); with one worker the result had no summary."""
    script = SCRIPT_TWO_EXPS.format(method=method)
    done = subprocess.run(
        [sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kind, parts, passed, head = done.stdout.split(maxsplit=3)
    assert (kind, parts, passed) == ("SearchResult", "2", "True")
    assert "split into 2 subprograms" in head


def test_cli_optimizes_two_exponentials(tmp_path):
    program = tmp_path / "two_exps.py"
    program.write_text(
        textwrap.dedent("""
            import mugraph as mi

            def program():
                g = mi.new_kernel_graph()
                x = g.new_input((8, 64), dtype=mi.float16)
                w = g.new_input((64, 64), dtype=mi.float16)
                g.mark_output(g.exp(g.exp(g.matmul(x, w))))
                return g
        """)
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mugraph.cli",
            "optimize",
            str(program),
            "--time-limit",
            "4",
            "--out",
            str(out),
            "--no-progress",
        ],  # fmt: skip
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    search = json.loads((out / "search.json").read_text())
    assert "split into 2 subprograms" in search["summary"]
    assert (out / "best.json").exists()
    assert "by parts" in search["report"]["verification"]


SCRIPT_COMPILE_THEN_SEARCH = """
import gc, os
os.environ["TRITON_INTERPRET"] = "1"
import mugraph as mi
gc.set_threshold(50)  # collect often: whatever the parent left to collect is met at once
for i in range(2):
    g = mi.new_kernel_graph()
    x = g.new_input((8, 64), dtype=mi.float32)
    w = g.new_input((64, 64), dtype=mi.float32)
    g.mark_output(g.exp(g.matmul(x, w)))
    mi.compile(g)
    h = mi.new_kernel_graph()
    y = h.new_input((8, 64), dtype=mi.float32)
    h.mark_output(y)
    best = h.superoptimize(time_limit=20, workers=2, start_method="fork")
    print(i, best is h, best.search_result.summary().splitlines()[0], flush=True)
"""


def test_compile_then_search_of_an_identity_program_ends():
    """Issue 15: mugraph.compile then superoptimize of an identity program hung (the same
    cause: an e-graph of an earlier search freed in a forked worker's garbage collection)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_COMPILE_THEN_SEARCH],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(" True search complete" in line for line in lines)


# ---- options --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, float("nan"), float("inf"), "10", True])
def test_a_time_limit_that_allows_no_search_is_an_error(value):
    program = tiny_rmsnorm_linear()
    with pytest.raises(SearchOptionError, match=r"time_limit must be a positive number.*got"):
        program.superoptimize(time_limit=value)
    with pytest.raises(SearchOptionError, match=r"time_limit .* got " + repr(value)[:3]):
        superoptimize(program, time_limit=value)
    assert issubclass(SearchOptionError, MugraphError)


@pytest.mark.parametrize("value", [0, -1, 2.5])
def test_workers_must_be_a_positive_integer(value):
    with pytest.raises(SearchOptionError, match=f"workers must be a positive integer, got {value}"):
        superoptimize(tiny_rmsnorm_linear(), time_limit=5, workers=value)


BAD_SEARCH_OPTIONS = [
    ({"max_blocks": "x"}, "'max_blocks' must be a positive integer, got 'x'"),  # was a TypeError
    ({"delta": 2.0}, "'delta' must be a probability between 0 and 1, got 2.0"),
    ({"delta": "a"}, "'delta' must be a probability between 0 and 1, got 'a'"),
    ({"verify_rounds": 0}, "'verify_rounds' must be a positive integer, got 0"),
    ({"max_block_ops": -1}, "'max_block_ops' must be a positive integer, got -1"),
    ({"min_tile": 0}, "'min_tile' must be a positive integer, got 0"),
    ({"max_candidates": 0}, "'max_candidates' must be a positive integer, got 0"),
    ({"deepening": "no"}, "'deepening' must be True or False, got 'no'"),
    ({"max_grid_axes": 4}, "'max_grid_axes' must be 0, 1, 2 or 3, got 4"),
    ({"max_reread_bytes": -1}, "'max_reread_bytes' must be None or an integer >= 0"),
    ({"grid_sizes": (4, 0)}, "'grid_sizes' must be None or a tuple of positive integers"),
    ({"grid_sizes": ("a",)}, "'grid_sizes' must hold integers, got ('a',)"),
    ({"forloop_ranges": 4}, "'forloop_ranges' must be a sequence, got 4"),
    ({"block_kinds": {"matmul"}}, "'block_kinds' must be None or a frozenset of"),
    ({"accum_kinds": {mi.OpKind.MATMUL}}, "'accum_kinds' must be a frozenset of mugraph.ir.ops"),
]


@pytest.mark.parametrize(("options", "message"), BAD_SEARCH_OPTIONS,
                         ids=[repr(o) for o, _ in BAD_SEARCH_OPTIONS])
def test_a_search_option_value_no_search_can_use_is_refused(options, message):
    """Each once ran as a silently empty or broken search, or crashed inside it."""
    with pytest.raises(SearchOptionError, match=re.escape(message)):
        superoptimize(tiny_rmsnorm_linear(), time_limit=5, **options)
    with pytest.raises(SearchOptionError, match=re.escape(message)):
        tiny_rmsnorm_linear().superoptimize(time_limit=5, **options)


def test_every_search_config_field_has_a_rule_and_every_preset_keeps_them():
    from dataclasses import fields

    from mugraph.search.config import _FIELD_RULES, SearchConfig
    from mugraph.search.space import PRESETS

    assert {f.name for f in fields(SearchConfig)} == set(_FIELD_RULES)
    for preset in PRESETS:  # each makes a config its rules accept
        default_config(tiny_rmsnorm_linear(), preset)
    config = SearchConfig().with_overrides(grid_sizes=[2, 4.0], block_kinds=[mi.OpKind.MATMUL])
    assert config.grid_sizes == (2, 4) and config.block_kinds == frozenset({mi.OpKind.MATMUL})


def test_a_cache_path_that_is_a_file_is_refused_before_the_search(tmp_path):
    file = tmp_path / "cache_file"
    file.write_text("not a folder")
    started = time.monotonic()
    with pytest.raises(SearchOptionError, match="cache .*cache_file.* is a file, not a folder"):
        tiny_rmsnorm_linear().superoptimize(time_limit=60, cache=str(file))
    with pytest.raises(SearchOptionError, match="cache must be None, True, a directory"):
        tiny_rmsnorm_linear().superoptimize(time_limit=60, cache=5)  # was a TypeError
    assert time.monotonic() - started < 30  # refused at once (it used to warn after the search)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"config": "generic"}, "config must be a SearchConfig (a preset by name: preset=...)"),
    ({"progress": "yes"}, "progress must be True, False or a function of one line"),
    ({"checkpoint": 5}, "checkpoint must be None or a file path, got 5"),
    ({"cost": 5}, "cost must be a function of a kernel graph, got 5"),
])
def test_search_arguments_of_the_wrong_kind_are_refused(arguments, message):
    """Each failed inside with an AttributeError or a TypeError (a string progress printed)."""
    with pytest.raises(SearchOptionError, match=re.escape(message)):
        superoptimize(tiny_rmsnorm_linear(), time_limit=5, workers=1, **arguments)


def test_unknown_engine_or_start_method_is_an_error():
    with pytest.raises(MugraphError, match="engine must be 'local' or 'ray'"):
        superoptimize(tiny_rmsnorm_linear(), time_limit=5, engine="dask")
    with pytest.raises(MugraphError, match="start_method must be one of"):
        superoptimize(tiny_rmsnorm_linear(), time_limit=5, workers=2, start_method="thread")


def test_asking_for_ray_without_ray_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray has
    with pytest.raises(MugraphError, match=r"needs Ray: pip install 'mugraph\[cluster\]'"):
        superoptimize(tiny_rmsnorm_linear(), time_limit=5, engine="ray")


# ---- splitting work items ---------------------------------------------------------------------


def run_in_pieces(setup, unit: WorkItem, seed: int, due, before=None):
    """Run ``unit`` as workers would split it: each item asked ``due`` and its rest queued,
    items taken in a random order; returns the found candidates' hashes merged in DFS order,
    the statistics summed, and the (item, result) pairs. ``before`` runs before each item."""
    rng = random.Random(seed)
    pending, pieces, states, runs = [unit], {}, Stats(), []
    while pending:
        item = pending.pop(rng.randrange(len(pending)))
        if before is not None:
            before()
        result = run_item(setup, item, time.monotonic() + 120, due=due)
        assert not result.timed_out
        runs.append((item, result))
        pieces[item.region] = result.found
        states.merge(result.stats)
        pending += [item.part(r) for r in result.rest]
    merged = [c["hash"] for region in sorted(pieces) for c in pieces[region]]
    return merged, states, runs


def test_items_handed_back_at_every_step_merge_to_the_whole_unit(reference):
    """Each item stops as soon as it may; running every region handed back, in any order,
    finds the same candidates in the same DFS order and counts the same states."""
    program = tiny_rmsnorm_linear()
    cfg = default_config(program).with_overrides(time_limit=120, **SMALL)
    oracle = _OracleAdapter(program_terms(program))
    units = plan_units(program, cfg)
    setup = SearchSetup("split-test", program.to_json(), cfg, oracle)
    # the unit with the most states
    kernels, cap, choice = units[-1]
    whole = run_item(setup, WorkItem(kernels, cap, choice), time.monotonic() + 120)
    assert whole.complete
    merged, states, runs = run_in_pieces(setup, WorkItem(kernels, cap, choice), 15, lambda: True)
    assert len(runs) > 3  # it did split
    assert merged == [c["hash"] for c in whole.found]
    assert states.states == whole.stats.states


def test_the_rest_of_a_nodes_visits_goes_back_in_two_halves():
    """A node's remaining visits: a visit range (the first half), then the rest of the node
    with its children, then the later siblings; a visit range splits into two ranges, and a
    last single visit goes back alone."""
    from mugraph.search.generator import VISIT_OFFSET as OFF
    from mugraph.search.generator import Trail

    node = Trail(region=(2, 5 - OFF), due=lambda: True, stack=[2], sizes=[4])
    assert (node.path, node.base, node.resumes_at, node.visits_end) == ((2,), 1, 5, None)
    assert node.stop_visit(7, 12)
    assert node.rest == [(2, 7 - OFF, 10 - OFF), (2, 10 - OFF)]
    whole = Trail(region=(), due=lambda: True, stack=[2], sizes=[4])
    assert whole.stop_visit(11, 12) and whole.rest == [(2, 11 - OFF), (3,)]

    visits = Trail(region=(2, 7 - OFF, 10 - OFF), due=lambda: True, stack=[2], sizes=[4])
    assert (visits.path, visits.base, visits.resumes_at, visits.visits_end) == ((2,), 1, 7, 10)
    assert visits.stop_visit(8, 10)
    assert visits.rest == [(2, 8 - OFF, 9 - OFF), (2, 9 - OFF, 10 - OFF)]
    assert visits.stop_visit(9, 10) and visits.rest == [(2, 9 - OFF, 10 - OFF)]
    assert sorted([(2, 10 - OFF), (2, 7 - OFF, 10 - OFF), (2, 0), (3,)]) == [
        (2, 7 - OFF, 10 - OFF), (2, 10 - OFF), (2, 0), (3,)]  # DFS order
    assert not Trail(region=(2, 7 - OFF, 10 - OFF), due=lambda: False).stop_visit(8, 10)


def test_a_node_handed_back_between_two_visits_resumes_where_it_stopped():
    """Two-kernel GQA: an item asked to stop at every chance stops between two of the
    graphs a node's closing visits too (the node's continuations), handing back the rest of
    the node in two halves: a range of its visits, and a region that resumes the node after
    them; run in any order, the pieces find the same candidates in the same order and count
    the same states as the unit run whole."""
    from mugraph.library import WORKLOADS
    from mugraph.search import generator as generator_module
    from mugraph.search.generator import VISIT_OFFSET

    workload = WORKLOADS["attention_mirage_gqa"]
    program = workload.naive(workload.small)
    cfg = default_config(program).with_overrides(time_limit=200, max_block_ops=6, deepening=False)
    oracle = _OracleAdapter(program_terms(program))
    setup = SearchSetup("resume-test", program.to_json(), cfg, oracle)
    # a two-kernel unit with several candidates (the units' order is the plan's)
    kernels, cap, choice = plan_units(program, cfg)[69]
    generator_module._WORKER_MEMO.clear()
    whole = run_item(setup, WorkItem(kernels, cap, choice), time.monotonic() + 120)
    assert kernels == 2 and len(whole.found) >= 3
    generator_module._WORKER_MEMO.clear()
    merged, states, runs = run_in_pieces(setup, WorkItem(kernels, cap, choice), 5, lambda: True)
    # some node resumed after its first visit, and some node's visits went back in halves
    assert any(item.region and item.region[-1] + VISIT_OFFSET > 0 > item.region[-1]
               for item, _ in runs)  # fmt: skip
    ranges = [item.region for item, _ in runs if len(item.region) > 1 and item.region[-2] < 0]
    assert ranges and all(0 <= r[-2] + VISIT_OFFSET < r[-1] + VISIT_OFFSET for r in ranges)
    assert merged == [c["hash"] for c in whole.found]
    assert (states.states, states.block_graphs, states.candidates) == (
        whole.stats.states, whole.stats.block_graphs, whole.stats.candidates)


def test_an_item_hands_back_rather_than_wait_for_a_claimed_continuation(
    monkeypatch, tmp_path, reference
):
    """When every continuation an item needs is being computed by another worker, the item
    hands back the rest of its region (marked blocked, so the driver queues it behind other
    work) as soon as it has made progress, instead of waiting; the pieces, run in any order,
    find the same candidates in the same DFS order and count the same states."""
    from mugraph.search import generator as generator_module
    from mugraph.search import memo as memo_module

    def always_busy(memo, key, deadline, busy):
        if busy is not None:
            busy()  # raises when the item may hand back
        return True  # else: compute it here

    monkeypatch.setattr(memo_module.SharedMemo, "_claim", always_busy)
    monkeypatch.setattr(memo_module.SharedMemo, "_read", lambda memo, key: None)
    program = tiny_rmsnorm_linear()
    cfg = default_config(program).with_overrides(time_limit=120, **SMALL)
    oracle = _OracleAdapter(program_terms(program))
    kernels, cap, choice = plan_units(program, cfg)[-1]
    plain = SearchSetup("blocked-whole", program.to_json(), cfg, oracle)
    whole = run_item(plain, WorkItem(kernels, cap, choice), time.monotonic() + 120)
    setup = SearchSetup("blocked-test", program.to_json(), cfg, oracle, memo_dir=str(tmp_path),
                        memo_host=socket.gethostname())  # fmt: skip
    # nothing known before each item: every key is claimed
    merged, states, runs = run_in_pieces(setup, WorkItem(kernels, cap, choice), 3,
                                         lambda: False, generator_module._WORKER_MEMO.clear)
    # never hungry: only blocked hand-backs
    assert all(result.blocked == bool(result.rest) for _, result in runs)
    assert sum(result.blocked for _, result in runs) >= 2  # it did split
    assert merged == [c["hash"] for c in whole.found]
    assert states.states == whole.stats.states
    assert states.block_graphs == whole.stats.block_graphs


def test_busy_workers_hand_work_to_idle_ones_without_changing_the_answer(monkeypatch, reference):
    """With no minimum slice and the pool always saying that workers wait (this search takes
    a second: left to timing, both workers may finish together and nothing is handed back), a
    worker hands back the rest of every unit as soon as it has made progress: many regions
    travel between processes, and the answer and the counts stay the same."""
    monkeypatch.setattr(pool_module, "SLICE_SECONDS", 0.0)

    def always_hungry(pool, hungry):
        if pool._hunger is not None:
            pool._hunger[0] = 1
        pool._hungry = True

    monkeypatch.setattr(pool_module.ProcessPool, "set_hungry", always_hungry)
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, **SMALL)
    assert result.handed_back > 0 and "handed back" in result.summary()
    assert hashes(result) == hashes(reference)
    assert result.stats.states == reference.stats.states


def test_a_worker_slow_to_start_holds_up_nobody(monkeypatch, reference):
    """Exec'd workers take work as soon as each has loaded the search: with the second
    worker's interpreter held back 30 s before it imports anything, the first does the whole
    search, which ends without waiting for the other (stopped unused when the search ends)."""
    pool_module.shutdown()
    started = []

    class SecondSlow(subprocess.Popen):
        def __init__(self, command, **kwargs):
            if len(started) == 1:  # the second worker: sleep before becoming a worker
                boot = "import sys, time; time.sleep(30); from mugraph.search.pool import _main; "
                command = [command[0], "-c", boot + "_main(sys.argv[1:])", *command[3:]]
            started.append(self)
            super().__init__(command, **kwargs)

    monkeypatch.setattr(pool_module.subprocess, "Popen", SecondSlow)
    clock = time.monotonic()
    result = superoptimize(
        tiny_rmsnorm_linear(), time_limit=120, workers=2, start_method="exec", **SMALL
    )
    assert time.monotonic() - clock < 30
    assert len(started) == 2 and started[1].poll() is not None  # stopped, never used
    assert result.units_done == result.units_total and hashes(result) == hashes(reference)
    assert any("1 workers loaded the search" in line for line in result.log)
    pool_module.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_get_their_share_of_the_cores_for_blas(monkeypatch):
    """Each exec'd worker's BLAS gets cores / workers threads unless the user chose."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    pool = pool_module.ProcessPool(2, "exec")
    try:
        pool.start()
        for worker in pool.workers:
            path = Path(f"/proc/{worker.handle.pid}/environ")
            deadline = time.monotonic() + 30
            environ = path.read_bytes().split(b"\0")
            while not any(v.startswith(b"PYTHONPATH=") for v in environ):  # not exec'd yet
                assert time.monotonic() < deadline
                time.sleep(0.05)
                environ = path.read_bytes().split(b"\0")
            assert f"OPENBLAS_NUM_THREADS={pool.threads()}".encode() in environ
            assert b"MKL_NUM_THREADS=3" in environ
    finally:
        pool.shutdown()


@pytest.mark.parametrize("method", ["zygote", "exec"])
def test_a_worker_killed_mid_search_loses_no_unit(method, reference):
    """The local pool: SIGKILL one worker while it works; its items run again elsewhere."""
    killed = []

    def kill_one():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            shared = pool_module._SHARED.get(method)
            busy = [w for w in (shared.workers if shared else []) if w.batch]
            if busy:
                os.kill(busy[0].handle.pid, signal.SIGKILL)
                killed.append(busy[0].handle.pid)
            time.sleep(0.05)

    pool_module.shutdown()  # fresh workers, started by this search
    thread = threading.Thread(target=kill_one)
    thread.start()
    result = superoptimize(
        tiny_rmsnorm_linear(), time_limit=120, workers=2, start_method=method, **SMALL
    )
    thread.join()
    assert killed
    assert result.units_done == result.units_total and not result.failed_items
    assert hashes(result) == hashes(reference)
    assert any("retried" in line for line in result.log)


def _fail_on_one_unit(setup, item, deadline, due=None):
    if item.unit_key == FAILING_UNIT:
        raise RuntimeError("a bug in one unit")
    return _RUN_ITEM(setup, item, deadline, due)


_RUN_ITEM = run_item
FAILING_UNIT: str = ""


def test_an_error_in_a_worker_is_reported_and_the_search_goes_on(monkeypatch, reference):
    """A unit whose enumeration raises is retried, then reported and skipped; the others run.
    (The error is planted in forked workers: they inherit this module's patch.)"""
    from mugraph.search import work

    program = tiny_rmsnorm_linear()
    cfg = default_config(program).with_overrides(**SMALL)
    units = plan_units(program, cfg)
    monkeypatch.setattr(sys.modules[__name__], "FAILING_UNIT", WorkItem(*units[0]).unit_key)
    monkeypatch.setattr(work, "run_item", _fail_on_one_unit)
    result = superoptimize(program, time_limit=60, workers=2, start_method="fork", **SMALL)
    # only the unit that raised is charged: units batched with it are not lost with it
    assert result.failed_items == [WorkItem(*units[0]).key]
    assert result.units_done == result.units_total - 1
    assert "work items lost" in result.summary()
    assert any("a bug in one unit" in line for line in result.log)


# ---- the checkpoint journal ---------------------------------------------------------------


def test_journal_drops_a_torn_last_record_and_reports_a_damaged_one(tmp_path):
    path = tmp_path / "search.ckpt"
    journal = Journal.open(path, "key")
    for i in range(3):
        journal.append({"unit": f"u{i}", "region": [], "found": []})
    journal.close()
    text = path.read_text()
    path.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 12])  # tear the last record
    journal = Journal.open(path, "key")
    assert [r["unit"] for r in journal.records] == ["u0", "u1"]
    journal.close()
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"u0"', '"u9"')  # a flipped byte: its checksum fails
    path.write_text("".join(lines))
    with pytest.warns(UserWarning, match="line 2 is damaged"):
        journal = Journal.open(path, "key")
    assert journal.records == []
    journal.close()


def test_journal_refuses_a_foreign_file_and_restarts_for_another_search(tmp_path):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes\n")
    with pytest.raises(CheckpointError, match="not a mugraph search checkpoint"):
        Journal.open(foreign, "key")
    assert foreign.read_text() == "my notes\n"
    path = tmp_path / "search.ckpt"
    Journal.open(path, "one").close()
    with pytest.warns(UserWarning, match="another program or search space"):
        journal = Journal.open(path, "two")
    journal.close()


def test_journal_is_for_one_search_at_a_time(tmp_path):
    path = tmp_path / "search.ckpt"
    first = Journal.open(path, "key")
    with pytest.raises(CheckpointError, match="in use by another search"):
        Journal.open(path, "key")
    first.close()


# ---- fault tests: real processes, real signals --------------------------------------------------

SCRIPT_SEARCH = """
import signal
import sys
# Ctrl-C raises KeyboardInterrupt even where this process inherited SIGINT ignored (a
# suite started in the background of a non-interactive shell: POSIX has such jobs ignore it)
signal.signal(signal.SIGINT, signal.default_int_handler)
import mugraph as mi
from mugraph.search.driver import superoptimize
g = mi.new_kernel_graph()
x = g.new_input((4, 64), dtype=mi.float32)
w = g.new_input((64, 32), dtype=mi.float32)
g.mark_output(g.matmul(g.rms_norm(x, 64), w))
def progress(line):
    print(line, flush=True)
result = superoptimize(g, time_limit=120, workers=2, max_custom_kernels=1, max_block_ops=5,
                       checkpoint=sys.argv[1], progress=progress)
print("RESULT", result.interrupted, result.resumed_units, result.units_done,
      result.units_total, ",".join(c.hash for c in result.candidates), flush=True)
"""


def _search(checkpoint: Path, stop_after_units: int | None = None, sig=None, seed=0):
    """Run SCRIPT_SEARCH; with ``sig``, send it once ``stop_after_units`` units are reported
    done (plus a random delay). Returns (exit code, the RESULT line or None)."""
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT_SEARCH, str(checkpoint)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result_line = None
    rng = random.Random(seed)
    try:
        for line in process.stdout:
            if line.startswith("RESULT"):
                result_line = line.split()
            elif sig is not None and " units " in line:
                done = int(line.split(" units ")[1].split("/")[0])
                if done >= stop_after_units:
                    time.sleep(rng.uniform(0, 0.05))
                    process.send_signal(sig)
                    sig = None
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, result_line


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_search_stopped_by_a_signal_resumes_to_the_same_result(sig, reference, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    total = reference.units_total
    stop_after = rng.randrange(1, total - 20)
    checkpoint = tmp_path / "search.ckpt"
    code, line = _search(checkpoint, stop_after, sig, seed)
    context = f"seed {seed}, signal {sig.name} after {stop_after}/{total} units"
    if sig is signal.SIGKILL:
        assert code == -signal.SIGKILL and line is None, context
    elif line is not None:  # SIGINT: the search stops, keeps what it found and says so
        assert line[1] == "True", f"{context}: {' '.join(line[:5])}"
    code, line = _search(checkpoint)
    assert code == 0 and line is not None, context
    _, interrupted, resumed, done, units, found = line
    assert interrupted == "False", context
    assert int(resumed) >= stop_after and int(done) == int(units) == total, context
    assert found.split(",") == hashes(reference), context


def test_a_checkpoint_left_by_a_finished_search_gives_its_answer_at_once(reference, tmp_path):
    checkpoint = tmp_path / "search.ckpt"
    first = superoptimize(
        tiny_rmsnorm_linear(), time_limit=120, workers=1, checkpoint=checkpoint, **SMALL
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = superoptimize(
            tiny_rmsnorm_linear(), time_limit=120, workers=2, checkpoint=checkpoint, **SMALL
        )
    assert again.resumed_units == again.units_total == first.units_total
    assert hashes(again) == hashes(first) == hashes(reference)
    assert again.stats.states == first.stats.states


# ---- the plan, streamed: workers run the first units while the rest are planned ---------------


def _planned_in_pieces(monkeypatch, size: int = 7, pause: float = 0.05, fail_after: int = -1):
    """Have the search's planner hand its units over ``size`` at a time, ``pause`` seconds
    apart (after ``fail_after`` pieces, an error instead); returns the pieces' hand-over
    times."""
    from mugraph.search import driver

    planned = driver.plan_chunks
    times: list[float] = []

    def in_pieces(program, cfg, deadline=None):
        units = [u for chunk in planned(program, cfg, deadline) for u in chunk]
        for n, start in enumerate(range(0, len(units), size)):
            if n == fail_after:
                raise RuntimeError("the planner broke")
            if n:
                time.sleep(pause)
            times.append(time.monotonic())
            yield units[start : start + size]

    monkeypatch.setattr(driver, "plan_chunks", in_pieces)
    return times


def test_the_plan_comes_one_list_of_units_per_kernel_count():
    program = tiny_rmsnorm_linear()
    cfg = default_config(program).with_overrides(max_custom_kernels=2, max_block_ops=4)
    from mugraph.search.driver import plan_chunks

    chunks = list(plan_chunks(program, cfg))
    assert [{kernels for kernels, _, _ in chunk} for chunk in chunks] == [{1}, {2}]
    assert [u for chunk in chunks for u in chunk] == plan_units(program, cfg)


@pytest.mark.parametrize("workers", [1, 2])
def test_units_run_while_the_rest_are_planned_and_the_answer_stays(
    monkeypatch, reference, workers
):
    times = _planned_in_pieces(monkeypatch)
    clock = time.monotonic()
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=workers, **SMALL)
    assert result.units_done == result.units_total == reference.units_total
    assert hashes(result) == hashes(reference)
    assert result.stats.states == reference.stats.states
    assert len(times) > 5 and any(line.startswith("planned 60 units") for line in result.log)
    # the first item began before the planner handed over its last units
    assert clock + result.first_work[0] < times[-1]
    assert list(result.phases)[:3] == ["engine", "oracle", "plan"]
    if workers > 1:  # the zygote's workers: when they were ready, the zygote's clock
        (started,) = [line for line in result.log if "workers loaded the search" in line]
        assert " s into the search (the zygote ran at " in started
        assert re.search(r"got its setup at [\d.]+ s, had drawn the rounds at [\d.]+ s\)", started)


def test_a_search_stopped_while_planning_resumes_to_the_same_result(
    monkeypatch, reference, tmp_path
):
    checkpoint = tmp_path / "search.ckpt"
    _planned_in_pieces(monkeypatch, pause=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = superoptimize(
            tiny_rmsnorm_linear(), time_limit=1.0, workers=1, checkpoint=checkpoint, **SMALL
        )
    assert first.timed_out and first.units_total < reference.units_total
    monkeypatch.undo()
    again = superoptimize(
        tiny_rmsnorm_linear(), time_limit=120, workers=2, checkpoint=checkpoint, **SMALL
    )
    assert again.resumed_units == first.units_done > 0
    assert again.units_done == again.units_total == reference.units_total
    assert hashes(again) == hashes(reference) and again.stats.states == reference.stats.states


def test_an_error_while_planning_reaches_the_caller(monkeypatch):
    _planned_in_pieces(monkeypatch, fail_after=2)
    with pytest.raises(RuntimeError, match="the planner broke"):
        superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, **SMALL)


def test_a_budget_spent_while_planning_is_a_warning_and_a_timed_out_result(monkeypatch):
    from mugraph.search import driver
    from mugraph.search.generator import SearchTimeout

    def out_of_time(program, cfg, deadline=None):
        raise SearchTimeout
        yield []  # (a generator)

    monkeypatch.setattr(driver, "plan_chunks", out_of_time)
    with pytest.warns(UserWarning, match="ran out while planning"):
        result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=1, **SMALL)
    assert result.timed_out and result.units_total == 0 and not result.candidates


# ---- the caller's heap, frozen while the search runs --------------------------------------------


def test_the_callers_objects_are_frozen_during_the_search_and_after_it_no_longer(reference):
    """The driver's full collections walk only the search's objects (the caller's, frozen,
    are not walked); afterwards nothing stays frozen."""
    gc.collect()
    assert gc.get_freeze_count() == 0
    seen = []  # (line, objects frozen): progress lines while it runs, the summary at the end

    def progress(line):
        seen.append((line, gc.get_freeze_count()))

    result = superoptimize(
        tiny_rmsnorm_linear(), time_limit=120, workers=2, progress=progress, **SMALL
    )
    running = [frozen for line, frozen in seen if line.startswith("[")]
    assert running and min(running) > 0
    assert gc.get_freeze_count() == 0
    assert hashes(result) == hashes(reference)


def test_a_freeze_of_the_caller_is_left_as_it_was():
    """Objects the caller froze stay frozen: the search neither freezes more nor unfreezes."""
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        seen = []

        def progress(line):
            seen.append(gc.get_freeze_count())

        superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=1, progress=progress, **SMALL)
        # (frozen objects freed by their last reference leave the count)
        assert 0 < gc.get_freeze_count() <= before and seen and max(seen) <= before
    finally:
        gc.unfreeze()
