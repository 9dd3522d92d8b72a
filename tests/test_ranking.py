"""Ranking verified candidates by measurement (mugraph.optimize.ranking) without a GPU: the
GPU path with a fake timer (kernels run on Triton's interpreter, the checks are real), kernels
that fail to compile, disagree with the reference or kill their worker process, and the
cost-model path a machine without a GPU takes. Real GPU runs: tests/gpu/test_ranking_gpu.py.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

if not torch.cuda.is_available():  # no GPU: generated kernels run on Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mugraph as mi  # noqa: E402
from mugraph.cache import ResultCache  # noqa: E402
from mugraph.errors import UnsupportedError  # noqa: E402
from mugraph.optimize.isolate import IsolatedWorkers  # noqa: E402
from mugraph.optimize.ranking import (  # noqa: E402
    PROGRAM_LABEL,
    Entry,
    RankingOptions,
    kernel_structure,
    rank_graphs,
    ranking_options,
    select_for_timing,
)
from mugraph.runtime.compiled import LaunchConfig, recorded_launch  # noqa: E402
from mugraph.search import api  # noqa: E402
from mugraph.search.driver import superoptimize  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


class LabelTimer:
    """A fake GPU timer: each candidate's time (µs) by label, halved when its kernels launch
    with ``fast_warps`` warps, quartered in a GEMV form of ``fast_forms``; the worker process
    kills itself when timing ``crash``."""

    def __init__(self, times: dict[str, float], crash: str | None = None,
                 fast_warps: int | None = None, fast_forms: tuple[str, ...] = ()) -> None:
        self.times, self.crash, self.fast_warps = times, crash, fast_warps
        self.fast_forms = fast_forms

    def __call__(self, run, subject) -> float:
        # (the kernels ran already: every candidate is checked against the reference first)
        if subject.label == self.crash:
            os.kill(os.getpid(), signal.SIGSEGV)
        us = self.times[subject.label]
        if self.fast_warps and any(w == self.fast_warps for _, w, *_ in subject.launch):
            us /= 2
        forms = {rest[0] for _, _, _, *rest in subject.launch if rest}
        if forms & set(self.fast_forms):
            us /= 4
        return us * 1e-6


def tiny_rmsnorm_linear():
    g = mi.new_kernel_graph()
    x = g.new_input((2, 32), dtype=mi.float32)
    w = g.new_input((32, 16), dtype=mi.float32)
    g.mark_output(g.matmul(g.rms_norm(x, 32), w))
    return g


@pytest.fixture(scope="module")
def searched():
    """One real search of the tiny program (its verified candidates), shared by the tests."""
    program = tiny_rmsnorm_linear()
    result = superoptimize(program, time_limit=60, workers=1, max_custom_kernels=1,
                           max_block_ops=4)
    assert len(result.candidates) >= 4
    return program, result


@pytest.fixture
def reuse_search(searched, monkeypatch):
    """``superoptimize`` as a user calls it, with the search step answered by the fixture's
    search (ranking, thread graphs and the final verification run for real)."""
    program, result = searched
    monkeypatch.setattr(api, "superoptimize", lambda *args, **kwargs: result)
    return program, result


def test_structure_abstracts_tile_sizes_only():
    def rmsnorm_linear(grid: int, loops: int, imap_x: int):
        g = mi.new_kernel_graph()
        x = g.new_input((8, 256), dtype=mi.float16)
        w = g.new_input((256, 256), dtype=mi.float16)
        tb = mi.new_threadblock_graph((grid, 1, 1), (128, 1, 1), loops)
        tx = tb.new_input(x, (imap_x, -1, -1), 1)
        tw = tb.new_input(w, (1 if imap_x < 0 else -1, -1, -1), 0)
        out = tb.div(tb.forloop_accum(tb.matmul(tx, tw)), tb.forloop_accum(tx, "rms"))
        tb.new_output(out, (1 if imap_x < 0 else 0, -1, -1))
        (o,) = g.customized([x, w], tb)
        g.mark_output(o)
        return g

    a, b = rmsnorm_linear(4, 4, -1), rmsnorm_linear(8, 2, -1)
    other = rmsnorm_linear(2, 4, 0)  # the grid splits X's rows instead of W's columns
    assert a.structural_hash() != b.structural_hash()
    assert kernel_structure(a) == kernel_structure(b)
    assert kernel_structure(a) != kernel_structure(other)


def test_selection_takes_top_k_then_one_per_structure():
    est = [5, 1, 2, 3, 4, 6, 7]
    structures = ["a", "a", "a", "b", "a", "c", "b"]
    entries = [Entry(f"#{i}", None, e * 1e-6, f"h{i}", s)
               for i, (e, s) in enumerate(zip(est, structures, strict=True))]
    chosen, left = select_for_timing(entries, top_k=2, max_timed=10)
    assert [entries[i].label for i in chosen] == ["#1", "#2", "#3", "#5"]
    assert left == 0
    chosen, left = select_for_timing(entries, top_k=2, max_timed=3)
    assert [entries[i].label for i in chosen] == ["#1", "#2", "#3"] and left == 1


def test_ranking_options_are_checked():
    assert ranking_options("cost").mode == "cost"
    assert ranking_options({"top_k": 2}).top_k == 2
    for bad in ("fastest", {"topk": 2}, {"top_k": 0}, 3):
        with pytest.raises(UnsupportedError, match="ranking"):
            ranking_options(bad)


def test_gpu_ranking_with_fake_timer_returns_measured_fastest(reuse_search, tmp_path):
    program, result = reuse_search
    times = {"#0": 50.0, "#1": 40.0, "#2": 20.0, "#3": 30.0, PROGRAM_LABEL: 60.0}
    for i in range(4, len(result.candidates)):
        times[f"#{i}"] = 45.0 + i
    log = tmp_path / "records.jsonl"
    options = RankingOptions(mode="gpu", timer=LabelTimer(times, fast_warps=2), isolate=False,
                             top_k=4, tune_top=1, seed=3, record_path=str(log))
    best = program.superoptimize(time_limit=60, workers=1, ranking=options)
    ranking = best.ranking
    assert ranking.method == "gpu" and best.search_result.ranking is ranking
    assert ranking.chosen == "#2" and ranking.estimate_pick == "#0"
    chosen = ranking.chosen_record
    assert chosen.graph_hash == result.candidates[2].hash
    assert chosen.default_us == pytest.approx(20.0) and chosen.tuned_us == pytest.approx(10.0)
    assert chosen.measured_us == pytest.approx(10.0)
    assert any(w == 2 for w, _ in chosen.launch.values())
    assert best.launch_settings == {int(i): LaunchConfig(w, s) for i, (w, s) in
                                    chosen.launch.items()}
    assert best.verification.passed
    assert ranking.record("#0").measured_us == pytest.approx(50.0)
    assert ranking.program_us == pytest.approx(60.0)
    summary = ranking.summary()
    assert "chose #2 at 10.0 us measured" in summary
    assert "5.00x faster than the estimate's pick #0 (50.0 us)" in summary
    assert "6.00x faster than the program (60.0 us)" in summary
    # one JSON record per candidate timed: hash, structure, estimate, measurement, launch
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    timed = [r for r in ranking.records if r.status == "timed"]
    assert len(lines) == len(ranking.records) and len(timed) >= 4
    for line, rec in zip(lines, ranking.records, strict=True):
        assert line["graph_hash"] == rec.graph_hash and line["structure"] == rec.structure
        assert line["estimate_us"] > 0 and line["measured_us"] == rec.measured_us
        assert line["launch"] and line["program"] == program.structural_hash()
    # the cache entry keeps the measurements and the launch settings
    cache = ResultCache(tmp_path / "cache")
    cache.put(program, None, best, best.search_result)
    hit = cache.get(program, None)
    stored = hit.cache_entry["ranking"]
    assert stored["chosen"] == "#2"
    assert stored["records"][0]["measured_us"] == pytest.approx(50.0)
    assert recorded_launch(hit) == best.launch_settings


def test_program_itself_wins_when_nothing_beats_it(reuse_search):
    program, result = reuse_search
    times = {f"#{i}": 50.0 for i in range(len(result.candidates))}
    times[PROGRAM_LABEL] = 10.0
    options = RankingOptions(mode="gpu", timer=LabelTimer(times), isolate=False, tune_top=0,
                             top_k=1, max_timed=1)
    with pytest.warns(UserWarning, match="no verified μGraph beat the program"):
        best = program.superoptimize(time_limit=60, workers=1, ranking=options)
    assert best is program and best.ranking.chosen == PROGRAM_LABEL
    assert "the program itself was fastest" in best.ranking.summary()


def test_without_gpu_the_cost_model_ranks_and_says_so(reuse_search):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: superoptimize measures")
    program, result = reuse_search
    best = program.superoptimize(time_limit=60, workers=1)
    ranking = best.ranking
    assert ranking.method == "cost model" and not ranking.measured
    assert ranking.chosen == "#0" and best.launch_settings == {}
    assert all(r.measured_us is None for r in ranking.records)
    assert "ranked by the cost model (no CUDA device)" in ranking.summary()
    assert "ranked by the cost model" in best.search_result.summary()
    assert best.structural_hash() == api.construct_thread_graphs(
        result.candidates[0].graph).structural_hash()


def test_gpu_mode_without_device_or_timer_is_an_error(searched):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    program, result = searched
    entries = [Entry("#0", result.candidates[0].graph, result.candidates[0].cost)]
    with pytest.raises(UnsupportedError, match="needs a CUDA device"):
        rank_graphs(program, entries, RankingOptions(mode="gpu"))


def test_gemv_forms_are_timed_and_the_fastest_kept(tmp_path):
    """A candidate with a matrix-vector accumulator is timed in each GEMV form too; the
    fastest form goes into its launch settings, the cache entry and the compiled kernels."""
    from mugraph import library

    sizes = dict(m=1, k=64, n=32, n_tile=16, k_tile=16)
    program = library.gated_mlp_naive(sizes)
    entries = [Entry("#0", library.gated_mlp_fused(sizes), 1e-6),
               Entry("#1", library.gated_mlp_fused({**sizes, "n_tile": 32}), 2e-6)]
    times = {"#0": 40.0, "#1": 30.0, PROGRAM_LABEL: 100.0}
    options = RankingOptions(mode="gpu", timer=LabelTimer(times, fast_forms=("dot",)),
                             isolate=False, tune_top=0, seed=5)
    ranking = rank_graphs(program, entries, options)
    assert ranking.chosen == "#1"
    rec = ranking.chosen_record
    assert rec.measured_us == pytest.approx(7.5)
    assert [v[2] for v in rec.launch.values()] == ["dot"]
    assert any(n.startswith("gemv form defer: 30.0 us") for n in rec.notes)
    settings = {int(i): LaunchConfig.from_list(v) for i, v in rec.launch.items()}
    program_dot = mi.compile(entries[1].graph, launch=settings)
    assert "tl.dot(" in program_dot.source
    # without a matrix-vector accumulator no form is timed
    assert not any("gemv form" in n for r in rank_graphs(
        tiny_rmsnorm_linear(), [Entry("#0", tiny_rmsnorm_linear(), 1e-6)],
        RankingOptions(mode="gpu", timer=LabelTimer({"#0": 1.0, PROGRAM_LABEL: 2.0}),
                       isolate=False, tune_top=0)).records for n in r.notes)


def test_launch_settings_keep_the_gemv_form():
    assert LaunchConfig(4, 3).to_list() == [4, 3]
    assert LaunchConfig(4, 3, "dot").to_list() == [4, 3, "dot"]
    for stored in ([4, 3], [8, 2, "defer"]):
        assert LaunchConfig.from_list(stored).to_list() == stored
    for bad in ([4], [4, 3, "fast"], "4,3"):
        with pytest.raises((ValueError, TypeError)):
            LaunchConfig.from_list(bad)
    with pytest.raises(UnsupportedError, match="gemv_forms"):
        RankingOptions(gemv_forms=("fast",))


# ---- candidates that fail: each excluded with its reason, the rest ranked ------------------


def exp_program():
    p = mi.new_kernel_graph()
    p.mark_output(p.exp(p.new_input((65536, 2), dtype=mi.float32)))
    return p


def exp_kernel(grid: tuple[int, int, int], twice: bool = False):
    """exp(X) as one custom kernel splitting X's rows over ``grid`` (``twice``: 2·exp(X),
    a wrong candidate)."""
    g = mi.new_kernel_graph()
    x = g.new_input((65536, 2), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid, (128, 1, 1), 1)
    imap = (0, -1, -1) if grid[0] > 1 else (-1, 0, -1)
    tx = tb.new_input(x, imap, -1)
    e = tb.exp(tx)
    tb.new_output(tb.add(e, e) if twice else e, imap)
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g


def test_failing_candidates_are_excluded_and_the_rest_goes_on():
    program = exp_program()
    graphs = {
        "#0": exp_kernel((16, 1, 1)),
        "#1": exp_kernel((32, 1, 1)),  # its worker dies (SIGSEGV) while it is timed
        "#2": exp_kernel((64, 1, 1), twice=True),  # disagrees with the reference
        "#3": exp_kernel((1, 65536, 1)),  # fails to compile: grid over the CUDA limit
        "#4": exp_kernel((8, 1, 1)),
    }
    entries = [Entry(label, g, (1 + i) * 1e-6) for i, (label, g) in enumerate(graphs.items())]
    times = {"#0": 30.0, "#1": 5.0, "#2": 5.0, "#3": 5.0, "#4": 20.0, PROGRAM_LABEL: 40.0}
    options = RankingOptions(mode="gpu", timer=LabelTimer(times, crash="#1"), tune_top=0,
                             top_k=5, seed=7)
    ranking = rank_graphs(program, entries, options)
    assert ranking.chosen == "#4"
    assert ranking.record("#0").measured_us == pytest.approx(30.0)
    reasons = {r.label: r.reason for r in ranking.excluded}
    assert set(reasons) == {"#1", "#2", "#3"}
    assert "worker process died" in reasons["#1"] and "SIGSEGV" in reasons["#1"]
    assert "disagrees with the reference" in reasons["#2"]
    assert "failed to compile or run" in reasons["#3"] and "65535" in reasons["#3"]
    summary = ranking.summary()
    assert "3 excluded" in summary and "excluded #1: its worker process died" in summary
    assert "1.50x faster than the estimate's pick #0 (30.0 us)" in summary


# tasks for bare workers (builtins: a worker need not import this module to run them)
OK = (eval, "__import__('os').getpid()")
FAULT = (exec, "raise RuntimeError('CUDA error: an illegal memory access was encountered')")
ERROR = (exec, "raise ValueError('an ordinary error')")
DIE = (exec, "import os; os.abort()")
HANG = (exec, "import time; time.sleep(60)")


SLOW_EXIT = (exec, "import atexit, time; atexit.register(time.sleep, 30)")


def test_closing_tells_every_worker_to_exit_before_waiting_for_any(monkeypatch):
    """Workers that take long to exit (a CUDA context torn down) are all told to exit before
    the first is waited for, and the wait is shared: closing three workers that would each
    take 30 s to exit returns after the one shared wait, every worker gone."""
    from mugraph.optimize import isolate

    pool = IsolatedWorkers(3)
    outcomes = pool.run(SLOW_EXIT[0], [SLOW_EXIT[1]] * 3)
    assert [o.kind for o in outcomes] == ["ok"] * 3
    workers = list(pool._idle)
    assert len(workers) == 3
    order = []
    for name in ("end_input", "stop"):
        real = getattr(isolate._Worker, name)
        monkeypatch.setattr(isolate._Worker, name,
                            lambda self, *a, _r=real, _n=name, **k: (order.append(_n),
                                                                    _r(self, *a, **k))[1])
    pool.close(wait=0.5)
    assert order[:3] == ["end_input"] * 3 and order.count("stop") == 3
    assert all(w.proc.poll() is not None for w in workers) and not pool._idle


def test_isolated_workers_survive_faults_errors_deaths_and_hangs():
    with IsolatedWorkers(1, task_timeout=20) as pool:
        outcomes = [pool.run(fn, [arg])[0] for fn, arg in (OK, FAULT, ERROR, DIE, OK)]
        assert [o.kind for o in outcomes] == ["ok", "fault", "error", "died", "ok"]
        assert "illegal memory access" in outcomes[1].error
        assert "ValueError: an ordinary error" in outcomes[2].describe()
        assert "killed by SIGABRT" in outcomes[3].describe()
        assert pool.started == 3  # replaced after the fault and after the death
        assert outcomes[0].value != outcomes[4].value  # a fresh process after them
    with IsolatedWorkers(1, task_timeout=1.0) as pool:
        (hung,) = pool.run(HANG[0], [HANG[1]])
        assert hung.kind == "timeout" and "killed" in hung.error
