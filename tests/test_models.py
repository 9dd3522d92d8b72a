"""Real model families through ``torch.compile(backend="mugraph")`` on the CPU.

Tiny ``transformers`` models built from configs with random weights (Llama, Qwen2 with biased
Q/K/V projections, Mistral), two layers each. The logits must match eager PyTorch, and the
report must show mugraph running, in every layer, the RMSNorm + Q/K/V projection, attention
and the gated MLP. The three families share one result cache (module scope), as a user's
machine does: the first compile searches, the others mostly reuse the class searches.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import mugraph.integration as mgi
from mugraph.integration.runtime import MugraphPartition
from mugraph.search import api

transformers = pytest.importorskip("transformers")

LAYERS = 2
SEQ = 24  # > 16: the representative's key sequence is long enough to loop over
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("model-cache"))


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    mgi.clear_reports()
    yield
    torch._dynamo.reset()


def tiny_model(family: str):
    config_cls, model_cls = (getattr(transformers, name) for name in FAMILIES[family])
    torch.manual_seed(0)
    return model_cls(config_cls(**SIZES)).eval()


def compile_and_run(model, ids, cache_dir: str, **extra):
    options = {"time_limit": 30, "cache_dir": cache_dir, **extra}
    compiled = torch.compile(model, backend="mugraph", options=options, dynamic=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no partition may fail at run time
        got = compiled(ids).logits
        want = model(ids).logits
    return got, want


def taken_by_class(report) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in report.taken:
        counts[part.shape_class] = counts.get(part.shape_class, 0) + 1
    return counts


def assert_layers_on_mugraph():
    for report in mgi.reports():
        taken = taken_by_class(report)
        # every layer: RMSNorm + stacked Q/K/V, attention, RMSNorm + gated MLP (and the final
        # norm + lm_head is one more norm_linear)
        assert taken.get("norm_linear", 0) >= LAYERS + 1, taken
        assert taken.get("attention", 0) == LAYERS, taken
        assert taken.get("gated_mlp", 0) == LAYERS, taken
        for part in report.partitions:
            if part.shape_class in ("norm_linear", "attention", "gated_mlp"):
                assert part.runs_on == "mugraph", part.line()


@pytest.fixture
def search_calls(monkeypatch):
    calls = []
    real = api.superoptimize

    def spy(program, **kwargs):
        calls.append(program.structural_hash())
        return real(program, **kwargs)

    monkeypatch.setattr(api, "superoptimize", spy)
    return calls


def test_llama_matches_eager_with_a_cold_then_a_warm_cache(cache_dir, search_calls):
    model = tiny_model("llama")
    ids = torch.randint(0, SIZES["vocab_size"], (1, SEQ))
    started = time.perf_counter()
    got, want = compile_and_run(model, ids, cache_dir)
    cold = time.perf_counter() - started
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_layers_on_mugraph()
    assert search_calls, "a cold cache searches"
    cold_backend = sum(r.seconds for r in mgi.reports())

    torch._dynamo.reset()
    mgi.clear_reports()
    searched = len(search_calls)
    started = time.perf_counter()
    got, want = compile_and_run(model, ids, cache_dir)
    warm = time.perf_counter() - started
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_layers_on_mugraph()
    assert len(search_calls) == searched, "a warm cache searches nothing"
    assert all(p.cache == "hit" for r in mgi.reports() for p in r.partitions if p.shape_class)
    warm_backend = sum(r.seconds for r in mgi.reports())
    print(f"\ntiny llama ({LAYERS} layers): first call cold {cold:.1f} s (backend "
          f"{cold_backend:.1f} s), warm {warm:.1f} s (backend {warm_backend:.1f} s)")


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_match_eager(family, cache_dir):
    model = tiny_model(family)
    ids = torch.randint(0, SIZES["vocab_size"], (1, SEQ))
    got, want = compile_and_run(model, ids, cache_dir)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_layers_on_mugraph()
    if family == "qwen2":  # biased Q/K/V projections: the stacked bias is in the partition
        ops = [p.ops for r in mgi.reports() for p in r.partitions if p.shape_class]
        assert ["rms_norm", "matmul", "add"] in ops


def test_another_sequence_length_is_specialized_not_reused(cache_dir, search_calls):
    model = tiny_model("llama")
    for seq in (SEQ, 40):
        ids = torch.randint(0, SIZES["vocab_size"], (1, seq))
        got, want = compile_and_run(model, ids, cache_dir)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    first, second = mgi.reports()[0], mgi.reports()[-1]
    assert first.signature != second.signature
    hashes = [{p.program_hash for p in r.partitions} for r in (first, second)]
    assert not hashes[0] & hashes[1], "every kernel of the new length is a new program"
    # same shape classes and representatives: the class searches come from the cache
    assert all(p.cache == "hit" for p in second.partitions if p.shape_class)
    assert_layers_on_mugraph()


def test_the_shape_guard_refuses_a_kernel_for_another_shape(cache_dir):
    options = {"time_limit": 30, "cache_dir": cache_dir}
    gm = torch.fx.symbolic_trace(lambda x, w: torch.nn.functional.linear(
        torch.nn.functional.rms_norm(x, (64,), eps=1e-6), w))
    x, w = torch.randn(1, SEQ, 64), torch.randn(96, 64)
    fn = mgi.optimize_fx(gm, [x, w], **options)
    (module,) = [m for m in fn.specialized.values()]
    (part,) = [m for m in module.modules() if isinstance(m, MugraphPartition)]
    assert part.use_mugraph
    other = torch.randn(1, SEQ + 8, 64)
    with pytest.warns(UserWarning, match="built for"):
        (out,) = part(other, w)
    torch.testing.assert_close(out, torch.nn.functional.linear(
        torch.nn.functional.rms_norm(other, (64,), eps=1e-6), w), rtol=1e-5, atol=1e-5)
    assert not part.use_mugraph
