"""The μGraph generator and search driver: rules, determinism, budgets, resume, ablations,
thread-graph construction and LAX partitioning. Discovery of the known-good μGraphs is in
tests/test_discovery.py."""

from __future__ import annotations

import numpy as np
import pytest

import mugraph as mi
from mugraph.errors import UnsupportedError
from mugraph.ir.ops import Group, OpKind
from mugraph.library import WORKLOADS
from mugraph.search.config import default_config
from mugraph.search.driver import reference_recheck, superoptimize
from mugraph.search.fusion import FUSION_RULES, construct_thread_graphs
from mugraph.search.generator import PRUNING_RULES
from mugraph.search.partition import partition_program, stitch
from mugraph.semantics.labels import program_labels
from mugraph.semantics.reference import evaluate


def tiny_rmsnorm_linear():
    g = mi.new_kernel_graph()
    x = g.new_input((4, 64), dtype=mi.float32)
    w = g.new_input((64, 32), dtype=mi.float32)
    g.mark_output(g.matmul(g.rms_norm(x, 64), w))
    return g


def hashes(result):
    return [c.hash for c in result.candidates]


def test_complete_search_is_independent_of_worker_count():
    program = tiny_rmsnorm_linear()
    one = superoptimize(program, time_limit=120, workers=1, max_custom_kernels=1)
    two = superoptimize(program, time_limit=120, workers=2, max_custom_kernels=1)
    assert not one.timed_out and not two.timed_out
    assert one.candidates and hashes(one) == hashes(two)
    assert one.stats.states == two.stats.states


def test_every_returned_candidate_is_verified_and_matches_floats():
    program = tiny_rmsnorm_linear()
    result = superoptimize(program, time_limit=60, workers=1, max_custom_kernels=1)
    assert result.candidates
    for cand in result.candidates[:5]:
        assert mi.verify(cand.graph, program, max_rounds=8).passed
        assert reference_recheck(cand.graph, program) < 1e-9
    costs = [c.cost for c in result.candidates]
    assert costs == sorted(costs)


def test_prune_counters_are_named_rules():
    program = tiny_rmsnorm_linear()
    result = superoptimize(program, time_limit=30, workers=1, max_custom_kernels=1)
    assert set(result.stats.pruned) <= set(PRUNING_RULES)
    assert result.stats.pruned["abstract_expression"] > 0
    assert all(text for text in PRUNING_RULES.values())


def test_time_budget_is_honoured():
    w = WORKLOADS["attention_flashdecoding"]
    # the generic space: the attention preset completes this small program within the budget
    result = superoptimize(w.naive(w.small), preset="generic", time_limit=3, workers=2)
    assert result.timed_out
    assert result.elapsed < 3 + 10  # the last unit winds down at its next time check


def test_checkpoint_resumes_where_the_last_call_stopped(tmp_path):
    program = tiny_rmsnorm_linear()
    path = tmp_path / "search.ckpt"
    reports = []

    def ctrl_c_after_three_units(line: str) -> None:  # deterministic, unlike a time limit
        reports.append(line)
        if len(reports) == 3:
            raise KeyboardInterrupt

    first = superoptimize(program, time_limit=120, workers=1, max_custom_kernels=1,
                          checkpoint=path, progress=ctrl_c_after_three_units)  # fmt: skip
    assert first.interrupted and path.exists() and 0 < first.units_done < first.units_total
    second = superoptimize(
        program, time_limit=120, workers=1, max_custom_kernels=1, checkpoint=path
    )
    assert second.units_done == second.units_total
    assert second.resumed_units == first.units_done > 0  # the done units were not run again
    fresh = superoptimize(program, time_limit=120, workers=1, max_custom_kernels=1)
    assert hashes(second) == hashes(fresh)


def test_a_checkpoint_of_another_region_numbering_is_not_resumed(tmp_path, monkeypatch):
    """A checkpoint's regions name children of the walk as one numbering lists them; under
    another numbering (REGION_NUMBERING) the search starts afresh instead of resuming."""
    from mugraph.search import driver

    program = tiny_rmsnorm_linear()
    path = tmp_path / "search.ckpt"
    reports = []

    def ctrl_c_after_three_units(line: str) -> None:
        reports.append(line)
        if len(reports) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(driver, "REGION_NUMBERING", driver.REGION_NUMBERING - 1)
    first = superoptimize(program, time_limit=120, workers=1, max_custom_kernels=1,
                          checkpoint=path, progress=ctrl_c_after_three_units)  # fmt: skip
    assert first.interrupted and first.units_done > 0
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="another program or search space; starting afresh"):
        again = superoptimize(program, time_limit=120, workers=1, max_custom_kernels=1,
                              checkpoint=path)  # fmt: skip
    assert again.resumed_units == 0 and again.units_done == again.units_total


def test_the_enumerators_of_one_search_share_their_checked_expressions():
    """The table of checked block operators (Enumerator._checked_expression) is one per
    oracle: every work item of a search finds what earlier items checked, and another
    search (another oracle) starts with its own."""
    from mugraph.search.driver import _OracleAdapter, program_terms
    from mugraph.search.generator import Enumerator

    program = tiny_rmsnorm_linear()
    cfg = default_config(program)
    oracle, other = (_OracleAdapter(program_terms(program)) for _ in range(2))
    first, second = Enumerator(program, cfg, oracle), Enumerator(program, cfg, oracle)
    assert first._checked is second._checked
    assert Enumerator(program, cfg, other)._checked is not first._checked
    unpruned = cfg.with_overrides(abstract_pruning=False)
    assert Enumerator(program, unpruned, oracle)._checked is not first._checked  # no oracle


