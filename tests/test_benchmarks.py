"""The benchmark suite (benchmarks/suite) and its runner, on the CPU.

Every row's naive mugraph program computes what its PyTorch function computes (reference
semantics, float32, small sizes); byte and flop counts agree with the programs; the SDPA
forms of the attention rows compute the rows' function; the hand-written μGraphs fit their
rows; saved search results load and fit; the runner's CPU mode (Triton interpreter) and its
GPU pipeline (driven on the CPU with the CUDA-only pieces faked) write results.json.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ under plain pytest
if not torch.cuda.is_available():  # no GPU: generated kernels run on Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mugraph  # noqa: E402
from benchmarks import run  # noqa: E402
from benchmarks.suite import ROWS, WORKLOAD_NAMES, rows_table, select  # noqa: E402
from benchmarks.suite.baselines import CompileTimeout, _caused_by_timeout, sdpa_forms  # noqa: E402
from benchmarks.suite.mugraphs import SEARCHED_DIR, choose, load_searched  # noqa: E402
from benchmarks.suite.report import summarize, text_table  # noqa: E402
from benchmarks.suite.tensors import graph_counts, make_inputs, rel_error  # noqa: E402
from mugraph.codegen.loader import interpreter_active  # noqa: E402
from mugraph.search.api import superoptimize_graph  # noqa: E402

ROW_NAMES = list(ROWS)
ROOT = Path(__file__).resolve().parents[1]
SUITE_DOC = ROOT / "benchmarks" / "SUITE.md"


def suite_workloads() -> dict[str, tuple[str, tuple[int, ...]]]:
    """benchmarks/SUITE.md's tables: workload -> (group, batch factors)."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    group = None
    for line in SUITE_DOC.read_text().splitlines():
        if line.startswith("## Group "):
            group = line.split()[2].rstrip(":")
        elif group and line.startswith("| ") and not line.startswith(("| name", "| ---")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            found[cells[0]] = (group, tuple(int(b) for b in cells[-1].split(",")))
        elif line.startswith("## "):
            group = None
    return found


SUITE_WORKLOADS = suite_workloads()


def test_the_suite_is_defined_in_the_repository():
    assert len(SUITE_WORKLOADS) == 14
    for path in [ROOT / "README.md", *ROOT.glob("benchmarks/**/*.py"),
                 *ROOT.glob("benchmarks/*.md"), *ROOT.glob("mugraph/**/*.py")]:
        assert "shared/benchmarks.md" not in path.read_text(encoding="utf-8"), path
    assert "benchmarks/SUITE.md" in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert "benchmarks/SUITE.md" in (ROOT / "benchmarks" / "run.py").read_text()


def test_the_table_has_every_workload_at_both_batch_factors():
    assert set(WORKLOAD_NAMES) == set(SUITE_WORKLOADS)
    for workload, (group, bs) in SUITE_WORKLOADS.items():
        rows = select([workload])
        assert [(r.group, r.b) for r in rows] == [(group, b) for b in bs]
    assert len(select(group="A")) == 14 and len(select(group="B")) == 14
    assert select(["gqa_b1", "lora"]) == [ROWS["gqa_b1"], ROWS["lora_b1"], ROWS["lora_b4"]]
    with pytest.raises(KeyError):
        select(["no_such_row"])
    table = rows_table()
    assert all(f"| {name} |" in table for name in ROW_NAMES)


@pytest.mark.parametrize("name", ROW_NAMES)
def test_program_matches_pytorch(name):
    """The naive program (reference semantics) against the PyTorch function, float32."""
    row = ROWS[name]
    program = row.program(small=True, dtype=mugraph.float32)
    inputs = make_inputs(program, "cpu", seed=zlib_seed(name), dtype=torch.float32)
    expected = row.torch_fn(*inputs)
    (got,) = program(inputs=inputs)
    assert rel_error(got, expected) < 1e-5


def zlib_seed(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


@pytest.mark.parametrize("name", ROW_NAMES)
def test_counts_are_positive_and_match_the_program(name):
    row = ROWS[name]
    for small in (False, True):
        moved, flops = row.counts(small=small)
        assert moved > 0 and flops > 0
        assert (moved, flops) == graph_counts(row.program(small=small))
    moved, flops = row.counts()
    inputs_bytes = sum(t.num_bytes for t in row.program().input_types)
    assert inputs_bytes < moved  # the output is written too


def test_row_inputs_follow_the_suite_shapes():
    """Spot checks of the layouts: folded GQA heads, K read as a transposed view."""
    decode = ROWS["gqa_llama70b_decode_b8"].program()
    q, k, v = decode.input_types
    assert (q.dims, k.dims, v.dims) == ((16, 8, 128), (16, 128, 4096), (16, 4096, 128))
    assert k.strides == (4096 * 128, 1, 128)
    gqa = ROWS["gqa_b8"].program()
    assert [t.dims for t in gqa.input_types] == [(16, 256, 64), (16, 64, 4096), (16, 4096, 64)]
    assert gqa.input_types[1].strides == (64 * 4096, 4096, 1)
    falcon = ROWS["mqa_falcon7b_decode_b1"].program()
    assert falcon.input_types[0].dims == (1, 71, 64)
    adapter = ROWS["mlp_adapter_b64"].program()
    assert [t.dims for t in adapter.input_types] == [(64, 4096), (4096, 16), (16, 4096)]


@pytest.mark.parametrize("name", [n for n in ROW_NAMES if ROWS[n].attention])
def test_sdpa_forms_compute_the_row(name):
    row = ROWS[name]
    program = row.program(small=True, dtype=mugraph.float32)
    inputs = make_inputs(program, "cpu", seed=1, dtype=torch.float32)
    small_row = _small(row)
    expected = row.torch_fn(*inputs)
    forms = sdpa_forms(small_row, inputs)
    assert forms
    for label, fn in forms:
        assert rel_error(fn(), expected) < 1e-5, label


def _small(row):
    import dataclasses

    return dataclasses.replace(row, sizes=row.small, tiles=row.small_tiles, variants=())


@pytest.mark.parametrize("name", ROW_NAMES)
def test_hand_written_mugraph_fits_the_row(name):
    row = ROWS[name]
    choice = choose(row, "hand")
    if choice.graph is None:
        assert choice.source == "none" and choice.note
        return
    program = row.program()
    assert choice.source == "hand-written"
    assert choice.graph.input_types == program.input_types
    assert choice.graph.output_types == program.output_types
    for _, graph in choice.candidates:
        assert graph.input_types == program.input_types


def test_searched_results_load_and_fit():
    files = sorted(p for p in SEARCHED_DIR.glob("*.json") if p.stem in ROWS)
    for path in files:
        doc = json.loads(path.read_text())
        row = ROWS[path.stem]
        assert path.with_suffix(".log").exists()
        if not doc["verified"]:  # searched, nothing better than the program: no graph
            assert doc["verdict"] != "verified" and "graph" not in doc
            continue
        assert "equivalent" in doc["verification"]
        assert doc["float_recheck_rel_err"] < 1e-9
        graph, _ = load_searched(row, row.program())
        assert graph is not None, path.name
        assert path.with_suffix(".log").exists()


def test_list_prints_the_rows(capsys):
    assert run.main(["--list"]) == []
    assert "gqa_llama70b_spec_b8" in capsys.readouterr().out


def test_report_helpers():
    rec = {"row": "x_b1", "b": 1, "eager_us": 30.0, "compile_us": 20.0, "sdpa_us": None,
           "mugraph_us": 10.0, "floor_us": 5.0, "source": "hand-written", "status": "ok"}
    summarize(rec)
    assert rec["best_baseline"] == "compile" and rec["speedup"] == pytest.approx(2.0)
    assert rec["mugraph_vs_floor"] == pytest.approx(2.0)
    assert "x_b1" in text_table(["row", "notes"], [["x_b1", "ok"]])
    error = RuntimeError("wrapped")
    error.__cause__ = CompileTimeout()
    assert _caused_by_timeout(error) and not _caused_by_timeout(RuntimeError("other"))


needs_interpreter = pytest.mark.skipif(
    not interpreter_active(), reason="the CPU checks run generated kernels on the interpreter"
)


@needs_interpreter
def test_runner_cpu_mode_writes_results(tmp_path, capsys):
    args = run.parse_args(["lora_b1", "gqa_llama70b_decode_b1", "qknorm_gqa_b1", "--out",
                           str(tmp_path), "--seed", "3"], cuda=False)
    records = run.run_cpu(select(args.names), args, args.out)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["row"] for r in data["rows"]] == ["qknorm_gqa_b1", "lora_b1",
                                                "gqa_llama70b_decode_b1"]
    by_row = {r["row"]: r for r in records}
    assert by_row["lora_b1"]["status"] == "ok"
    assert by_row["gqa_llama70b_decode_b1"]["status"] == "ok"
    assert by_row["gqa_llama70b_decode_b1"]["rel_err"] < 1e-2
    assert by_row["lora_b1"]["mugraph_est_us"] < by_row["lora_b1"]["naive_est_us"]
    # a searched row is checked by the float64 semantics at suite sizes, a hand-written one
    # on the interpreter at small sizes
    qknorm = by_row["qknorm_gqa_b1"]
    assert qknorm["status"] == "ok" and qknorm["rel_err"] < 1e-2
    if qknorm["source"] == "searched":
        assert qknorm["check"].startswith("float64") and qknorm["rel_err"] < 1e-9
    assert "cost model" in capsys.readouterr().out


@needs_interpreter
def test_runner_gpu_pipeline_with_fakes(tmp_path, monkeypatch):
    """run_gpu's passes on small rows, with timing, rates and the device faked."""
    import mugraph.optimize as optimize
    from mugraph.optimize.profile import Measurement

    def fake_profile(fn, *, warmup=10, reps=100, flush_l2=True, device="cuda"):
        fn()
        start = time.perf_counter()
        fn()
        return Measurement(time.perf_counter() - start, ())

    from benchmarks.suite import tuning

    real_inputs = run.make_inputs
    monkeypatch.setattr(optimize, "profile_callable", fake_profile)
    monkeypatch.setattr(tuning, "profile_callable", fake_profile)
    monkeypatch.setattr(run, "measure_rates", lambda reps: {
        "bandwidth": 3e12, "matmul_rate": 6.5e14, "tiny_kernel_us": 4.0})
    monkeypatch.setattr(run, "gpu_meta", lambda args, rates: {
        "device": "fake", "torch": torch.__version__, "triton": "-", **rates})
    monkeypatch.setattr(run, "make_inputs", lambda g, device, seed, **kw: real_inputs(
        g, "cpu", seed, **kw))
    rows = [_small(ROWS["mlp_adapter_b8"]), _small(ROWS["mqa_falcon7b_decode_b1"])]
    # the headline is what superoptimize returns from the result cache: search one row into
    # a fresh cache, leave the other out (it must say that it has no figure)
    cache = tmp_path / "cache"
    searched = superoptimize_graph(rows[1].program(), time_limit=5, workers=2, cache=cache,
                                   ranking="cost")
    assert searched is not rows[1].program()
    args = run.parse_args(["--no-compile", "--reps", "2", "--seed", "1", "--cache", str(cache),
                           "--search-time-limit", "5"], cuda=True)
    records = run.run_gpu(rows, args, tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["stage"] == "done" and len(data["rows"]) == 2
    missing, found = records
    assert missing.get("mugraph_us") is None and "no search result" in missing["status"]
    assert missing["hand_us"] > 0  # the reference column is there, never the headline
    assert found["source"] == "searched" and found["status"] == "ok", found
    assert found["mugraph_us"] > 0 and found["eager_us"] > 0 and found["speedup"] > 0
    assert found["sdpa_backend"] and found["variant"] == "superoptimize"
    assert "geometric mean" in data["meta"]["summary"]


def test_screen_drops_a_candidate_that_disagrees(monkeypatch):
    """A μGraph whose output disagrees with PyTorch is never chosen, whatever its speed."""
    from benchmarks.suite import tuning
    from benchmarks.suite.mugraphs import hand_written
    from mugraph.optimize.profile import Measurement

    monkeypatch.setattr(tuning, "profile_callable", lambda fn, **kw: Measurement(1e-6, ()))
    graph = hand_written(ROWS["lora_b1"], small=True)
    errors = iter([0.5, 1e-4])
    screened = tuning.screen([("wrong", graph), ("right", graph)], [], lambda p: next(errors),
                             1e-2, reps=2)
    assert screened[0].program is None and "MISMATCH" in screened[0].note
    assert screened[1].program is not None and screened[1].us == pytest.approx(1.0)


def test_a_candidate_that_faults_the_gpu_restarts_the_run_without_it(tmp_path, monkeypatch):
    """A CUDA fault ends the process's context: the runner execs itself again, excluding the
    candidate, and the restarted run skips it."""
    from benchmarks.suite import tuning
    from benchmarks.suite.mugraphs import hand_written

    graph = hand_written(ROWS["lora_b1"], small=True)

    def faulting(program):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(tuning.CudaFault) as fault:
        tuning.screen([("bad", graph)], [], faulting, 1e-2, reps=2)
    assert fault.value.label == "bad"
    screened = tuning.screen([("bad", graph)], [], faulting, 1e-2, reps=2,
                             exclude=frozenset({"bad"}))
    assert screened[0].program is None and screened[0].note == tuning.EXCLUDED_NOTE

    calls = []

    class Exec(Exception):
        pass

    def fake_execv(path, argv):
        calls.append(argv)
        raise Exec

    monkeypatch.setattr(run.os, "execv", fake_execv)
    args = run.parse_args(["lora_b1", "--budget", "300", "--exclude", "gqa_b1:x"], cuda=True)
    with pytest.raises(Exec):
        run.restart_after_fault(args, "lora_b1:bad", 7, fault.value)
    again = run.parse_args(calls[0][3:], cuda=True)
    assert again.exclude == ["gqa_b1:x", "lora_b1:bad"] and again.restarts == 1
    assert again.seed == 7 and again.budget <= 300 and again.names == ["lora_b1"]
    assert run.excluded_labels(again, "lora_b1") == {"bad"}
    again.restarts = run.MAX_RESTARTS
    with pytest.raises(SystemExit, match="after 3 restarts"):
        run.restart_after_fault(again, "lora_b1:other", 7, fault.value)


def test_a_search_call_of_some_rows_keeps_the_other_rows_summary(tmp_path):
    from benchmarks.search_suite import write_summary

    def line(row, states):
        return {"row": row, "elapsed_s": 1.0, "states": states, "candidates_verified": 1,
                "est_us": 1.0, "hand_est_us": None, "vs_hand": None, "kernels": 1,
                "split": False, "alternatives": 0, "alternative_structures": 0,
                "split_alternative": False}

    write_summary(tmp_path, [line("lora_b1", 1), line("gqa_b1", 2)])
    write_summary(tmp_path, [line("lora_b1", 3)])
    lines = json.loads((tmp_path / "summary.json").read_text())
    assert [(ln["row"], ln["states"]) for ln in lines] == [("gqa_b1", 2), ("lora_b1", 3)]
    assert "| gqa_b1 |" in (tmp_path / "summary.md").read_text()


def test_trace_levels_keeps_the_stamps_nanosecond_exact(tmp_path):
    """globaltimer stamps (about 1.8e18 ns) lose 256 ns steps as float64 unless the first
    stamp is subtracted before the conversion."""
    import numpy as np

    from benchmarks import trace_levels

    base = 1_795_797_916_054_604_192
    stamps = np.array([[0, 130, 1170], [40, 1210, 2250]], dtype=np.int64) + base
    path = tmp_path / "t.npz"
    np.savez(path, stamps=stamps, depth=np.array([0, 1]), kind=np.array(["a", "b"]),
             blocks=np.array([1, 1]), program=np.array([0, 1]))
    t = trace_levels.load(str(path))
    assert t["woke"].tolist() == [0.13, 1.21] and t["end"].tolist() == [1.17, 2.25]


def test_trace_levels_sums_a_layer_s_levels_by_position():
    """``period_rows``: levels 1, 3 (position 0) and 2, 4 (position 1) of a two-level period;
    level 5, of a period left unfinished, is not counted."""
    import numpy as np

    from benchmarks import trace_levels

    ends = [1.0, 2.0, 5.0, 6.0, 10.0, 11.0]  # µs: level times 1, 3, 1, 4, 1 from level 1 on
    t = {"end": np.array(ends), "woke": np.array([0.5, 1.5, 2.5, 5.5, 6.5, 10.5]),
         "depth": np.arange(6), "kind": np.array(["e", "p", "q", "p", "q", "p"])}
    rows = trace_levels.period_rows(t, 1, 2)
    assert rows[2] == "| 0 | p | 2 | 2.0 | 1.00 | 0.50 |"
    assert rows[3] == "| 1 | q | 2 | 7.0 | 3.50 | 0.50 |"


def test_every_persistent_variant_names_real_options():
    """``bench_persistent.VARIANTS``: each variant's compile options are parameters of
    ``PersistentProgram`` and its tile options fields of ``TilePolicy`` (a misspelt one would
    fail only on the GPU machine)."""
    import dataclasses
    import inspect

    from benchmarks import bench_persistent as bp
    from mugraph.persistent.kernel import TilePolicy
    from mugraph.persistent.runtime import PersistentProgram

    program = set(inspect.signature(PersistentProgram.__init__).parameters)
    tiles = {f.name for f in dataclasses.fields(TilePolicy)}
    for name, (compile_options, tile_options) in bp.VARIANTS.items():
        assert set(compile_options) <= program, name
        assert set(tile_options) <= tiles, name


def test_the_float32_reference_of_the_persistent_benchmark_decodes_as_generate():
    """``bench_persistent.fp32_reference``: a float32 copy's logits along the given tokens and
    its own greedy tokens (which transformers' ``generate`` of the same float32 model gives)."""
    transformers = pytest.importorskip("transformers")
    from benchmarks import bench_persistent as bp

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        m32 = transformers.LlamaForCausalLM(config).eval()
        m32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        want = m32.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6,
                            do_sample=False)[0, len(prompt):].tolist()
    ref_tokens = [7, 2, 9, 2, 6, 5]  # any tokens: the logits follow them (teacher forcing)
    exact = bp.fp32_reference(model, prompt, ref_tokens)
    assert exact.tokens == want
    assert tuple(exact.logits.shape) == (6, 64) and exact.logits.dtype == torch.float32
    with torch.no_grad():
        full = m32(torch.tensor([prompt + ref_tokens[:-1]])).logits[0, len(prompt) - 1:]
    assert torch.allclose(exact.logits, full, atol=1e-5)
    assert next(model.parameters()).dtype == torch.bfloat16  # the model itself untouched
    assert bp.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert bp.first_mismatch([1, 2, 3], [1, 5, 3]) == 1


def test_the_verifier_bound_counts_draws_and_exact_products():
    """``probe_verify_bounds``: a round draws one value per input element and one more per
    element whose Z_q component reaches an exponent; its products need the fewest limbs an
    exact float64 GEMM takes modulo p (2 at p ~ 2^31, 1 for a prime small enough); every
    element of an exponential costs one ω^e."""
    from benchmarks import probe_verify_bounds as pvb
    from benchmarks.bench_verify import Case
    from mugraph.semantics.field_arith import P

    assert pvb.fewest_limbs(P) == 2 and pvb.fewest_limbs(1_000_003) == 1
    program = ROWS["gqa_b1"].program(small=True)
    q, k, v = (t.dims for t in program.input_types)  # (b, m, d), (b, d, n), (b, n, d)
    macs = q[0] * q[1] * q[2] * k[2] + q[0] * q[1] * k[2] * v[2]
    assert pvb.program_macs(program) == macs
    rates = pvb.Rates(draw_ns=1.0, gemm_gflops=1.0, exp_ns=2.0, lookup_ns=0.5, write_ns=0.0,
                      read_ns=0.0, threads=1)
    large, small = pvb.designs(rates)
    case = Case("gqa_b1", "-", None, program)
    b = pvb.bound(case, rates, large)
    elements = [math.prod(t) for t in (q, k, v)]
    assert b.values == 2 * elements[0] + 2 * elements[1] + elements[2]  # Q, K reach exp
    assert b.draw_ms == pytest.approx(b.values / 1e6)
    assert b.gemm_ms == pytest.approx(2 * 2 * macs / 1e9 * 1e3)
    scores = q[0] * q[1] * k[2]  # one exponential per score
    assert b.exps == scores and b.exp_ms == pytest.approx(2 * scores / 1e6)
    assert b.total_ms == pytest.approx(b.draw_ms + b.gemm_ms + b.exp_ms)
    assert "| yes" in pvb.table(large, [b], budget=0.0)
    assert "0 with a bound" in pvb.table(large, [b], 1e9)
    # the small pair's favourable variant: 21 bits a value, one limb, one lookup an exponential
    f = pvb.bound(case, rates, small)
    assert f.values == b.values and f.limbs == 1
    assert f.draw_ms == pytest.approx(b.values * 21 / 32 / 1e6)
    assert f.gemm_ms == pytest.approx(b.gemm_ms / 2)
    assert f.exp_ms == pytest.approx(0.5 * scores / 1e6)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter arithmetic")
def test_the_level_latency_chains_compute_the_hosts_last_row():
    """``probe_level_latency``: every way of signalling a level (one counter, split counters,
    flags in the data) makes its chain of levels compute the host's last row (one program
    under the interpreter: the arithmetic, not the waits; the polls by inline PTX loads run
    only on a GPU)."""
    from benchmarks import probe_level_latency as pll

    for mode in pll.runnable(pll.MODES):
        _, right = pll.run(mode, levels=4, programs=1, repeats=1)
        assert right is (None if mode.startswith("barrier") else True)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter arithmetic")
def test_the_level_overlap_chains_compute_the_hosts_last_row():
    """``probe_level_overlap``: with a tile of weights summed at every level, each mode (no
    waits, events, events with the next tile asked for early, data-carried flags, flags with
    a relaxed counter as a hint) computes the host's last row (one program, the arithmetic)."""
    from benchmarks import probe_level_overlap as plo

    weights, sums = plo.tiles(programs=1, tile=16, wrap=3)
    for mode in plo.MODES:
        _, right = plo.run(mode, levels=5, programs=1, weights=weights, wsum=sums, repeats=1)
        assert right, mode
