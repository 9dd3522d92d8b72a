"""The automatic search space: shape classes, shape-derived grids and loops, the one-kernel and
split forms it finds at small shapes of the suite's classes, lazy verification, the final
verification over several processes, and the result cache behind ``superoptimize``."""

from __future__ import annotations

import dataclasses
import json

import pytest

import mugraph as mi
from benchmarks.suite.programs import attention_program, qknorm_attention_program
from benchmarks.suite.rows import ROWS
from mugraph.cli import PRESET_NAMES
from mugraph.library import WORKLOADS
from mugraph.search.config import default_config
from mugraph.search.driver import reference_recheck, superoptimize, verify_in_parallel
from mugraph.search.forms import custom_kernel_count, describe_form, is_split_form
from mugraph.search.partition import attention_cores, partition_program
from mugraph.search.space import PRESETS, SHAPE_CLASSES, classify

SMALL_ATTENTION = {"h": 2, "s": 32, "d": 16, "n": 128}


def rmsnorm_linear(m=2, k=256, n=512, dtype=mi.float32):
    return WORKLOADS["rmsnorm_linear"].naive({"m": m, "k": k, "n": n}, dtype)


def check_every_candidate(result, program):
    """Every returned candidate is verified again and agrees with the program on floats."""
    assert result.candidates, result.summary()
    for cand in result.candidates:
        assert custom_kernel_count(cand.graph) <= result.config.max_custom_kernels
        assert mi.verify(cand.graph, program, max_rounds=4).passed, describe_form(cand.graph)
        assert reference_recheck(cand.graph, program) < 1e-9


def test_shape_classes_pick_presets():
    assert classify(attention_program(SMALL_ATTENTION)).name == "attention"
    assert classify(rmsnorm_linear()).name == "gemv"  # 2 rows against a 256 x 512 weight
    assert classify(rmsnorm_linear(m=4, k=64, n=32)).name == "generic"  # weight ~ activation
    lora = WORKLOADS["lora"]
    assert classify(lora.naive(lora.small)).name == "lora"
    adapter = WORKLOADS["adapter_mlp"]
    assert classify(adapter.naive(adapter.small)).name == "mlp"
    assert {c.preset for c in SHAPE_CLASSES} <= set(PRESETS)
    assert all(c.law and p.purpose for c in SHAPE_CLASSES for p in PRESETS.values())
    for name in ("gqa_b1", "mqa_falcon7b_decode_b8", "gqa_llama70b_spec_b1"):
        assert default_config(ROWS[name].program()).preset == "attention"
    for name in ("rmsnorm_linear_b1", "gated_mlp_llama3_8b_b16", "lora_llama7b_b1"):
        assert default_config(ROWS[name].program()).preset == "gemv"


def test_presets_follow_shapes_and_yield_to_the_user():
    cfg = default_config(ROWS["gated_mlp_llama3_8b_b1"].program())
    assert cfg.split_min_extent == 4096 and cfg.min_blocks == 16  # K; an eighth of 132 SMs
    assert cfg.loop_tiles == (64, 128, 256, 512, 1024)  # K / 64 .. K / 4
    small = default_config(rmsnorm_linear())
    assert small.loop_tiles == (16, 32, 64)
    generic = default_config(rmsnorm_linear(), "generic", min_blocks=4)
    assert generic.preset == "generic" and generic.grid_tiles is None and generic.min_blocks == 4
    assert default_config(rmsnorm_linear(), grid_tiles=[32]).grid_tiles == (32,)
    with pytest.raises(mi.UnsupportedError, match="unknown config preset"):
        default_config(rmsnorm_linear(), "transformer")
    assert set(PRESET_NAMES) == set(PRESETS)  # the CLI's --config offers every preset


def test_a_masked_attention_gets_room_for_its_mask_in_the_split_kv_form():
    """The attention preset's budget is softmax(Q K) V's split-KV form (8 block operators
    over two kernels); a 0/1 mask's multiply needs one more (a decode step's attention as
    torch.compile hands it over on PyTorch 2.11 has one; before, the complete search found
    none of its 246 candidates verified)."""
    from tests.test_shape_class import DECODE_ATTENTION

    plain = default_config(mi.from_text(DECODE_ATTENTION))
    masked = default_config(mi.from_text(MASKED_DECODE_ATTENTION))
    assert plain.preset == masked.preset == "attention"
    assert (plain.max_total_block_ops, masked.max_total_block_ops) == (8, 9)
    assert plain.max_block_ops == masked.max_block_ops == 6


MASKED_DECODE_ATTENTION = """mugraph 1
%0 = input() [index=0] -> float16[2,4,1,64]/[256,64,64,1]
%1 = input() [index=1] -> float16[2,1,64,256]/[16384,64,1,64]
%2 = matmul(%0, %1) -> float16[2,4,1,256]/[1024,256,256,1]
%3 = input() [index=2] -> float16[1,1,1,256]/[256,256,256,1]
%4 = exp(%2) -> float16[2,4,1,256]/[1024,256,256,1]
%5 = mul(%4, %3) -> float16[2,4,1,256]/[1024,256,256,1]
%6 = reduction(%5) [dim=3] -> float16[2,4,1,1]/[4,1,1,1]
%7 = div(%5, %6) -> float16[2,4,1,256]/[1024,256,256,1]
%8 = input() [index=3] -> float16[2,1,256,64]/[16384,16384,64,1]
%9 = matmul(%7, %8) -> float16[2,4,1,64]/[256,64,64,1]
outputs %9
"""


