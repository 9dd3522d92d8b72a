"""The persistent kernel on a GPU: programs resident on every SM, waits that spin, CUDA graph
replays.

Tiny transformers models (float32 and bfloat16) decode through the persistent mode and are
compared with transformers' greedy decoding; the co-residency check must pass and no wait may
give up. Skipped without CUDA (CI runs the same kernels in topological mode on the CPU).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

transformers = pytest.importorskip("transformers")


def _model(dtype, layers=2, kind="qwen3"):
    """A small Qwen3, or (``kind="qwen2"``) a Qwen2 shaped like Qwen2.5's: biases on q / k / v,
    a hidden size that is no power of two (224) and 7 heads over one KV head."""
    torch.manual_seed(0)
    if kind == "qwen2":
        config = transformers.Qwen2Config(vocab_size=512, hidden_size=224, intermediate_size=608,
                                          num_hidden_layers=layers, num_attention_heads=7,
                                          num_key_value_heads=1, max_position_embeddings=256,
                                          tie_word_embeddings=True)
    else:
        config = transformers.Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                                          num_hidden_layers=layers, num_attention_heads=8,
                                          num_key_value_heads=4, head_dim=32,
                                          max_position_embeddings=256, tie_word_embeddings=True)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize(
    ("dtype", "options"),
    [
        (torch.float32, {}),
        (torch.bfloat16, {}),
        (torch.float32, {"pipeline": False, "prefetch_task": True}),
        (torch.bfloat16, {"align_hints": False, "programs_per_sm": 1, "num_warps": 8}),
        (torch.bfloat16, {"continuations": True}),
        (torch.bfloat16, {"lookahead": True, "prefetch_distance": 4, "poll_load": True}),
        (torch.float32, {"claim_blocks": True}),
        (torch.bfloat16, {"claim_blocks": True, "trace": True}),
        (torch.bfloat16, {"program_sets": 2, "pipeline_depth": 2, "pipeline_bytes": 65536}),
    ],
)
def test_persistent_mode_matches_transformers(dtype, options):
    _check_against_transformers(dtype, options, {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen2_shaped_model_matches_transformers(dtype):
    _check_against_transformers(dtype, {}, {}, kind="qwen2")


@pytest.mark.parametrize(
    ("dtype", "tiles"),
    [
        (torch.float32, {"fuse_mlp_down": True}),
        (torch.bfloat16, {"fuse_mlp_down": True}),
        (torch.float32, {"fuse_mlp_down": True, "fuse_o_proj_heads": True}),
        (torch.bfloat16, {"fuse_mlp_down": True, "fuse_o_proj_heads": True}),
    ],
)
def test_outputs_summed_over_blocks_match_transformers(dtype, tiles):
    """``TilePolicy(fuse_mlp_down=True)`` (the down projections summed over blocks) and
    ``fuse_o_proj_heads`` (o_proj summed over the KV heads), with atomic adds, in persistent
    mode."""
    _check_against_transformers(dtype, {}, tiles)


def _check_against_transformers(dtype, options: dict, tiles: dict, kind: str = "qwen3") -> None:
    from mugraph.persistent import TilePolicy, build_decoder

    model = _model(dtype, kind=kind)
    prompt = [11, 42, 7, 300]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=16,
                             min_new_tokens=16, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    ref_logits = [x[0].float() for x in out.logits]
    decoder = build_decoder(model, 64, tiles=TilePolicy(min_blocks=64, **tiles))
    program = decoder.compile(**options)
    assert program.mode == "persistent"
    logits = program.buffer(decoder.logits)
    errors = []
    for i, token in enumerate(prompt + out.sequences[0, len(prompt):-1].tolist()):
        program.step(token)
        if i >= len(prompt) - 1:
            ref = ref_logits[i - len(prompt) + 1]
            errors.append(float((logits[0].float() - ref).norm() / ref.norm()))
    program.check_errors()
    assert program.resources["programs_per_sm"] >= 1
    assert max(errors) < (1e-4 if dtype is torch.float32 else 3e-2), errors
    if dtype is torch.float32:
        program.reset()
        assert program.generate(prompt, 16) == out.sequences[0, len(prompt):].tolist()


def test_cuda_graph_replays_decode_consecutive_tokens():
    from mugraph.persistent import TilePolicy, build_decoder

    model = _model(torch.float32, layers=1)
    decoder = build_decoder(model, 64, tiles=TilePolicy(min_blocks=64))
    program = decoder.compile()
    direct = program.generate([5, 6], 8)
    program.reset()
    program.step(5)
    program.step(6)
    program.capture()
    for _ in range(7):
        program.step()
    program.check_errors()
    assert program.history[1:9].tolist() == direct


def test_default_programs_fill_every_sm_twice_and_too_many_are_refused():
    from mugraph.persistent import TilePolicy, build_decoder
    from mugraph.persistent.runtime import PROGRAMS_PER_SM, PersistentRuntimeError

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    decoder = build_decoder(_model(torch.bfloat16, layers=1), 64, tiles=TilePolicy(min_blocks=64))
    program = decoder.compile()
    program.generate([3, 4], 2)
    assert program.resources["programs_per_sm"] >= PROGRAMS_PER_SM
    assert program.grid == (PROGRAMS_PER_SM * sms,) == (program.tasks.num_programs,)
    # more programs than threads allow (2048 per SM / 128): asked for, so refused, not shrunk
    crowded = decoder.compile(num_programs=17 * sms)
    with pytest.raises(PersistentRuntimeError, match="cannot be resident at once"):
        crowded.step(3)


def test_llama_shaped_steps_are_the_same_bits_run_after_run():
    """Nothing in the default step is summed in a run-dependent order, so teacher-forcing the
    same tokens again gives the same logits to the bit. Llama-3.2-1B's attention shape (32
    query heads of 64 over 8 KV heads): there, the KV-cache append's scratch overlapped the
    attention partials' of another program before every program got one region, and 4 of 9
    runs of the full model left run 0 within 24 steps (``benchmarks/probe_race.py``)."""
    from mugraph.persistent import build_decoder

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=1024,
                                      num_hidden_layers=4, num_attention_heads=32,
                                      num_key_value_heads=8, head_dim=64,
                                      max_position_embeddings=256, tie_word_embeddings=True)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config,
                                                              dtype=torch.bfloat16).eval()
    decoder = build_decoder(model, 64)
    program = decoder.compile()
    logits = program.buffer(decoder.logits)
    feed = torch.randint(0, 1024, (24,)).tolist()
    runs = []
    for _ in range(6):
        program.reset()
        steps = []
        for token in feed:
            program.step(token)
            steps.append(logits.clone())
        runs.append(torch.stack(steps))
    program.check_errors()
    for r, run in enumerate(runs[1:], start=1):
        differing = [i for i in range(len(feed)) if not torch.equal(run[i], runs[0][i])]
        assert not differing, f"run {r} left run 0 at steps {differing}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("nan_rows", "inf_rows", "nan_norm"),
    [((), (), False), ((3000, 1201), (77,), False), ((), (77, 2900), False), ((), (), True)],
)
def test_the_argmax_picks_torch_argmax_token_on_the_gpu(dtype, nan_rows, inf_rows, nan_norm):
    """The argmax stages in persistent mode order NaN first, then +inf, the first of equals,
    as ``torch.argmax`` does; a row of NaN gives token 0."""
    from mugraph.persistent import PersistentKernel, TilePolicy

    torch.manual_seed(2)
    vocab, hidden = 4096, 256
    emb = torch.randn(vocab, hidden, device="cuda", dtype=dtype)
    head = 0.2 * torch.randn(vocab, hidden, device="cuda", dtype=dtype)
    norm = torch.ones(1, hidden, device="cuda", dtype=dtype)
    for r in nan_rows:
        head[r] = float("nan")
    for r in inf_rows:
        head[r] = 0.0
        head[r, 0] = float("inf") * torch.sign(emb[7, 0].float())
    if nan_norm:
        norm[0, 3] = float("nan")
    pk = PersistentKernel(max_seq_len=8, tiles=TilePolicy(min_blocks=64))
    x = pk.embed_layer(pk.attach_input(emb, "embed"))
    logits = pk.lm_head_layer(x, pk.attach_input(norm, "norm"), pk.attach_input(head, "head"))
    pk.argmax_layer(logits)
    program = pk.compile()
    assert program.mode == "persistent"
    program.step(7)
    program.check_errors()
    got = program.buffer(logits).reshape(-1)
    nan = torch.tensor([i in nan_rows for i in range(vocab)], device="cuda") | nan_norm
    assert torch.equal(got.isnan(), nan)
    assert int(program.history[0]) == int(torch.argmax(got))
    if nan_rows:
        assert int(program.history[0]) == min(nan_rows)
