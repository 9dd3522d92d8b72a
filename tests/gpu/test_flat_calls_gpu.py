"""Recorded operator calls on a GPU (:mod:`mugraph.integration.flat_calls`): a tiny Llama
through ``torch.compile(backend="mugraph", options={"rest": "inductor"})``, called on new
token ids every time; after the first calls, mugraph's operator calls run on their recorded
launches, and every call's logits match eager's, as they do with the recording turned off.
Skipped without CUDA or without egglog. ``MUGRAPH_CACHE_DIR``: the result cache (default: a
fresh directory).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

transformers = pytest.importorskip("transformers")
# the search, which must run for a partition to be taken (an image without mugraph's
# dependencies installed fails the asserts below otherwise: twenty-fifth session, calls 9-11)
pytest.importorskip("egglog")

SIZES = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def tiny_llama(tmp_path):
    """(model, the model compiled by the mugraph backend with Inductor for the rest)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES))
    model = model.to("cuda", torch.float16).eval()
    options = {"time_limit": 30, "rest": "inductor",
               "cache_dir": os.environ.get("MUGRAPH_CACHE_DIR", str(tmp_path))}
    return model, torch.compile(model, backend="mugraph", options=options, dynamic=False)


def test_recorded_calls_compute_what_eager_does(tmp_path, monkeypatch):
    import mugraph.integration as mgi
    from mugraph.integration import flat_calls
    from mugraph.integration.runtime import MugraphPartition, call_site_stats

    # every partition mugraph can run stays on mugraph, however the GPU timing goes
    monkeypatch.setattr(MugraphPartition, "adopt",
                        lambda self, measured: setattr(self, "measure", False))
    model, compiled = tiny_llama(tmp_path)
    errors = []
    with torch.no_grad():
        for step in range(12):
            ids = torch.randint(0, SIZES["vocab_size"], (1, 24), device="cuda")
            flat_calls.enabled = step < 9  # the last calls take the full path again
            try:
                got = compiled(ids, use_cache=False).logits
            finally:
                flat_calls.enabled = True
            errors.append(rel_err(got, model(ids, use_cache=False).logits))
    stats = call_site_stats()
    print("errors", [f"{e:.1e}" for e in errors], "\nsites", stats)
    assert any(p.runs_on == "mugraph" for r in mgi.reports() for p in r.partitions)
    assert sum(s["flat_calls"] for s in stats) > 0, stats
    assert max(errors) < 2e-2, errors


def test_partitions_are_timed_on_their_recorded_launches(tmp_path, monkeypatch):
    """Against PyTorch, a partition is timed as a compiled model runs it once recorded: its
    program's launches replayed, which compute what its full path computes. (Times stored
    by an earlier test in the same cache are not taken: every partition is timed here.)"""
    import mugraph.integration as mgi
    from mugraph.cache import MeasurementCache
    from mugraph.integration.runtime import MugraphPartition

    mgi.clear_reports()
    monkeypatch.setattr(MeasurementCache, "get", lambda self, kind, what: None)
    torch._dynamo.reset()  # the model compiled by another test would be called again

    timed = []
    original = MugraphPartition._as_in_the_model

    def spy(self, raw, adapted):
        target = original(self, raw, adapted)
        full = self._run(raw, adapted)
        got = target()
        for k, i in enumerate(self.output_index):  # both are the program's outputs, by i
            assert rel_err(self._shaped(got[i], k), self._shaped(full[i], k)) < 1e-3
        timed.append("flat" in target.__code__.co_freevars)
        return target

    monkeypatch.setattr(MugraphPartition, "_as_in_the_model", spy)
    model, compiled = tiny_llama(tmp_path)
    ids = torch.randint(0, SIZES["vocab_size"], (1, 24), device="cuda")
    with torch.no_grad():
        got = compiled(ids, use_cache=False).logits
        assert rel_err(got, model(ids, use_cache=False).logits) < 2e-2
    assert timed and all(timed), timed
    # a failed check above is caught as a runtime failure (the partition goes to PyTorch):
    # none may have failed (the twenty-sixth session's call 3: two did, from comparing an
    # output with another one's full-path value)
    failed = [p.detail for r in mgi.reports() for p in r.partitions
              if str(p.detail).startswith("runtime failure")]
    assert not failed, failed