def test_ablations_search_more_states_and_find_the_same_best():
    program = tiny_rmsnorm_linear()
    base = superoptimize(program, time_limit=120, workers=2, max_custom_kernels=1, max_block_ops=4)
    no_abstract = superoptimize(
        program,
        time_limit=120,
        workers=2,
        max_custom_kernels=1,
        max_block_ops=4,
        abstract_pruning=False,
    )
    no_canonical = superoptimize(
        program,
        time_limit=120,
        workers=2,
        max_custom_kernels=1,
        max_block_ops=4,
        canonical_form=False,
    )
    for other in (no_abstract, no_canonical):
        assert other.stats.states > base.stats.states
        if not other.timed_out:
            assert other.candidates[0].cost <= base.candidates[0].cost


def test_config_overrides_and_errors():
    program = tiny_rmsnorm_linear()
    cfg = default_config(program, franges=[4], griddims=[(2, 1)])
    assert cfg.forloop_ranges == (4,) and cfg.griddims == ((2, 1, 1),)
    result = superoptimize(
        program, time_limit=30, workers=1, max_custom_kernels=1, griddims=[(2, 1, 1)], franges=[4]
    )
    block = next(op for op in result.best.ops if op.kind is OpKind.CUSTOMIZED).attr("graph")
    assert block.grid_dim == (2, 1, 1) and block.forloop_range == 4
    with pytest.raises(UnsupportedError, match="unknown search option"):
        default_config(program, max_block_opz=3)
    with pytest.raises(UnsupportedError, match="unknown config preset"):
        default_config(program, "transformer")


def test_program_labels_unify_matmul_indices():
    w = WORKLOADS["attention_flashdecoding"]
    inputs, outputs = program_labels(w.naive(w.small))
    q, k, v = inputs
    assert q[2] == k[1]  # Q's d is K's d (the inner dim of Q @ K)
    assert k[2] == v[1]  # K's n is V's n (the inner dim of softmax(QK) @ V)
    assert outputs[0][0] == q[0] and outputs[0][2] == v[2]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_thread_graph_construction_keeps_meaning(name):
    w = WORKLOADS[name]
    graph = w.optimized(w.small, mi.float32)
    fused = construct_thread_graphs(graph)
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(t.dims) * 0.3 for t in graph.input_types]
    for a, b in zip(evaluate(graph, inputs), evaluate(fused, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert mi.verify(fused, w.naive(w.small, mi.float32), max_rounds=2).passed


def test_fusion_rules_are_data_stating_their_law():
    assert FUSION_RULES and all(rule.law and rule.name for rule in FUSION_RULES)
    for rule in FUSION_RULES:
        assert rule.producers <= Group.ELEMENTWISE | {OpKind.THREAD_GRAPH}


def test_elementwise_chain_becomes_one_thread_graph():
    w = WORKLOADS["gated_mlp"]
    fused = construct_thread_graphs(w.optimized(w.small))
    block = next(op for op in fused.ops if op.kind is OpKind.CUSTOMIZED).attr("graph")
    kinds = [op.kind for op in block.ops]
    assert OpKind.THREAD_GRAPH in kinds and OpKind.SILU not in kinds


def two_exps_program():
    g = mi.new_kernel_graph()
    x = g.new_input((4, 32), dtype=mi.float32)
    w = g.new_input((32, 16), dtype=mi.float32)
    g.mark_output(g.mul_scalar(g.exp(g.exp(g.matmul(x, w))), 0.5))
    return g


def test_lax_partitioning_cuts_between_two_exponentials():
    program = two_exps_program()
    with pytest.raises(mi.NotVerifiableError, match="second exponential"):
        mi.verify(program, program)
    parts = partition_program(program)
    assert len(parts) == 2
    for part in parts:
        mi.verify(part.graph, part.graph)  # each part is verifiable
    stitched = stitch(program, parts, [p.graph for p in parts])
    assert reference_recheck(stitched, program) < 1e-12


def test_superoptimize_searches_each_subprogram_and_stitches():
    program = two_exps_program()
    best = program.superoptimize(time_limit=20, workers=1)
    assert len(best.partitions) == 2 and len(best.search_result.parts) == 2
    assert best.verification.passed and "by parts" in best.verification.guarantee
    assert "split into 2 subprograms" in best.search_result.summary()
    assert reference_recheck(best, program) < 1e-9
    assert any(op.kind is OpKind.CUSTOMIZED for op in best.ops)


def test_superoptimize_returns_a_verified_graph_with_its_search_result():
    program = tiny_rmsnorm_linear()
    best = program.superoptimize(time_limit=60, workers=2, max_custom_kernels=1)
    assert best is not program
    assert best.verification.passed
    assert best.search_result.candidates
    (out,) = best(inputs=[np.ones((4, 64), np.float32), np.ones((64, 32), np.float32)])
    (ref,) = program(inputs=[np.ones((4, 64), np.float32), np.ones((64, 32), np.float32)])
    np.testing.assert_allclose(out, ref, rtol=1e-6)