def test_attention_space_finds_one_kernel_and_split_kv_forms():
    program = attention_program(SMALL_ATTENTION, mi.float32)
    result = superoptimize(program, time_limit=120, workers=2)
    assert result.config.preset == "attention" and not result.timed_out
    forms = {(custom_kernel_count(c.graph), is_split_form(c.graph)) for c in result.candidates}
    assert (1, False) in forms and (2, True) in forms, forms  # flash and FlashDecoding
    check_every_candidate(result, program)
    # lazily verified: the best few and the best of each structure, not every graph found
    assert result.stats.candidates >= len(result.candidates)


def test_gemv_space_finds_one_kernel_and_split_k_forms():
    program = rmsnorm_linear()
    result = superoptimize(program, time_limit=120, workers=2)
    assert result.config.preset == "gemv" and not result.timed_out
    one = [c for c in result.candidates if custom_kernel_count(c.graph) == 1]
    split = [c for c in result.candidates if is_split_form(c.graph)]
    assert one and split, result.summary()
    # split-K: partial sums of X @ W over K blocks; the combining kernel re-reads the small
    # X to accumulate rms(X) beside the partial sums
    first = next(op for op in split[0].graph.ops if op.kind is mi.OpKind.CUSTOMIZED)
    assert first.attr("graph").num_blocks >= 2
    check_every_candidate(result, program)


def test_rows_no_tile_divides_get_one_row_per_block():
    """12 query rows (71 on falcon's one KV head): no block tile of 16-128 divides them, so
    the grid may hold one row per block — the combining kernel of split-KV in particular."""
    program = attention_program({"h": 1, "s": 12, "d": 16, "n": 256}, mi.float32)
    result = superoptimize(program, time_limit=120, workers=2)
    assert not result.timed_out
    grids = [
        [op.attr("graph").grid_dim for op in c.graph.ops if op.kind is mi.OpKind.CUSTOMIZED]
        for c in result.candidates if is_split_form(c.graph)
    ]
    assert any(g[-1] == (12, 1, 1) for g in grids), grids
    check_every_candidate(result, program)


def test_qknorm_attention_is_cut_before_its_attention_core():
    program = qknorm_attention_program({**SMALL_ATTENTION, "k_nd": 0})
    ((first, last),) = attention_cores(program)
    parts = partition_program(program, 8)
    assert [p.ops[0] for p in parts][-1] == first and parts[-1].ops[-1] == last
    assert classify(parts[-1].graph).name == "attention"


def test_independent_norms_are_searched_apart():
    """The norms of Q and of K share no tensor: each is a subprogram of its own (one search
    each, kernels shaped for its tensor), then the attention core."""
    program = qknorm_attention_program({**SMALL_ATTENTION, "k_nd": 0})
    parts = partition_program(program, 6)
    kinds = [[program.ops[i].kind.value for i in part.ops] for part in parts]
    assert kinds[:2] == [["rms_norm"], ["square", "reduction", "mul_scalar", "sqrt", "div"]]
    assert classify(parts[2].graph).name == "attention"
    assert [len(part.outputs) for part in parts] == [1, 1, 1]


def test_a_lone_rms_norm_becomes_one_kernel():
    """rms_norm over rows a block holds whole is a block operator the search enumerates (it
    found nothing before: no block kind could express the division by the row's rms)."""
    g = mi.new_kernel_graph()
    g.mark_output(g.rms_norm(g.new_input((2, 64, 32), dtype=mi.float16), 32))
    result = superoptimize(g, time_limit=60, workers=1)
    check_every_candidate(result, g)
    kinds = {op.kind for op in result.candidates[0].graph.ops[1].attr("graph").ops}
    assert mi.OpKind.RMS_NORM in kinds


def test_final_verification_spreads_its_rounds():
    program = rmsnorm_linear()
    w = WORKLOADS["rmsnorm_linear"]
    good = w.optimized({"m": 2, "k": 256, "n": 512, "k_tile": 64, "n_tile": 64}, mi.float32)
    check = verify_in_parallel(good, program, max_rounds=8, workers=2)
    single = mi.verify(good, program, max_rounds=8)
    assert check.passed and check.rounds == single.rounds and check.bound == single.bound
    g = mi.new_kernel_graph()
    x = g.new_input((2, 256), dtype=mi.float32)
    wt = g.new_input((256, 512), dtype=mi.float32)
    g.mark_output(g.matmul(x, wt))  # no normalisation: not equivalent
    assert not verify_in_parallel(g, program, max_rounds=8, workers=2).passed


def test_superoptimize_answers_from_its_cache(tmp_path):
    program = rmsnorm_linear()
    best = program.superoptimize(time_limit=60, workers=2, cache=tmp_path)
    assert best is not program and best.verification.passed
    assert len(list(tmp_path.glob("*.json"))) == 1
    again = program.superoptimize(time_limit=60, workers=2, cache=tmp_path)
    assert again.structural_hash() == best.structural_hash()
    assert again.cache_entry["search"]["states"] == best.search_result.stats.states


def test_search_suite_row_is_what_superoptimize_returns(tmp_path):
    from benchmarks.search_suite import search_row, summary_line

    base = ROWS["gqa_llama70b_decode_b1"]
    row = dataclasses.replace(base, name="tiny_decode", sizes=dict(base.small))
    cache = mi.ResultCache(tmp_path / "cache")
    record = search_row(row, 60, 2, tmp_path, cache)
    assert record["verified"], record.get("error") or record.get("verdict")
    doc = json.loads((tmp_path / "tiny_decode.json").read_text())
    assert doc["alternatives"] and all(a["verified"] for a in doc["alternatives"])
    assert any(a["split"] for a in doc["alternatives"]) or doc["split"]
    line = summary_line(record)
    assert line["kernels"] >= 1 and line["alternatives"] == len(doc["alternatives"])
    answer = row.program().superoptimize(time_limit=60, cache=cache)
    assert json.loads(answer.to_json()) == doc["graph"]
