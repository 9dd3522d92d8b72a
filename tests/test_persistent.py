"""The persistent megakernel (issue 14): layers as μGraphs, task graphs, the runtime.

The decode tests build tiny transformers models (random weights, float32) and run their decode
steps through the persistent kernel in topological mode (Triton's CPU interpreter), against
transformers' own greedy decoding. The task-graph tests check dependencies against a brute-force
overlap of the regions each block reads and writes.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import replace

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # no GPU: the kernel runs on Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault(
    "MUGRAPH_CACHE_DIR", os.path.join(tempfile.gettempdir(), "mugraph-test-cache")
)

import mugraph  # noqa: E402
import mugraph.visualize  # noqa: E402
from mugraph.cli import main as cli_main  # noqa: E402
from mugraph.errors import DTypeError, GraphInputError, GraphStructureError, ShapeError  # noqa: E402
from mugraph.persistent import (  # noqa: E402
    PersistentKernel,
    RopeTables,
    TaskGraph,
    TilePolicy,
    block_dependencies,
    build_decoder,
    build_task_graph,
    simulate_ranks,
)
from mugraph.persistent import layers as L  # noqa: E402
from mugraph.persistent.codegen import block_invariant_ops  # noqa: E402
from mugraph.persistent.parallel import Peer  # noqa: E402
from mugraph.persistent.render import render_text, to_svg  # noqa: E402
from mugraph.persistent.taskgraph import (  # noqa: E402
    allocate_tasks,
    block_coords,
    task_ancestors,
)
from mugraph.persistent.tensors import Attached, MetaSlot, Row  # noqa: E402

transformers = pytest.importorskip("transformers")
F32 = mugraph.float32
SMALL_TILES = TilePolicy(
    weight_tile_bytes=64 * 1024, min_blocks=2, attention_chunk=16, argmax_parts=4, copy_tile=32
)


def tiny_model(kind: str, layers: int = 1, seed: int = 0, vocab: int = 96, **config_args):
    """A tiny Llama, Mistral, Qwen2 (q / k / v biases) or Qwen3 with random weights large
    enough that greedy choices are clear; ``config_args`` go to the config."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    common.update(config_args)
    if kind == "qwen3":
        config = transformers.Qwen3Config(num_key_value_heads=2, **common)
    elif kind == "qwen2":
        common.pop("head_dim")  # Qwen2's is hidden_size / heads
        config = transformers.Qwen2Config(num_key_value_heads=2, **common)
    elif kind == "mistral":
        config = transformers.MistralConfig(num_key_value_heads=2, **common)
    else:
        common.setdefault("rope_scaling", {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        })
        config = transformers.LlamaConfig(num_key_value_heads=1, **common)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    return model


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), [x[0] for x in out.logits]


# ---- decoding through the persistent runtime ---------------------------------------------------


def test_qwen3_greedy_decode_matches_transformers_over_32_steps():
    model = tiny_model("qwen3", layers=1)
    prompt = [5, 17, 42]
    ref_tokens, ref_logits = hf_greedy(model, prompt, 32)
    decoder = build_decoder(model, 40, tiles=SMALL_TILES)
    program = decoder.compile()
    assert program.mode == "topological"
    assert program.generate(prompt, 32) == ref_tokens
    # the logits of the first generated token (a fresh run, teacher-forced prompt)
    program.reset()
    for token in prompt:
        program.step(token)
    ours = program.buffer(decoder.logits)[0]
    ref = ref_logits[0]
    assert float((ours - ref).norm() / ref.norm()) < 1e-4


@pytest.mark.parametrize(
    ("kind", "config_args"),
    [
        ("qwen2", {}),
        # a window that no layer takes (layer_types: every layer full from max_window_layers)
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2}),
        ("mistral", {"sliding_window": 16}),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
                   "max_position_embeddings": 16}),
    ],
)
def test_more_model_families_decode_like_transformers(kind, config_args):
    """Qwen2 (biases on q / k / v, no QK norm; also with a sliding window that no layer
    takes), Mistral (a sliding window as long as the cache attends to every position) and a
    dynamic RoPE that never rescales within the cache: greedy tokens and logits as
    transformers'."""
    model = tiny_model(kind, layers=2, seed=3, **config_args)
    if kind == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    prompt = [7, 30, 2]
    ref_tokens, ref_logits = hf_greedy(model, prompt, 8)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile()
    assert program.generate(prompt, 8) == ref_tokens
    program.reset()
    for token in prompt:
        program.step(token)
    ours, ref = program.buffer(decoder.logits)[0], ref_logits[0]
    assert float((ours - ref).norm() / ref.norm()) < 1e-4


@pytest.mark.parametrize(
    ("kind", "config_args", "module", "match"),
    [
        ("llama", {"hidden_act": "gelu"}, None, "activation is 'gelu'"),
        ("mistral", {"sliding_window": 8}, None, "sliding window of 8 positions"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
         None, "sliding window of 8 positions"),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
                   "max_position_embeddings": 8}, None, "'dynamic' RoPE changes"),
        ("llama", {}, ("self_attn", "o_proj"), "self_attn.o_proj has a bias"),
        ("llama", {}, ("mlp", "down_proj"), "mlp.down_proj has a bias"),
        ("gpt2", {}, None, "model type 'gpt2' is not supported"),
    ],
)
def test_build_decoder_refuses_what_it_would_compute_wrongly(kind, config_args, module, match):
    """An activation other than SiLU, a sliding window shorter than the cache, a RoPE that
    rescales with the length within the cache, biases outside q / k / v and other model types
    are refused with a mugraph error, never left out."""
    if kind == "gpt2":
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=96))
    else:
        model = tiny_model(kind, **config_args)
    if module is not None:
        linear = getattr(getattr(model.model.layers[0], module[0]), module[1])
        linear.bias = torch.nn.Parameter(torch.zeros(linear.out_features))
    with pytest.raises(mugraph.UnsupportedError, match=match):
        build_decoder(model, 16, tiles=SMALL_TILES)


def test_rmsnorm_linear_layer_adds_its_bias_and_checks_its_shape():
    pk, w, norm, emb = _kernel_with_weights()
    x = pk.embed_layer(emb, name="embed")
    with pytest.raises(ShapeError, match=r"the bias must be \(1, 16\).*got \[1, 8\]"):
        pk.rmsnorm_linear_layer(x, norm, w, bias=pk.attach_input(torch.randn(8), "b8"),
                                name="short_bias")
    bias = pk.attach_input(torch.randn(16), "bias")  # a 1-D tensor is a (1, n) row
    out = pk.rmsnorm_linear_layer(x, norm, w, bias=bias, name="proj")
    assert out.dims == (1, 16)


def test_llama_decode_logits_match_transformers_step_by_step():
    model = tiny_model("llama", layers=2, seed=1)
    prompt = [3, 9]
    ref_tokens, ref_logits = hf_greedy(model, prompt, 4)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile()
    logits = program.buffer(decoder.logits)
    for i, token in enumerate(prompt + ref_tokens[:-1]):
        program.step(token)
        if i >= len(prompt) - 1:
            ref = ref_logits[i - len(prompt) + 1]
            assert float((logits[0] - ref).norm() / ref.norm()) < 1e-4
            assert int(program.history[i]) == int(ref.argmax())
    program.check_errors()
    assert int(program.meta[MetaSlot.POS]) == len(prompt) + len(ref_tokens) - 1


def test_pipelined_loads_decode_like_transformers_with_several_blocks_per_task():
    """``pipeline``: a task's static tiles are loaded a block ahead (the first block's before
    the wait); with small weight tiles, tasks run several blocks and every carry is used."""
    model = tiny_model("llama", layers=2)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 8)
    decoder = build_decoder(model, 16, tiles=replace(SMALL_TILES, weight_tile_bytes=1024))
    program = decoder.compile(pipeline=True, num_programs=3)
    assert max(t.num_blocks for t in program.tasks.tasks) >= 3
    assert program.generate(prompt, 8) == ref_tokens


def test_program_rebuilt_for_fewer_programs_decodes_the_same():
    """When the GPU cannot keep the default number of programs resident, the runtime rebuilds
    the task graph, its arrays and tables for as many as fit (``_rebuild``); the source and the
    buffers the caller holds stay as they were."""
    model = tiny_model("qwen3", layers=1)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(num_programs=6)
    logits, source = program.buffer(decoder.logits), program.source
    program._rebuild(2)
    assert program.tasks.num_programs == 2 and program.num_programs == 2
    assert program.source == source and program.buffer(decoder.logits) is logits
    assert program.generate(prompt, 6) == ref_tokens


def test_alignment_hints_hold_for_every_address_a_task_reads():
    """``align_hints`` (on by default): a body asserts 16-byte alignment (``tl.multiple_of``)
    only of the tensors whose every address is so aligned; the decode is unchanged."""
    from mugraph.persistent.codegen import DESC_HEADER, VECTOR_BYTES

    model = tiny_model("qwen3", layers=1)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(num_programs=3)
    assert "tl.multiple_of(" in program.source
    assert "tl.multiple_of(" not in decoder.compile(align_hints=False, num_programs=3).source
    specs = {s.op: s for s in program.specs}
    desc = program.desc.cpu().numpy()
    hinted = 0
    for task in program.tasks.tasks:
        for pos, arg in enumerate(specs[task.kernel].args):
            if arg.align >= VECTOR_BYTES:
                hinted += 1
                assert int(desc[task.index, DESC_HEADER + pos]) % VECTOR_BYTES == 0
                itemsize = 4 if arg.dtype in ("tl.float32", "tl.int32") else 2
                assert arg.row_stride * itemsize % VECTOR_BYTES == 0
    assert hinted
    assert program.generate(prompt, 6) == ref_tokens


def test_address_alignment_of_views_rows_and_buffers():
    from mugraph.persistent.runtime import address_alignment
    from mugraph.persistent.tensors import Scratch

    table = torch.zeros(8, 6)  # float32 rows of 24 bytes
    assert address_alignment(Attached(table, 0), 4) == 16
    assert address_alignment(Attached(table, 1), 4) == 4
    assert address_alignment(Attached(table, 2), 4) == 8
    assert address_alignment(Row(table, MetaSlot.POS), 4) == 8
    assert address_alignment(Row(torch.zeros(8, 4), MetaSlot.POS), 4) == 16
    assert address_alignment(Scratch(), 2) == 16


def test_runtime_rejects_bad_options():
    decoder = build_decoder(tiny_model("qwen3"), 2, tiles=SMALL_TILES)
    with pytest.raises(mugraph.UnsupportedError, match="prefetch_priority"):
        decoder.compile(prefetch_priority="evict_first")
    with pytest.raises(mugraph.UnsupportedError, match="programs_per_sm"):
        decoder.compile(programs_per_sm=0)
    with pytest.raises(mugraph.UnsupportedError, match="prefetch_distance"):
        decoder.compile(prefetch_distance=0)
    for registers in (8, 256, 128.0):
        with pytest.raises(mugraph.UnsupportedError, match="max_registers"):
            decoder.compile(max_registers=registers)
    for warps in (0, 3, 64, 4.0):  # once accepted, to fail in Triton's launch on a GPU
        with pytest.raises(mugraph.UnsupportedError, match="num_warps"):
            decoder.compile(num_warps=warps)
    with pytest.raises(mugraph.UnsupportedError, match=r"unknown option\(s\) \['warps'\]"):
        decoder.compile(warps=4)  # was a TypeError from the constructor
    with pytest.raises(mugraph.UnsupportedError, match="expected a transformers causal LM"):
        build_decoder("Qwen/Qwen3-0.6B", 8)  # a name is not a model (was an AttributeError)
    with pytest.raises(mugraph.UnsupportedError, match=r"task_graph: unknown option\(s\)"):
        decoder.kernel.task_graph(8, sets=2)  # was a TypeError
    # each of these failed deep inside (ZeroDivisionError, AttributeError, TypeError)
    with pytest.raises(mugraph.MugraphError, match="TilePolicy.min_blocks must be a positive"):
        TilePolicy(min_blocks=0)
    with pytest.raises(mugraph.MugraphError, match="TilePolicy.fuse_mlp_down must be True"):
        TilePolicy(fuse_mlp_down="yes")
    with pytest.raises(GraphStructureError, match="tiles must be a TilePolicy, got dict"):
        build_decoder(tiny_model("qwen3"), 8, tiles={"min_blocks": 4})
    with pytest.raises(ShapeError, match="rank 0 is not in a world of size '2'"):
        build_decoder(tiny_model("qwen3"), 8, world_size="2")


def test_register_cap_is_a_gpu_launch_option():
    """``max_registers`` becomes Triton's ``maxnreg`` on a GPU launch; the interpreter, which
    has no registers, launches as without it (and decodes the same tokens)."""
    decoder = build_decoder(tiny_model("qwen3"), 8, tiles=SMALL_TILES)
    capped = decoder.compile(max_registers=128)
    assert capped.launch_options == {"num_warps": capped.num_warps, "num_stages": 1}
    plain = decoder.compile()
    assert capped.generate([1, 2], 3) == plain.generate([1, 2], 3)


def test_runtime_rejects_bad_steps():
    decoder = build_decoder(tiny_model("qwen3"), 2, tiles=SMALL_TILES)
    program = decoder.compile()
    with pytest.raises(GraphInputError, match="not in"):
        program.step(10**6)
    with pytest.raises(GraphInputError, match="do not fit"):
        program.generate([1, 2], 2)
    program.pos = 2
    with pytest.raises(GraphInputError, match="past the cache"):
        program.step(1)


def test_generate_takes_token_ids_and_refuses_anything_else_before_a_step():
    """A prompt is token ids: a list, or one row of an integer tensor (a tokenizer's
    ``input_ids``, shape (1, n)). Text, floats, several rows, an id outside the vocabulary
    or a non-int count are refused by name, before any step (the program stays at 0)."""
    program = build_decoder(tiny_model("qwen3", layers=1), 16, tiles=SMALL_TILES).compile()
    want = program.generate([5, 17, 42], 3)
    for prompt in (torch.tensor([[5, 17, 42]]), torch.tensor([5, 17, 42]), (5, 17, 42)):
        program.reset()
        assert program.generate(prompt, 3) == want
    program.reset()
    cases = [("hello", 3, "tokenize text first"), ([5, 1.5], 3, "1.5 is not an integer"),
             ([5, True], 3, "True is not an integer"),
             (torch.tensor([[5, 17], [1, 2]]), 3, "one row of token ids"),
             ([5, 96], 3, "prompt token 96 is not in [0, 96)"),
             ([5, -1], 3, "prompt token -1 is not in"), ([5], 2.0, "max_new_tokens must be")]
    for prompt, count, match in cases:
        with pytest.raises(GraphInputError, match=re.escape(match)):
            program.generate(prompt, count)
        assert program.pos == 0 and program.steps == 0


def test_generate_stops_after_an_eos_token():
    """With ``eos_token_id`` the decode stops after the first stop token (returned, not fed
    back): the tokens are the reference's up to it, and the program stands where a step
    feeding it would continue, which then decodes as transformers does."""
    model = tiny_model("qwen3", layers=1)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 8)
    eos = ref_tokens[3]
    cut = ref_tokens.index(eos) + 1
    program = build_decoder(model, 16, tiles=SMALL_TILES).compile()
    assert program.generate(prompt, 8, eos_token_id=eos) == ref_tokens[:cut]
    assert program.pos == len(prompt) + cut - 1
    rest = program.generate([eos], 8 - cut)  # feeding the stop token goes on as before
    assert rest == ref_tokens[cut:]
    never = next(t for t in range(96) if t not in ref_tokens)
    program.reset()
    assert program.generate(prompt, 8, eos_token_id=[never, eos]) == ref_tokens[:cut]
    program.reset()
    assert program.generate(prompt, 3, eos_token_id=never) == ref_tokens[:3]
    for bad in (-1, 96, True, 2.0, [3, "x"]):
        with pytest.raises(GraphInputError, match="eos_token_id"):
            program.generate(prompt, 2, eos_token_id=bad)


def _gpu_bodies(decoder, **options) -> dict[str, str]:
    from mugraph.persistent.codegen import PersistentOptions, generate_body
    from mugraph.persistent.runtime import kernel_specs

    opts = PersistentOptions(interpret=False, **options)
    return {s.label: generate_body(s, "body", opts).text for s in kernel_specs(decoder.kernel)}


def test_pipelined_body_loads_the_first_block_before_the_wait_and_the_next_while_computing():
    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    bodies = _gpu_bodies(decoder)  # pipelined by default
    text = next(t for label, t in bodies.items() if label.endswith("mlp.down"))
    lines = [line.strip() for line in text.splitlines()]
    wait = lines.index("if wait_evt >= 0:")
    loop = lines.index("for blk in range(first, end):")
    first = [i for i, line in enumerate(lines) if line.startswith("ahead") and "tl.load(" in line]
    assert first and first[0] < wait  # the weights stream while the task waits
    nxt = [line for line in lines[loop:] if line.startswith("ahead") and "tl.load(" in line]
    assert nxt and all("blk + 1, tl.int32) < end" in line for line in nxt)
    assert any(line.startswith("cur") and "= ahead" in line for line in lines[loop:])
    block = lines[loop:]  # the next block's coordinates, then this block's before its store
    this = block.index("pid_x = blk % 2")
    assert block.index("pid_x = (blk + 1) % 2") < this
    assert this < next(i for i, line in enumerate(block) if line.startswith("tl.store(out0_ptr"))
    # without the option, the body has no carried tiles
    plain = _gpu_bodies(decoder, pipeline=False)
    assert not any("ahead" in t for t in plain.values())


def test_pipeline_depth_loads_a_tasks_first_blocks_before_the_wait():
    """``pipeline_depth=3``: the tiles of blocks first, first + 1 and first + 2 load before
    the wait (the later two predicated on the task having them); in the loop the carried
    tiles move up one and block blk + 3's loads; the L2 prefetch goes to blk + 4."""
    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    lines = _body_lines(decoder, "mlp.down", pipeline_depth=3, prefetch=True)
    wait = lines.index("if wait_evt >= 0:")
    loop = lines.index("for blk in range(first, end):")
    before = [line for line in lines[:wait] if line.startswith("ahead")]
    assert [line.split(" = ")[0] for line in before] == ["ahead1", "ahead1_1", "ahead1_2"]
    assert "first + 1, tl.int32) < end" in before[1] and "first + 2, tl.int32) < end" in before[2]
    assert lines[loop + 1:loop + 5] == [
        "cur1 = ahead1", "ahead1 = ahead1_1", "ahead1_1 = ahead1_2", "pid_x = (blk + 3) % 2"
    ]
    far = lines[loop + 5]
    assert far.startswith("ahead1_2 = tl.load(") and "blk + 3, tl.int32" in far
    assert "if blk + 4 < end:" in lines
    # a body whose blocks' tiles exceed pipeline_bytes at that depth loads fewer ahead
    from mugraph.persistent.codegen import PersistentOptions, pipelinable_loads, pipeline_depth
    from mugraph.persistent.runtime import kernel_specs

    spec = next(s for s in kernel_specs(decoder.kernel) if s.label.endswith("mlp.down"))
    ahead = pipelinable_loads(spec, frozenset(), spec.block.forloop_range > 1)
    tile = sum(spec.block.ops[i].outputs[0].num_bytes for i in ahead)
    for budget, depth in ((3 * tile, 3), (3 * tile - 1, 2), (tile - 1, 1)):
        options = PersistentOptions(pipeline_depth=3, pipeline_bytes=budget)
        assert pipeline_depth(spec, ahead, options) == depth
    assert pipeline_depth(spec, frozenset(), PersistentOptions(pipeline_depth=3)) == 1


def test_bodies_with_a_dot_are_not_pipelined_unless_asked():
    """``pipeline_dots``: the attention partials (a ``tl.dot`` body, the kernel's heaviest in
    registers) load their KV tiles when their block starts, not a block ahead, unless asked;
    the projections stay pipelined either way."""
    from mugraph.codegen.decisions import has_dot
    from mugraph.persistent.runtime import kernel_specs

    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    dots = {s.label for s in kernel_specs(decoder.kernel) if has_dot(s.block)}
    assert any(label.endswith("attn.partials") for label in dots)
    assert not any(label.endswith(("mlp.down", "proj")) for label in dots)
    plain, piped = _gpu_bodies(decoder), _gpu_bodies(decoder, pipeline_dots=True)
    partials = next(label for label in dots if label.endswith("attn.partials"))
    assert "ahead" not in plain[partials] and "ahead" in piped[partials]
    down = next(label for label in plain if label.endswith("mlp.down"))
    assert "ahead" in plain[down] and plain[down] == piped[down]
    with pytest.raises(mugraph.UnsupportedError, match="pipeline_dots"):
        decoder.compile(pipeline_dots="yes")


def test_first_block_early_loads_the_partials_kv_tiles_before_the_wait():
    """``first_block_early``: the attention partials (no tiles loaded ahead) load their first
    block's KV-cache tiles and mask row before the wait, which that block takes; a later block
    loads its own; the query (written in this step) stays after the wait; no other body
    changes, and the decode is transformers' (interpreter, topological)."""
    from mugraph.persistent.runtime import kernel_specs

    model = tiny_model("qwen3", layers=2)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    plain, early = _gpu_bodies(decoder), _gpu_bodies(decoder, first_block_early=True)
    partials = next(label for label in plain if label.endswith("attn.partials"))
    changed = {label for label in plain if plain[label] != early[label]}
    assert changed and all(label.endswith("attn.partials") for label in changed)
    lines = [line.strip() for line in early[partials].splitlines()]
    wait = lines.index("if wait_evt >= 0:")
    heads = [i for i, line in enumerate(lines) if line.startswith("head")]
    spec = next(s for s in kernel_specs(decoder.kernel) if s.label == partials)
    assert len(heads) >= 2 and all(i < wait for i in heads)  # the K and V tiles (the mask row)
    for i in heads:
        p = lines[i].split(" = ")[0][len("head"):]
        at = lines.index(f"tile{p} = head{p}")
        assert lines[at - 1] == "if blk == first:" and lines[at + 1] == "else:"
        assert lines[at + 2].startswith(f"tile{p} = tl.load(")
    assert not any(".cg" in lines[i] for i in heads)  # static inputs only
    assert len(spec.static_inputs) < len(spec.args)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 4)
    assert decoder.compile(first_block_early=True).generate(prompt, 4) == ref_tokens
    with pytest.raises(mugraph.UnsupportedError, match="first_block_early"):
        decoder.compile(first_block_early="yes")


@pytest.mark.parametrize("switch", ["prefetch", "pipeline", "hoist", "cuda_graph", "trace",
                                    "continuations", "align_hints", "early_triggers"])
def test_on_off_options_must_be_bools(switch):
    """A switch given anything but True or False (a string, 1, None) is refused with an error
    that names it, rather than read as truthy."""
    decoder = build_decoder(tiny_model("llama", layers=1), 16, tiles=SMALL_TILES)
    for bad in ("no", 1, None):
        with pytest.raises(mugraph.UnsupportedError, match=f"{switch} must be True or False"):
            decoder.compile(**{switch: bad})


def test_separate_bodies_are_functions_of_their_own_and_decode_the_same():
    """``separate_bodies`` (the default): every task body is a ``noinline`` function the
    dispatcher calls; the decode is the same as with inlined bodies."""
    from mugraph.persistent.codegen import PersistentOptions
    from mugraph.persistent.runtime import kernel_specs, program_source

    model, prompt = tiny_model("qwen3", layers=1), [5, 17, 42]
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    specs = kernel_specs(decoder.kernel)
    plain = program_source(specs, PersistentOptions(interpret=False, separate_bodies=False))
    apart = program_source(specs, PersistentOptions(interpret=False))
    bodies = re.findall(r"def (mg_task\d+)\(desc,", apart)
    assert bodies and "noinline" not in plain
    assert all(f"@triton.jit(noinline=True)\ndef {b}(desc," in apart for b in bodies)
    assert apart.count("noinline=True") == len(bodies)  # the prefetch helpers stay inlined
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    assert decoder.compile().generate(prompt, 6) == ref_tokens
    assert decoder.compile(separate_bodies=False).generate(prompt, 6) == ref_tokens


def test_decode_with_tiles_loaded_three_blocks_ahead_matches_transformers():
    model, prompt = tiny_model("qwen3", layers=1), [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(pipeline_depth=3)
    assert re.search(r"ahead\d+_2 = tl\.load\(", program.source)
    assert program.generate(prompt, 6) == ref_tokens
    for bad in (0, 9, True, 2.0):
        with pytest.raises(mugraph.UnsupportedError, match="pipeline_depth"):
            decoder.compile(pipeline_depth=bad)
    with pytest.raises(mugraph.UnsupportedError, match="pipeline_depth"):
        decoder.compile(pipeline_depth=2, claim_blocks=True)


def test_program_sets_with_a_tasks_blocks_loaded_ahead_match_transformers():
    """Two program sets taking the levels in turn, each task's first two blocks loaded before
    its wait (``pipeline_bytes`` raised so that two blocks fit): the same greedy tokens. A
    ``pipeline_bytes`` under one block's tiles still loads one block ahead."""
    model, prompt = tiny_model("qwen3", layers=1), [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(program_sets=2, pipeline_depth=2, pipeline_bytes=64 * 1024)
    assert program.options.pipeline_bytes == 64 * 1024
    assert re.search(r"ahead\d+_1 = tl\.load\(", program.source)
    assert program.generate(prompt, 6) == ref_tokens
    tight = decoder.compile(pipeline_depth=2, pipeline_bytes=1)
    assert "ahead" in tight.source and not re.search(r"ahead\d+_1 = ", tight.source)
    for bad in (0, -4096, True, 4096.0, "64k"):
        with pytest.raises(mugraph.UnsupportedError, match="pipeline_bytes"):
            decoder.compile(pipeline_bytes=bad)


def test_each_program_owns_one_scratch_region_whatever_body_runs():
    """Tasks of different bodies run at the same time on different programs, so a program's
    scratch must not depend on its body: the dispatcher gives each program the largest body's
    need, and no body places its scratch by the program itself. (Placed at ``program * its
    own need``, a tiny Llama's KV-cache append (80 elements) would overlap the next program's
    attention partials (96): on the H100, Llama-3.2-1B's steps differed from run to run.)"""
    from mugraph.persistent.codegen import PersistentOptions
    from mugraph.persistent.runtime import kernel_specs, program_source, task_bodies

    decoder = build_decoder(tiny_model("llama", layers=1), 16, tiles=SMALL_TILES)
    specs = kernel_specs(decoder.kernel)
    for interpret in (False, True):
        options = PersistentOptions(interpret=interpret)
        _, bodies = task_bodies(specs, options)
        needs = [b.scratch for b in bodies if b.scratch]
        assert len(set(needs)) > 1, "the case of the bug: bodies with different needs"
        source = program_source(specs, options)
        assert re.findall(r"scratch_ptr = scratch_ptr \+ program \* (\d+)", source) == [
            str(max(needs))
        ]
        assert source.count("scratch_blk = scratch_ptr\n") == len(needs)
        assert not re.search(r"scratch_blk = .*program", source)
    program = decoder.compile()
    assert program.scratch.numel() == max(needs) * program.num_programs


def _body_lines(decoder, kernel: str, **options) -> list[str]:
    """The stripped lines of the GPU-mode body of the kernel whose label ends with ``kernel``."""
    text = next(t for label, t in _gpu_bodies(decoder, **options).items() if label.endswith(kernel))
    return [line.strip() for line in text.splitlines()]


def test_norm_weights_are_loaded_before_the_wait():
    """``early_static``: a task's static tiles that are the same in every block (the norm's
    weight and epsilon) are loaded before its wait; the row it normalises, written in this
    step, after it. Without the option every hoisted load follows the wait."""
    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    for early in (True, False):
        lines = _body_lines(decoder, "mlp.gate_up", early_static=early)
        wait = lines.index("if wait_evt >= 0:")
        loads = [i for i, line in enumerate(lines) if line.startswith("early")]
        row = next(i for i, line in enumerate(lines) if "in0_ptr +" in line and "tl.load" in line)
        assert row > wait
        if early:
            assert len(loads) == 2 and all(i < wait for i in loads)  # norm weight and eps
            used = {line.split(" = ")[1] for line in lines if " = early" in line}
            assert used == {lines[i].split(" =")[0] for i in loads}
        else:
            assert not loads


def test_a_task_reads_its_trigger_table_before_the_wait():
    """``early_triggers``: the trigger's event is read before the wait, so that the release
    atomic follows the task's last store with no load between them."""
    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    for early in (True, False):
        lines = _body_lines(decoder, "mlp.down", early_triggers=early)
        wait = lines.index("if wait_evt >= 0:")
        table = [i for i, line in enumerate(lines) if line.startswith("trig_")]
        assert len(table) == (3 if early else 2)
        assert all(i < wait for i in table) == early
        atomic = 'tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")'
        assert (atomic in lines) == early
        assert lines[lines.index("tl.debug_barrier()") + 1].startswith("if trig_first") == early


def test_a_blocks_residual_is_loaded_before_its_dot_product():
    """``loads_first``: a block loads its tile of a tensor written in this step (the down
    projection's residual) at its start, before the reduction of its dot product; without the
    option, where it is first used, after it."""
    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    for first in (True, False):
        lines = _body_lines(decoder, "mlp.down", loads_first=first)
        loop = lines.index("for blk in range(first, end):")
        residual = next(
            i for i, line in enumerate(lines) if "tl.load(in2_ptr" in line and i > loop
        )
        dot = next(i for i, line in enumerate(lines) if "tl.sum(" in line and i > loop)
        assert (residual < dot) == first
        assert lines[residual].startswith("tile2 = ") == first


def test_decode_with_the_loads_and_triggers_where_they_were_matches_transformers():
    model = tiny_model("qwen3", layers=1)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(
        early_static=False, loads_first=False, early_triggers=False, desc_by_position=False
    )
    assert program.generate(prompt, 6) == ref_tokens


def test_decode_with_kinds_read_a_task_ahead_matches_transformers():
    """``prefetch_ahead`` (the default) in the interpreter (which prefetches nothing): each
    task's kind comes from the previous iteration's read, as on the GPU, and the decode is
    as transformers', as it is with the plain ladder; asked for explicitly where it does not
    combine, it is refused."""
    # (a tiny Llama's EOS, token 2, is what transformers' min_new_tokens holds back: these
    # prompts keep it from being the argmax, as in the tests above)
    for model, prompt in ((tiny_model("qwen3", layers=1), [5, 17, 42]),
                          (tiny_model("llama", layers=2, seed=1), [3, 9])):
        ref_tokens, _ = hf_greedy(model, prompt, 6)
        decoder = build_decoder(model, 16, tiles=SMALL_TILES)
        program = decoder.compile()  # the default; True asks for it explicitly
        assert "kind_c = pkind_c" in program.source
        assert program.generate(prompt, 6) == ref_tokens
        plain = decoder.compile(prefetch_ahead=False)  # the dispatcher's plain ladder
        assert "kind_c" not in plain.source and plain.generate(prompt, 6) == ref_tokens
    decoder = build_decoder(tiny_model("llama", layers=1), 16, tiles=SMALL_TILES)
    for other in ({"lookahead": True}, {"continuations": True}, {"prefetch_task": True},
                  {"desc_by_position": False}):
        with pytest.raises(mugraph.UnsupportedError, match="prefetch_ahead"):
            decoder.compile(prefetch_ahead=True, **other)
    for bad in (1, 0, 1.0, "yes"):
        with pytest.raises(mugraph.UnsupportedError, match="prefetch_ahead must be"):
            decoder.compile(prefetch_ahead=bad)


def test_prefetch_distance_keeps_blocks_in_flight_from_the_task_start():
    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    default = next(t for label, t in _gpu_bodies(decoder, prefetch=True).items()
                   if label.endswith("mlp.down"))
    far = next(
        t
        for label, t in _gpu_bodies(decoder, prefetch=True, prefetch_distance=4).items()
        if label.endswith("mlp.down")
    )
    assert "if blk + 2 < end:" in default and "pblk" not in default
    lines = [line.strip() for line in far.splitlines()]
    wait = lines.index("if wait_evt >= 0:")
    start = lines.index("for pblk in range(first + 2, tl.minimum(first + 4, end)):")
    assert start < wait and lines[start + 1] == "body_prefetch(desc, pblk, pos, meta_ptr)"
    assert "if blk + 4 < end:" in lines
    plain = next(t for label, t in _gpu_bodies(decoder, prefetch=True, pipeline=False).items()
                 if label.endswith("mlp.down"))
    assert "if blk + 1 < end:" in plain and "pblk" not in plain


def test_lookahead_dispatcher_reads_entries_ahead_and_prefetches_inside_the_wait():
    from mugraph.persistent.codegen import PersistentOptions
    from mugraph.persistent.runtime import kernel_specs, program_source

    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    specs = kernel_specs(decoder.kernel)
    ahead = program_source(specs, PersistentOptions(interpret=False, prefetch=True,
                                                    lookahead=True))
    lines = [line.strip() for line in ahead.splitlines()]
    assert "ahead = tl.load(queue_ptr + qi + 1, mask=qi + 1 < q_end, other=-1)" in lines
    assert "kind = entry & 255" in lines and "entry = ahead" in lines
    assert "def mg_prefetch_next(nxt, nkind, pos, meta_ptr):" in lines
    call = lines.index("mg_prefetch_next(nxt, nkind, pos, meta_ptr)")
    assert lines[call - 1].startswith("if (tl.atomic_add(evt_ptr + wait_evt")  # not yet fired
    assert "pnxt" not in ahead  # the dispatcher itself prefetches nothing
    plain = program_source(specs, PersistentOptions(interpret=False, prefetch=True,
                                                    prefetch_ahead=False))
    assert "mg_prefetch_next" not in plain and "pnxt = desc + " in plain
    assert "kind = tl.load(desc + 0).to(tl.int32)" in plain


def test_prefetch_ahead_carries_the_next_tasks_prefetch_fields():
    """``prefetch_ahead``: the fields of task qi + 2 are read at the top of task qi's
    iteration and carried; task qi + 1's L2 prefetch, before qi's body, takes those read an
    iteration earlier (no load between the loop's top and the body); the task's kind is the
    carried one."""
    from mugraph.persistent.codegen import PersistentOptions
    from mugraph.persistent.runtime import kernel_specs, program_source

    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    specs = kernel_specs(decoder.kernel)
    text = program_source(specs, PersistentOptions(interpret=False, prefetch=True))
    lines = [line.strip() for line in text.splitlines()]
    top = lines.index("for qi in range(q_first, q_end):")
    assert lines[top - 1].startswith("f") and "(q_first + 1) *" in lines[top - 1]
    kind = next(i for i, line in enumerate(lines) if line.startswith("kind_c = tl.load("))
    assert kind < top and "desc_ptr + q_first *" in lines[kind]
    first_body = next(i for i, line in enumerate(lines) if line.startswith("if kind_c == "))
    loop = lines[top + 1:first_body]
    reads = [line for line in loop if "tl.load(" in line]
    assert reads and all("(qi + 2) *" in line and "_n = " in line for line in reads)
    calls = [line for line in loop if "_prefetch_at(" in line]
    assert calls and all(", pfirst_c, pos, meta_ptr)" in line for line in calls)
    assert all(re.fullmatch(r"mg_task\d+_prefetch_at\((f\d+_c, )+pfirst_c, pos, meta_ptr\)",
                            line) for line in calls)
    assert "kind_c = pkind_c" in lines and "pkind_c = pkind_n" in lines
    assert "pnxt" not in text  # the plain ladder is gone
    # the body's own prefetches (blocks ahead) read the descriptor, through the same function
    assert re.search(r"def (mg_task\d+)_prefetch\(desc, blk, pos, meta_ptr\):\n\s+\1"
                     r"_prefetch_at\(tl\.load\(desc \+ \d+\)", text)
    plain = program_source(specs, PersistentOptions(interpret=False, prefetch=True,
                                                    prefetch_ahead=False))
    assert "_prefetch_at" not in plain and "kind_c" not in plain
    # where it does not combine (the whole next task prefetched), the plain ladder
    whole = program_source(specs, PersistentOptions(interpret=False, prefetch=True,
                                                    prefetch_task=True))
    assert "_prefetch_at" not in whole and "kind_c" not in whole


def test_descriptors_are_stored_in_queue_order():
    """The dispatcher finds a queued task's descriptor at its queue position (no read of the
    queue entry first); the continuations' descriptors follow, and the trigger table and
    queue entries name descriptors by that row."""
    from mugraph.persistent.codegen import FIELD_TASK, QUEUE_KIND_BITS, TRIGGER_FIELDS

    decoder = build_decoder(tiny_model("llama"), 16, tiles=SMALL_TILES)
    for continuations in (False, True):
        program = decoder.compile(num_programs=3, continuations=continuations)
        tg = program.tasks
        queues = tg.queues if program.mode == "persistent" else [tg.queued_order]
        queued = [t for q in queues for t in q]
        rows = program.desc[:, FIELD_TASK].cpu().tolist()
        assert rows == queued + sorted(tg.continuations)
        entries = program.queue.cpu().tolist()
        assert [e >> QUEUE_KIND_BITS for e in entries] == list(range(len(queued)))
        follows = program.triggers.view(-1, TRIGGER_FIELDS)[:, 1].cpu().tolist()
        assert {rows[f] for f in follows if f >= 0} == set(tg.continuations)
        assert ("desc = desc_ptr + qi * " in program.source) != continuations


def test_queue_entries_pack_task_and_kind():
    from mugraph.persistent.codegen import QUEUE_KIND_BITS
    from mugraph.persistent.runtime import queue_entry

    assert queue_entry(5, 3) == 5 << QUEUE_KIND_BITS | 3
    with pytest.raises(mugraph.UnsupportedError, match="queue entry"):
        queue_entry(1, 1 << QUEUE_KIND_BITS)
    with pytest.raises(mugraph.UnsupportedError, match="queue entry"):
        queue_entry(1 << 24, 0)


def test_l2_stream_plans_the_projection_weights_into_the_descriptors(monkeypatch):
    """``l2_stream``: the weights streamed are the projections' (no KV cache, no norm weight
    under the size floor), the descriptors carry each task's ranges, and the interpreter, which
    issues none, decodes as transformers."""
    import mugraph.persistent.stream as stream
    from mugraph.persistent.codegen import FIELD_TASK
    from mugraph.persistent.runtime import kernel_specs

    monkeypatch.setattr(stream, "MIN_BYTES", 2048)  # the tiny model's projections
    model = tiny_model("qwen3", layers=2)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 4)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    regions = stream.stream_regions(decoder.kernel, kernel_specs(decoder.kernel))
    names = {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}
    streamed = {names[a].split(".")[-2] for rs in regions.values() for a, _ in rs}
    assert streamed == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj", "embed_tokens"}  # the LM head is the tied embedding
    program = decoder.compile(l2_stream=1)
    assert program.stream and "mg_l2_stream" not in program.source  # the interpreter
    field = program.options.stream_field
    assert program.desc_width == decoder.compile().desc_width + 2 * stream.SLOTS
    desc = program.desc.cpu()
    for row in range(desc.shape[0]):
        ranges = program.stream.get(int(desc[row, FIELD_TASK]), [])
        want = [v for r in ranges for v in r] + [0] * (2 * (stream.SLOTS - len(ranges)))
        assert desc[row, field:field + 2 * stream.SLOTS].tolist() == want
    assert program.generate(prompt, 4) == ref_tokens
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(mugraph.UnsupportedError, match="l2_stream must be"):
            decoder.compile(l2_stream=bad)
    for other in ({"lookahead": True}, {"continuations": True}, {"prefetch_task": True},
                  {"desc_by_position": False}, {"prefetch_ahead": False}):
        with pytest.raises(mugraph.UnsupportedError, match="l2_stream needs"):
            decoder.compile(l2_stream=2, **other)
    down = stream.stream_regions(decoder.kernel, kernel_specs(decoder.kernel), ("*.down_proj",))
    assert {names[a].split(".")[-2] for rs in down.values() for a, _ in rs} == {"down_proj"}
    only_down = decoder.compile(l2_stream=1, l2_stream_names=["*.down_proj"])
    pieces = [r for rs in only_down.stream.values() for r in rs]
    assert pieces and all(any(a <= p < p + n <= a + m for rs in down.values() for a, m in rs)
                          for p, n in pieces)  # every piece inside a down projection
    assert sum(n for _, n in pieces) == sum(m for rs in down.values() for _, m in rs)
    for bad in ((), "*.down_proj", ("",), (3,)):
        with pytest.raises(mugraph.UnsupportedError, match="l2_stream_names must be"):
            decoder.compile(l2_stream=1, l2_stream_names=bad)
    with pytest.raises(mugraph.UnsupportedError, match="no weight to stream.*dwn_proj"):
        decoder.compile(l2_stream=1, l2_stream_names=("*.dwn_proj",))
    for alone in ({"l2_stream_after": True}, {"l2_stream_names": ("*.down_proj",)}):
        with pytest.raises(mugraph.UnsupportedError, match="need l2_stream >= 1"):
            decoder.compile(**alone)


def test_l2_stream_ranges_are_read_a_task_ahead_and_issued_before_the_body():
    """On the GPU the dispatcher reads task qi + 1's ranges with the kinds and issues task
    qi's (read an iteration earlier) before its body: one thread's bulk L2 prefetch each."""
    from mugraph.persistent.codegen import STREAM_SLOTS, PersistentOptions
    from mugraph.persistent.runtime import descriptor_width, kernel_specs, program_source

    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    specs = kernel_specs(decoder.kernel)
    assert "mg_l2_stream" not in program_source(specs, PersistentOptions(interpret=False))
    field = descriptor_width(specs)  # the fields follow the addresses
    width = field + 2 * STREAM_SLOTS
    text = program_source(specs, PersistentOptions(interpret=False, stream_field=field))
    assert "@p cp.async.bulk.prefetch.L2.global [$1], $2;" in text
    lines = [line.strip() for line in text.splitlines()]
    top = lines.index("for qi in range(q_first, q_end):")
    first_body = next(i for i, line in enumerate(lines) if line.startswith("if kind_c == "))
    issued = [i for i, line in enumerate(lines) if line.startswith("mg_l2_stream(")]
    assert len(issued) == STREAM_SLOTS and all(top < i < first_body for i in issued)
    assert lines[issued[0]] == "mg_l2_stream(sa0_c, sb0_c)"
    reads = [line for line in lines[top:first_body] if line.startswith("sa0_n = ")]
    assert reads == [f"sa0_n = tl.load(desc_ptr + (qi + 1) * {width} + {field} + 0, "
                     "mask=qi + 1 < q_end, other=0)"]
    assert "sa0_c = sa0_n" in lines and "sb1_c = sb1_n" in lines
    with pytest.raises(mugraph.UnsupportedError, match="l2_stream needs"):
        program_source(specs, PersistentOptions(interpret=False, stream_field=field,
                                                lookahead=True))
    after = program_source(specs, PersistentOptions(interpret=False, stream_field=field,
                                                     stream_after_body=True))
    lines = [line.strip() for line in after.splitlines()]
    last_body = max(i for i, line in enumerate(lines) if line.startswith("if kind_c == "))
    issued = [i for i, line in enumerate(lines) if line.startswith("mg_l2_stream(")]
    assert len(issued) == STREAM_SLOTS and all(i > last_body + 1 for i in issued)
    assert issued[-1] < lines.index("kind_c = pkind_c")  # task qi's, before the shift to qi + 1


def test_l2_prefetches_are_off_by_default_use_normal_priority_and_can_cover_the_next_task():
    from mugraph.persistent.codegen import BodySource, PersistentOptions, generate_program

    decoder = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES)
    assert "prefetch.global" not in "\n".join(_gpu_bodies(decoder).values())
    text = "\n".join(_gpu_bodies(decoder, prefetch=True).values())
    assert "prefetch.global.L2::evict_normal" in text and "evict_last [" not in text
    lasting = "\n".join(
        _gpu_bodies(decoder, prefetch=True, prefetch_priority="evict_last").values())
    assert "prefetch.global.L2::evict_last" in lasting
    body = BodySource("mg_task0", "mg_task0_prefetch", "", 0)
    first_only = generate_program([body], 16, "k", PersistentOptions(
        interpret=False, prefetch=True, prefetch_ahead=False))
    whole = generate_program([body], 16, "k", PersistentOptions(
        interpret=False, prefetch=True, prefetch_task=True))
    assert "nend = nfirst + 1" in first_only
    assert "nend = nfirst + tl.load(pnxt + 2).to(tl.int32)" in whole
    assert "for nblk in range(nfirst, nend):" in whole


# ---- the layers are μGraphs ---------------------------------------------------------------------


def _naive_rmsnorm_linear(k: int, n: int, eps: float):
    g = mugraph.new_kernel_graph()
    x = g.new_input((1, k), dtype=F32)
    norm = g.new_input((1, k), dtype=F32)
    e = g.new_input((1, 1), dtype=F32)
    w = g.new_input((n, k), dtype=F32)
    ms = g.mul_scalar(g.reduction(g.square(x), 1), 1.0 / k)
    xn = g.mul(g.div(x, g.sqrt(g.add(ms, e))), norm)
    g.mark_output(g.reshape(g.reduction(g.mul(w, xn), 1), (1, n)))
    return g


def test_layer_kernels_verify_against_naive_programs():
    g = mugraph.new_kernel_graph()
    x = g.new_input((1, 64), dtype=F32)
    norm = g.new_input((1, 64), dtype=F32)
    e = g.new_input((1, 1), dtype=F32)
    w = g.new_input((32, 64), dtype=F32)
    g.mark_output(L.rmsnorm_linear(g, x, norm, e, w, L.GemvTiles(8)))
    result = mugraph.verify(g, _naive_rmsnorm_linear(64, 32, 1e-6), max_rounds=8, seed=0)
    assert result.passed, str(result)
    wrong = mugraph.new_kernel_graph()
    xs = [wrong.new_input(t.dims, dtype=F32) for t in (x, norm, e, w)]
    wrong.mark_output(L.linear_partial(wrong, xs[0], xs[3], L.GemvTiles(8)))  # no norm
    assert not mugraph.verify(
        wrong, _naive_rmsnorm_linear(64, 32, 1e-6), max_rounds=8, seed=0
    ).passed


def test_attention_kernels_compute_attention_with_the_reference_semantics():
    """The three attention kernels, evaluated with mugraph's reference semantics, equal
    softmax attention (with RoPE) of the current token over the cache and itself."""
    from mugraph.semantics.interpret import run_kernel_graph
    from mugraph.semantics.reference import REFERENCE

    rng = np.random.default_rng(0)
    heads, kv, d, seq, pos = 4, 2, 8, 16, 5
    shape = L.AttentionShape(heads, kv, d, seq, chunk=4)
    g = mugraph.new_kernel_graph()
    q, k, v = (g.new_input((1, n * d), dtype=F32) for n in (heads, kv, kv))
    kt = g.new_input((kv * d, seq), dtype=F32)
    vc = g.new_input((seq, kv * d), dtype=F32)
    mask = g.new_input((1, seq), dtype=F32)
    group = heads // kv
    rows = [
        g.new_input(dims, dtype=F32)
        for dims in ((1, d), (1, d), (2 * group, 2 * group), (2, 2), (1, 1))
    ]
    hi = L.HeadInputs(*rows, q_norm=None, k_norm=None)
    o_part, l_part = L.attention_partials(g, q, kt, vc, mask, hi, shape)
    o_new, l_new, k_row, v_row = L.attention_new_token(g, q, k, v, hi, shape)
    g.mark_output(L.attention_combine(g, o_part, l_part, o_new, l_new, shape))
    g.mark_output(k_row)
    angle = rng.uniform(0, 3, d // 2)
    cos = np.concatenate([np.cos(angle)] * 2)[None]
    sin = np.concatenate([np.sin(angle)] * 2)[None]
    vals = {
        "q": rng.normal(size=(1, heads * d)),
        "k": rng.normal(size=(1, kv * d)),
        "v": rng.normal(size=(1, kv * d)),
        "kc": rng.normal(size=(seq, kv * d)),
        "vc": rng.normal(size=(seq, kv * d)),
    }
    m = np.where(np.arange(seq) < pos, 0.0, -np.inf)[None]
    inputs = [
        vals["q"],
        vals["k"],
        vals["v"],
        vals["kc"].T,
        vals["vc"],
        m,
        cos,
        sin,
        L.rotate_half_pairs(group).astype(np.float64),
        L.rotate_half_pairs(1).astype(np.float64),
        np.array([[1e-6]]),
    ]
    out, k_out = run_kernel_graph(REFERENCE, g.ops, g.outputs, inputs)

    def rope(x):
        half = d // 2
        return x * cos + np.concatenate([-x[:, half:], x[:, :half]], 1) * sin

    kr = rope(vals["k"].reshape(kv, d))
    keys = np.concatenate([vals["kc"][:pos].reshape(pos, kv, d), kr[None]], 0)
    values = np.concatenate([vals["vc"][:pos].reshape(pos, kv, d), vals["v"].reshape(1, kv, d)], 0)
    qs = rope(vals["q"].reshape(heads, d))
    expect = []
    for h in range(heads):
        s = keys[:, h // (heads // kv)] @ qs[h] / np.sqrt(d)
        p = np.exp(s - s.max())
        expect.append(p / p.sum() @ values[:, h // (heads // kv)])
    np.testing.assert_allclose(out, np.concatenate(expect)[None], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(k_out, kr.reshape(1, -1), rtol=1e-12)


def test_rotate_half_pairs_rotate_each_row_by_halves():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 8))
    halves = L.rotate_half_pairs(3).astype(np.float64) @ x.reshape(6, 4)
    expect = np.concatenate([-x[:, 4:], x[:, :4]], 1)  # transformers' rotate_half
    np.testing.assert_array_equal(halves.reshape(3, 8), expect)


def test_attention_layers_reject_rope_inputs_of_the_wrong_shape():
    heads, kv, d, seq = 4, 2, 8, 16
    shape = L.AttentionShape(heads, kv, d, seq, chunk=4)
    g = mugraph.new_kernel_graph()
    q, k, v = (g.new_input((1, n * d), dtype=F32) for n in (heads, kv, kv))
    rows = [g.new_input(dims, dtype=F32) for dims in ((1, d), (1, d), (d, d), (2, 2), (1, 1))]
    with pytest.raises(ShapeError, match=r"rot_q must be \[4, 4\]"):
        L.attention_new_token(g, q, k, v, L.HeadInputs(*rows, q_norm=None, k_norm=None), shape)


def test_persistent_kernel_graph_is_printable_and_drawable():
    decoder = build_decoder(tiny_model("qwen3"), 8, tiles=SMALL_TILES)
    pk = decoder.kernel
    text = str(pk.graph)
    assert "customized" in text
    assert mugraph.visualize.to_svg(pk.graph).startswith("<svg")
    assert "layer0.attn" in str(pk)
    parts = {role.part for role in pk.roles.values()}
    assert {"copy", "proj", "partials", "new_token", "gate_up", "down", "partial",
            "final"} <= parts
    assert "combine_proj" not in parts  # the attention output is combined apart by default
    fused = build_decoder(tiny_model("qwen3"), 8,
                          tiles=replace(SMALL_TILES, fuse_attention_output=True))
    assert "combine_proj" in {role.part for role in fused.kernel.roles.values()}


def test_block_invariant_values_are_hoisted():
    g = mugraph.new_kernel_graph()
    x = g.new_input((1, 64), dtype=F32)
    norm = g.new_input((1, 64), dtype=F32)
    e = g.new_input((1, 1), dtype=F32)
    w = g.new_input((32, 64), dtype=F32)
    out = L.rmsnorm_linear(g, x, norm, e, w, L.GemvTiles(8))
    block = g.ops[out.ref.op].attr("graph")
    hoisted = block_invariant_ops(block)
    kinds = {block.ops[i].kind for i in hoisted}
    assert mugraph.OpKind.SQRT in kinds  # the norm of x: the same for every block
    assert all(
        block.ops[i].kind is not mugraph.OpKind.REDUCTION
        or block.ops[block.ops[i].inputs[0].op].kind is mugraph.OpKind.SQUARE
        for i in hoisted
    )  # the row-dot with W is per block
    w_input = next(
        i
        for i, op in enumerate(block.ops)
        if op.kind is mugraph.OpKind.BLOCK_INPUT and op.attr("index") == 3
    )
    assert w_input not in hoisted


def test_gpu_loads_of_tiles_written_this_step_read_l2_with_no_eviction_policy():
    """On a GPU a task loads the tiles written in this step with ``.cg`` (L2 only), which
    ptxas refuses beside an L1 eviction policy: "Modifier '.evict_first' cannot be combined
    with modifier '.cg'" stopped both models' persistent kernels from compiling on the H100
    (sixteenth session). Weights and caches keep their evict-first streaming."""
    decoder = build_decoder(tiny_model("qwen3", layers=1), 16, tiles=SMALL_TILES)
    loads = [line for text in _gpu_bodies(decoder, cache_hint=True).values()
             for line in text.splitlines() if "tl.load(in" in line]
    l2_only = [line for line in loads if 'cache_modifier=".cg"' in line]
    assert l2_only and not any("eviction_policy" in line for line in l2_only)
    assert any('eviction_policy="evict_first"' in line for line in loads)


# ---- task graphs --------------------------------------------------------------------------------


def _norm_then_projection(m: int, k: int, n: int, row_tile: int, col_tile: int):
    """rms_norm by row blocks, then a projection tiled over (columns, rows)."""
    g = mugraph.new_kernel_graph()
    x = g.new_input((m, k), dtype=F32)
    w = g.new_input((k, n), dtype=F32)
    tb = mugraph.new_threadblock_graph((m // row_tile, 1, 1))
    t = tb.new_input(x, (0, -1, -1), -1)
    tb.new_output(tb.rms_norm(t), (0, -1, -1))
    (xn,) = g.customized([x], tb)
    tb2 = mugraph.new_threadblock_graph((n // col_tile, m // row_tile, 1))
    a = tb2.new_input(xn, (-1, 0, -1), -1)
    b = tb2.new_input(w, (1, -1, -1), -1)
    tb2.new_output(tb2.matmul(a, b), (1, 0, -1))
    (y,) = g.customized([xn, w], tb2)
    tb3 = mugraph.new_threadblock_graph((1, 1, 1), forloop_range=2)
    c = tb3.new_input(y, (-1, -1, -1), 1)
    tb3.new_output(tb3.forloop_accum(c, "sum"), (-1, -1, -1))
    (z,) = g.customized([y], tb3)
    g.mark_output(z)
    return g


def _brute_force(graph) -> dict:
    """Producer blocks of every block, by comparing element masks of reads and writes."""
    from mugraph.semantics.partition import assemble_output, split_input

    writes: dict[tuple[int, int], list[np.ndarray]] = {}
    for k, op in enumerate(graph.ops):
        if op.kind is not mugraph.OpKind.CUSTOMIZED:
            continue
        block = op.attr("graph")
        for j in range(len(op.outputs)):
            tile = block.tensor_type(block.output_ops[j].inputs[0]).dims
            loops = block.forloop_range if block.output_ops[j].attr("forloop_dim") >= 0 else 1
            masks = []
            for b in range(block.num_blocks):
                lead = np.zeros((loops, *block.grid_dim, *tile), dtype=bool)
                lead[(slice(None), *block_coords(block.grid_dim, b))] = True
                masks.append(
                    assemble_output(
                        lead,
                        tile,
                        block.grid_dim,
                        block.output_ops[j].attr("omap"),
                        block.forloop_range,
                        block.output_ops[j].attr("forloop_dim"),
                    )
                )
            writes[(k, j)] = masks
    deps = {}
    for k, op in enumerate(graph.ops):
        if op.kind is not mugraph.OpKind.CUSTOMIZED:
            continue
        block = op.attr("graph")
        for b in range(block.num_blocks):
            found = set()
            for ref, inp in zip(op.inputs, block.input_ops, strict=True):
                if (ref.op, ref.index) not in writes:
                    continue
                index = np.arange(graph.tensor_type(ref).num_elements).reshape(
                    graph.tensor_type(ref).dims
                )
                parts = split_input(
                    index,
                    block.grid_dim,
                    inp.attr("imap"),
                    block.forloop_range,
                    inp.attr("forloop_dim"),
                )
                parts = np.broadcast_to(parts, (parts.shape[0], *block.grid_dim, *parts.shape[4:]))
                read = np.zeros(index.size, dtype=bool)
                read[parts[(slice(None), *block_coords(block.grid_dim, b))].ravel()] = True
                for pb, mask in enumerate(writes[(ref.op, ref.index)]):
                    if (mask.ravel() & read).any():
                        found.add((ref.op, pb))
            deps[(k, b)] = frozenset(found)
    return deps


@pytest.mark.parametrize("m,row_tile,col_tile", [(4, 1, 8), (4, 2, 16), (8, 4, 32), (2, 2, 8)])
def test_block_dependencies_are_exactly_the_tile_overlaps(m, row_tile, col_tile):
    g = _norm_then_projection(m, 16, 32, row_tile, col_tile)
    assert block_dependencies(g) == _brute_force(g)


@pytest.mark.parametrize("per_query_head", [True, False])
def test_combination_blocks_wait_for_their_kv_heads_partials_only(per_query_head):
    """One combination block per query head (or per KV head): each depends on the partial
    sums of its KV head's chunks and on that head's new-token term, nothing else."""
    tiles = replace(SMALL_TILES, combine_per_query_head=per_query_head)
    pk = build_decoder(tiny_model("qwen3"), 32, tiles=tiles).kernel  # 4 heads over 2 KV heads
    part = {role.part: op for op, role in pk.roles.items() if role.layer == "layer0.attn"}
    g = pk.graph
    combine = g.ops[part["combine"]].attr("graph")
    assert combine.grid_dim == ((4 if per_query_head else 2), 1, 1)
    partials = g.ops[part["partials"]].attr("graph")
    deps = block_dependencies(g)
    for b in range(combine.num_blocks):
        kv_head = b // 2 if per_query_head else b
        expected = {(part["partials"], c) for c in range(partials.num_blocks)
                    if block_coords(partials.grid_dim, c)[0] == kv_head}
        expected.add((part["new_token"], kv_head))
        assert deps[(part["combine"], b)] == expected


def test_projection_tile_waits_for_the_norm_of_its_rows_only():
    g = _norm_then_projection(4, 16, 32, 1, 8)
    deps = block_dependencies(g)
    norm_op, proj_op = (
        i
        for i, op in enumerate(g.ops)
        if op.kind is mugraph.OpKind.CUSTOMIZED and op.attr("graph").grid_dim[1] >= 1 and i < 4
    )
    proj_block = g.ops[proj_op].attr("graph")
    for b in range(proj_block.num_blocks):
        _, row, _ = block_coords(proj_block.grid_dim, b)
        assert deps[(proj_op, b)] == {(norm_op, row)}
    tg = build_task_graph(g, num_programs=3, allocation="kernel")
    for t in tg.tasks:
        if t.kernel == proj_op:
            rows = {
                block_coords(proj_block.grid_dim, b)[1]
                for b in range(t.first_block, t.first_block + t.num_blocks)
            }
            norm = tg.kernel(norm_op)
            assert tg.raw_dependencies[t.index] == {norm.task_of(r) for r in rows}


@pytest.mark.parametrize("programs", [1, 3, 8])
def test_events_preserve_exactly_the_task_dependencies(programs):
    g = _norm_then_projection(8, 16, 32, 2, 8)
    tg = build_task_graph(g, num_programs=programs, allocation="kernel")
    tg.check()
    # the events imply exactly the transitive closure of the raw task dependencies
    closure = [0] * len(tg.tasks)
    for t in tg.order:
        bits = 0
        for p in tg.raw_dependencies[t]:
            bits |= closure[p] | (1 << p)
        closure[t] = bits
    assert task_ancestors(tg) == closure
    for e in tg.events:
        for p in e.producers:
            assert e.index in tg.tasks[p].triggers
        for c in e.consumers:
            assert tg.tasks[c].wait == e.index
    # every queue is in the global order: waits only point backwards
    position = {t: i for i, t in enumerate(tg.order)}
    for t in tg.tasks:
        assert all(position[p] < position[t.index] for p in tg.dependencies(t.index))


def test_decoder_task_graph_has_head_granular_attention_dependencies():
    decoder = build_decoder(tiny_model("qwen3"), 8, tiles=SMALL_TILES)
    pk = decoder.kernel
    tg = pk.task_graph(num_programs=6, allocation="kernel")
    tg.check()
    roles = pk.roles
    q_op = next(op for op, r in roles.items() if r.layer == "layer0.q_proj")
    partial_op = next(op for op, r in roles.items() if r.part == "partials")
    q_kernel, part = tg.kernel(q_op), tg.kernel(partial_op)
    q_block = pk.graph.ops[q_op].attr("graph")
    width = pk.graph.ops[q_op].outputs[0].dims[1] // q_block.grid_dim[0]
    group_width = 2 * 8  # two query heads of 8 per KV head
    for t in range(part.first_task, part.first_task + part.num_tasks):
        task = tg.tasks[t]
        heads = {
            block_coords(part.grid, b)[0]
            for b in range(task.first_block, task.first_block + task.num_blocks)
        }
        cols = {c for h in heads for c in range(h * group_width, (h + 1) * group_width)}
        expect = {q_kernel.task_of(c // width) for c in cols}
        assert tg.raw_dependencies[t] == expect  # the query columns of its heads, nothing else


def test_task_graph_json_round_trip_and_show(tmp_path, capsys):
    decoder = build_decoder(tiny_model("qwen3"), 8, tiles=SMALL_TILES)
    tg = decoder.kernel.task_graph(num_programs=4)
    again = TaskGraph.from_json(tg.to_json())
    assert again.tasks == tg.tasks and again.events == tg.events and again.queues == tg.queues
    path = tmp_path / "tasks.json"
    path.write_text(tg.to_json())
    svg = tmp_path / "tasks.svg"
    assert cli_main(["show", str(path), "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "task graph:" in out and "program 0:" in out
    assert svg.read_text().startswith("<svg")
    assert to_svg(tg, max_tasks=10).startswith("<svg")  # kernel granularity
    assert "kernels:" in render_text(tg)


def test_small_sole_consumers_become_continuations_of_their_event():
    """A task moving at most ``continuation_bytes`` that alone waits on its event is in no
    queue: its event names it, and the dependencies stay what they were."""
    decoder = build_decoder(tiny_model("qwen3", layers=2), 8, tiles=SMALL_TILES)
    pk = decoder.kernel
    plain = pk.task_graph(num_programs=3)
    tg = pk.task_graph(num_programs=3, continuation_bytes=64 * 1024)
    tg.check()
    assert not plain.continuations
    assert [replace(t, program=0) for t in tg.tasks] == [replace(t, program=0) for t in plain.tasks]
    assert [replace(e, continuation=-1) for e in tg.events] == plain.events
    parts = {pk.roles[tg.tasks[t].kernel].part for t in tg.continuations}
    assert "combine" in parts and parts <= {"combine", "new_token", "partial", "final"}
    for t in tg.tasks:  # a task completes one continuation's event at most
        assert sum(tg.events[e].continuation >= 0 for e in t.triggers) <= 1
    for t in tg.continuations:
        event = tg.events[tg.tasks[t].wait]
        assert event.consumers == (t,) and event.continuation == t
        assert tg.tasks[t].program == -1 and not any(t in q for q in tg.queues)
    assert tg.queued_order == [t for t in tg.order if t not in tg.continuations]
    assert "continuations" in tg.summary() and "->t" in render_text(tg)
    again = TaskGraph.from_json(tg.to_json())
    assert again.events == tg.events and again.continuations == tg.continuations
    none = pk.task_graph(num_programs=3, continuation_bytes=1)
    assert not none.continuations


def test_check_rejects_a_queued_continuation_and_two_from_one_task():
    decoder = build_decoder(tiny_model("qwen3"), 8, tiles=SMALL_TILES)
    tg = decoder.kernel.task_graph(num_programs=3, continuation_bytes=64 * 1024)
    follow = min(tg.continuations)
    tg.queues[0].append(follow)
    tg.queues[0].sort(key=tg.order.index)
    with pytest.raises(GraphStructureError, match="continuations"):
        tg.check()
    # a producer that would be the last of two such events could hand over only one (with a
    # combination per KV head, each the only consumer of its head's partials)
    by_kv_head = replace(SMALL_TILES, combine_per_query_head=False)
    tg = build_decoder(tiny_model("qwen3"), 8, tiles=by_kv_head).kernel.task_graph(num_programs=3)
    shared = next(
        (a, b)
        for a in tg.events
        for b in tg.events
        if a.index < b.index and set(a.producers) & set(b.producers)
        and len(a.consumers) == len(b.consumers) == 1
    )
    for e in shared:
        tg.events[e.index] = replace(e, continuation=e.consumers[0])
        tg.queues = [[t for t in q if t != e.consumers[0]] for q in tg.queues]
    with pytest.raises(GraphStructureError, match="one continuation at most"):
        tg.check()


def test_level_allocation_gives_every_block_a_task_when_programs_suffice():
    pk = build_decoder(tiny_model("qwen3"), 16, tiles=SMALL_TILES).kernel
    kinds = {k: role.part for k, role in pk.roles.items()}
    spare = pk.task_graph(num_programs=512)  # more programs than any level's blocks
    for k, kernel in enumerate(pk.graph.ops):
        if k in kinds:
            assert spare.kernel(k).num_tasks == kernel.attr("graph").num_blocks, kinds[k]
    few = pk.task_graph(num_programs=3)  # fewer: tasks in proportion to the bytes moved
    new_token = next(k for k, part in kinds.items() if part == "new_token")
    assert few.kernel(new_token).num_tasks < pk.graph.ops[new_token].attr("graph").num_blocks


def test_level_allocation_counts_each_blocks_fixed_cost():
    """Where a level has more blocks than programs, the KV-cache append (4 small blocks) and
    the attention partials (16 blocks) share the programs by bytes plus a fixed cost a block:
    the append gets more than one task, so its blocks do not all run one after another (by
    bytes alone it gets one), and the decode is unchanged."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    decoder = build_decoder(model, 64, tiles=SMALL_TILES)
    pk = decoder.kernel
    kind = {role.part: k for k, role in pk.roles.items()}
    new_token, partials = kind["new_token"], kind["partials"]
    assert pk.graph.ops[new_token].attr("graph").num_blocks == 4
    assert pk.graph.ops[partials].attr("graph").num_blocks == 16
    ops = [k for k, op in enumerate(pk.graph.ops) if op.kind is mugraph.OpKind.CUSTOMIZED]
    by_bytes = allocate_tasks(pk.graph, ops, 12, "level")
    assert by_bytes[new_token] == 1
    tg = pk.task_graph(num_programs=12)
    assert tg.kernel(new_token).num_tasks == 2 and tg.kernel(partials).num_tasks == 10
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 4)
    assert decoder.compile(num_programs=12).generate(prompt, 4) == ref_tokens


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_program_sets_take_the_levels_in_turn_and_decode_the_same(layout):
    """``program_sets=2``: the tasks at depth d run on set d % 2 only, each level allocated
    for half the programs; the queues stay topological and the tokens do not change."""
    model = tiny_model("qwen3", layers=2)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 5)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(num_programs=6, program_sets=2, program_set_layout=layout)
    tg = program.tasks
    members = [{0, 1, 2}, {3, 4, 5}] if layout == "halves" else [{0, 2, 4}, {1, 3, 5}]
    for task in tg.tasks:
        if task.program >= 0:
            assert task.program in members[task.depth % 2], task
    whole = decoder.kernel.task_graph(num_programs=3)
    assert [k.num_tasks for k in tg.kernels] == [k.num_tasks for k in whole.kernels]
    tg.check()
    assert program.generate(prompt, 5) == ref_tokens


def test_program_sets_spread_a_wide_level_over_every_program():
    """``spread_blocks``: a kernel level of more than that many blocks per program of a set
    (with 1 KB weight tiles, gate/up's 16 blocks on sets of 3) is allocated for, and
    scheduled on, every program; the other levels keep to their set; 0 spreads nothing; the
    tokens do not change."""
    from mugraph.persistent.taskgraph import kernel_depths, spread_levels

    model = tiny_model("qwen3", layers=1)
    tiles = TilePolicy(**(vars(SMALL_TILES) | {"weight_tile_bytes": 1024}))
    decoder = build_decoder(model, 16, tiles=tiles)
    pk = decoder.kernel
    ops = [k for k, op in enumerate(pk.graph.ops) if op.kind is mugraph.OpKind.CUSTOMIZED]
    blocks = {k: pk.graph.ops[k].attr("graph").num_blocks for k in ops}
    head = max(ops, key=lambda k: blocks[k])
    widest = (blocks[head] - 1) // 3  # the head's level has more blocks than that per program
    assert widest >= 1
    spread = spread_levels(pk.graph, ops, 3, widest)
    depth = kernel_depths(pk.graph, ops)
    assert depth[head] in spread
    assert all(blocks[k] <= widest * 3 for k in ops if depth[k] not in spread)
    tg = pk.task_graph(num_programs=6, program_sets=2, spread_blocks=widest)
    plain = pk.task_graph(num_programs=6, program_sets=2)
    assert tg.kernel(head).num_tasks == min(6, blocks[head]) > plain.kernel(head).num_tasks
    assert {t.program for t in tg.tasks if t.kernel == head} == set(range(6))
    for task in tg.tasks:
        if task.program >= 0 and depth[task.kernel] not in spread:
            assert task.program in ({0, 1, 2}, {3, 4, 5})[task.depth % 2], task
    unspread = pk.task_graph(num_programs=6, program_sets=2, spread_blocks=0)
    assert [t.program for t in unspread.tasks] == [t.program for t in plain.tasks]
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 4)
    program = decoder.compile(num_programs=6, program_sets=2, program_set_spread=widest)
    assert program.generate(prompt, 4) == ref_tokens
    for bad in (-1, True, 2.0):
        with pytest.raises(mugraph.UnsupportedError, match="spread"):
            decoder.compile(program_sets=2, program_set_spread=bad)
        with pytest.raises(mugraph.UnsupportedError, match="spread_blocks"):
            pk.task_graph(num_programs=6, program_sets=2, spread_blocks=bad)


@pytest.mark.parametrize(
    ("sets", "layout", "match"),
    [(0, "halves", "program_sets"), (7, "halves", "program_sets"), (True, "halves", "program_sets"),
     (2, "rows", "set_layout")],
)
def test_program_sets_reject_bad_values(sets, layout, match):
    pk = build_decoder(tiny_model("llama"), 16, tiles=SMALL_TILES).kernel
    with pytest.raises(mugraph.UnsupportedError, match=match):
        pk.task_graph(num_programs=6, program_sets=sets, set_layout=layout)


@pytest.mark.parametrize(
    ("continuations", "lookahead"), [(True, False), (False, False), (False, True)]
)
def test_decode_with_and_without_continuations(continuations, lookahead):
    """The last producer of an event runs its continuation in the same launch (the
    continuation's wait has nothing left to wait for), with the same tokens either way; the
    same with the dispatcher reading its queue a task ahead."""
    model = tiny_model("llama", layers=2)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 5)
    decoder = build_decoder(model, 16, tiles=SMALL_TILES)
    program = decoder.compile(num_programs=3, continuations=continuations, lookahead=lookahead)
    assert bool(program.tasks.continuations) == continuations
    assert ("while task >= 0:" in program.source) == continuations
    assert ("return cont" in program.source) == continuations
    assert ("entry = ahead" in program.source) == lookahead
    assert program.generate(prompt, 5) == ref_tokens


# ---- tensor parallelism -------------------------------------------------------------------------


def _input_values(pk: PersistentKernel, pos: int, token: int) -> dict[str, np.ndarray]:
    values = {}
    for t in pk.tensors.values():
        if t.dtensor is None or pk.graph.ops[t.dtensor.ref.op].kind is not mugraph.OpKind.INPUT:
            continue
        if isinstance(t.binding, Attached):
            base = t.binding.tensor
            view = torch.as_strided(
                base, t.dims, t.dtensor.strides, base.storage_offset() + t.binding.offset
            )
            values[t.name] = view.detach().double().numpy()
        elif isinstance(t.binding, Row):
            index = pos if t.binding.slot is MetaSlot.POS else token
            values[t.name] = t.binding.table[index : index + 1].detach().double().numpy()
    return values


@pytest.mark.parametrize(("world", "kind"), [(2, "qwen3"), (4, "qwen3"), (2, "qwen2")])
def test_tensor_parallel_task_graphs(world, kind):
    model = tiny_model_with_kv(4, kind)  # so that KV heads split over 4 ranks
    ranks = [
        build_decoder(model, 8, tiles=SMALL_TILES, world_size=world, rank=r).kernel
        for r in range(world)
    ]
    graphs = [pk.task_graph(num_programs=4) for pk in ranks]
    first = graphs[0]
    for tg in graphs[1:]:  # every rank has the same structure (its peers' event ids match)
        assert [(t.kernel, t.first_block, t.num_blocks, t.wait) for t in tg.tasks] == [
            (t.kernel, t.first_block, t.num_blocks, t.wait) for t in first.tasks
        ]
    pk = ranks[0]
    reduce_ops = [op for op, role in pk.roles.items() if role.part == "allreduce"]
    assert len(reduce_ops) == 2  # after the attention output and the MLP down projection
    for tg in graphs:
        for op in reduce_ops:
            kernel = tg.kernel(op)
            for t in range(kernel.first_task, kernel.first_task + kernel.num_tasks):
                event = tg.events[tg.tasks[t].wait]
                peers = {rank for rank, _ in event.remote_producers}
                assert peers == set(range(world)) - {tg.rank}
                local = set(event.producers)
                # by symmetry the remote producers are the same tasks on the other ranks
                assert {p for _, p in event.remote_producers} == local
                for p in local:
                    assert {(r, event.index) for r in peers} <= set(tg.tasks[p].remote_triggers)
    # the sharded μGraphs compute the model: simulate the ranks with the reference semantics
    values = simulate_ranks(ranks, [_input_values(k, 0, 7) for k in ranks])
    logits_ref = pk.tensor("lm_head.logits").dtensor.ref
    with torch.no_grad():
        expect = model(torch.tensor([[7]])).logits[0, -1].double().numpy()
    for r in range(world):
        got = values[r][(logits_ref.op, logits_ref.index)][0]
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6)
    assert isinstance(
        ranks[1].tensors[next(n for n in ranks[1].tensors if "@rank0" in n)].binding, Peer
    )
    with pytest.raises(mugraph.UnsupportedError, match="multi-GPU"):
        ranks[0].compile()


def tiny_model_with_kv(kv: int, kind: str = "qwen3"):
    """A one-layer Qwen3 (or Qwen2: biases on q / k / v) with ``kv`` KV heads."""
    torch.manual_seed(3)
    common = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=kv,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    if kind == "qwen2":
        config = transformers.Qwen2Config(**common)
    else:
        config = transformers.Qwen3Config(head_dim=8, **common)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    return model


# ---- malformed layer calls ----------------------------------------------------------------------


def _kernel_with_weights():
    pk = PersistentKernel(max_seq_len=8)
    w = pk.attach_input(torch.randn(16, 8), "w")
    norm = pk.attach_input(torch.ones(8), "norm")
    emb = pk.attach_input(torch.randn(32, 8), "emb")
    return pk, w, norm, emb


def test_malformed_layer_calls_raise_mugraph_errors():
    pk, w, norm, emb = _kernel_with_weights()
    x = pk.embed_layer(emb, name="embed")
    with pytest.raises(ShapeError, match=r"layer 'bad'.*rmsnorm_linear_layer"):
        pk.rmsnorm_linear_layer(x, norm, pk.attach_input(torch.randn(16, 5), "w5"), name="bad")
    with pytest.raises(DTypeError, match="float64"):
        pk.attach_input(torch.randn(4, 8, dtype=torch.float64), "w64")
    placeholder = pk.new_tensor((1, 16), name="later")
    with pytest.raises(GraphStructureError, match="'later' is read before any layer writes it"):
        pk.rmsnorm_linear_layer(placeholder, norm, w, name="early")
    y = pk.rmsnorm_linear_layer(x, norm, w, output=placeholder, name="proj")
    assert y is placeholder
    with pytest.raises(GraphStructureError, match="written already"):
        pk.rmsnorm_linear_layer(x, norm, w, output=placeholder, name="again")
    with pytest.raises(ShapeError, match="produces"):
        pk.rmsnorm_linear_layer(x, norm, w, output=pk.new_tensor((1, 8)), name="wrong_out")
    with pytest.raises(GraphStructureError, match="must be a tensor of this persistent kernel"):
        pk.rmsnorm_linear_layer(torch.randn(1, 8), norm, w, name="raw")
    other, *_ = _kernel_with_weights()
    foreign = other.attach_input(torch.randn(16, 8), "foreign")
    with pytest.raises(GraphStructureError, match="belongs to another kernel"):
        pk.rmsnorm_linear_layer(x, norm, foreign, name="foreign")
    with pytest.raises(GraphStructureError, match="exists already"):
        pk.rmsnorm_linear_layer(x, norm, w, name="proj")
    with pytest.raises(GraphStructureError, match="no argmax layer"):
        pk.check()
    ops = len(pk.graph.ops)
    with pytest.raises(ShapeError):
        pk.mlp_layer(x, norm, w, pk.attach_input(torch.randn(12, 8), "up"), w, name="mlp")
    assert len(pk.graph.ops) == ops + 1  # only the attached weight: the layer left nothing
    for eps in (-1e-6, "1e-6", float("nan")):  # were accepted (a negative one makes NaN rows)
        with pytest.raises(mugraph.UnsupportedError, match=r"layer 'eps'.*eps must be a finite"):
            pk.rmsnorm_linear_layer(x, norm, w, eps=eps, name="eps")
    with pytest.raises(GraphStructureError, match="name must be a non-empty str, got 5"):
        pk.rmsnorm_linear_layer(x, norm, w, name=5)
    with pytest.raises(GraphStructureError, match="name must be a non-empty str, got 7"):
        pk.attach_input(torch.randn(4, 8), 7)


def test_attention_layer_checks_its_shapes():
    pk = PersistentKernel(max_seq_len=8)
    emb = pk.attach_input(torch.randn(32, 16), "emb")
    norm = pk.attach_input(torch.ones(16), "norm")
    x = pk.embed_layer(emb)
    q = pk.rmsnorm_linear_layer(x, norm, pk.attach_input(torch.randn(16, 16), "wq"))
    k = pk.rmsnorm_linear_layer(x, norm, pk.attach_input(torch.randn(8, 16), "wk"))
    cache = pk.attach_input(torch.zeros(8, 8), "kc")
    vcache = pk.attach_input(torch.zeros(8, 8), "vc")
    rope = RopeTables(
        pk.attach_input(torch.ones(8, 4), "cos"), pk.attach_input(torch.zeros(8, 4), "sin")
    )
    with pytest.raises(ShapeError, match="num_heads"):
        pk.attention_layer(q, k, k, cache, vcache, rope, num_heads=4, num_kv_heads=3)
    with pytest.raises(ShapeError, match="caches must be"):
        pk.attention_layer(
            q,
            k,
            k,
            pk.attach_input(torch.zeros(4, 8), "short"),
            vcache,
            rope,
            num_heads=4,
            num_kv_heads=2,
        )
    with pytest.raises(GraphStructureError, match="RopeTables"):
        pk.attention_layer(q, k, k, cache, vcache, (1, 2), num_heads=4, num_kv_heads=2)
    out = pk.attention_layer(q, k, k, cache, vcache, rope, num_heads=4, num_kv_heads=2)
    assert out.dims == (1, 16)


def test_claimed_blocks_decode_like_transformers():
    """``claim_blocks``: the tasks of a kernel that wait for one event and trigger the same
    events take their blocks from a counter of the step (topological mode: the first task
    takes them all); the counters of the next step are zeroed by the last program, so every
    step decodes the same tokens as transformers."""
    from mugraph.persistent.runtime import claim_groups

    model = tiny_model("llama", layers=2)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 6)
    decoder = build_decoder(model, 16, tiles=replace(SMALL_TILES, weight_tile_bytes=1024))
    program = decoder.compile(pipeline=True, num_programs=3, claim_blocks=True)
    groups = claim_groups(program.tasks)
    split = claim_groups(program.tasks, per_counter=2)  # three tasks: counters of 1 and 2
    assert len(split) == len(groups) and all(len(m) == 2 for _, _, m in split)
    assert groups and "while blk < end:" in program.source
    tasks = program.tasks.tasks
    for first, count, members in groups:
        assert len({tasks[t].kernel for t in members}) == 1 and len(members) > 1
        assert sum(tasks[t].num_blocks for t in members) == count
        assert min(tasks[t].first_block for t in members) == first
        assert len({(tasks[t].wait, tuple(sorted(tasks[t].triggers))) for t in members}) == 1
    assert program.generate(prompt, 6) == ref_tokens
    base, n = len(program.tasks.events), len(groups)
    counters = program.events[base:base + 2 * n].tolist()
    following = int(program.meta[int(MetaSlot.STEP)])  # the next step (its parity's slots)
    assert counters[following % 2::2] == [0] * n and any(counters[1 - following % 2::2])
    program.reset()
    assert program.generate(prompt, 6) == ref_tokens
    plain = decoder.compile(pipeline=True, num_programs=3)
    assert "while blk < end:" not in plain.source and "claim" not in plain.source
    with pytest.raises(mugraph.UnsupportedError, match="claim_blocks"):
        decoder.compile(claim_blocks=True, continuations=True)
    with pytest.raises(mugraph.UnsupportedError, match="claim_blocks"):
        decoder.compile(claim_blocks=1)
    paired = decoder.compile(pipeline=True, num_programs=3, claim_blocks=2)
    assert paired.claim_groups == split and paired.generate(prompt, 6) == ref_tokens


# ---- the MLP as one kernel: the down projection summed over blocks (fuse_mlp_down) ---------

FUSED_TILES = replace(SMALL_TILES, fuse_mlp_down=True, weight_tile_bytes=1024)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_decode_with_the_mlp_as_one_kernel_matches_transformers(kind):
    """Every MLP is one accumulating kernel; the next layer's projections, its o_proj's
    residual and the LM head's norm add the two rows it leaves. Eight steps alternate the
    two parity rows of each sum (each step zeroes the other)."""
    model = tiny_model(kind, layers=2)
    prompt = [5, 17, 42]
    ref_tokens, _ = hf_greedy(model, prompt, 8)
    decoder = build_decoder(model, 16, tiles=FUSED_TILES)
    parts = [role.part for role in decoder.kernel.roles.values()]
    assert parts.count("gate_up_down") == 2 and "down" not in parts and "sum" not in parts
    levels = 1 + max(t.depth for t in decoder.kernel.task_graph(4).tasks)
    assert levels == 2 * 5 + 4  # five levels a layer, not six
    program = decoder.compile()
    assert program.generate(prompt, 8) == ref_tokens
    program.reset()  # after an odd number of steps: the sums' rows are zeroed, not stale
    assert program.generate(prompt, 7) == ref_tokens[:7]


def test_the_mlp_kernel_adds_its_tasks_sum_once_and_zeroes_the_next_steps_row():
    decoder = build_decoder(tiny_model("qwen3", layers=2), 16, tiles=FUSED_TILES)
    lines = _body_lines(decoder, "mlp.gate_up_down")
    loop = lines.index("for blk in range(first, end):")
    assert lines[loop - 1] == "tsum0 = tl.zeros([1, 32], dtype=tl.float32)"
    assert "tsum0 = tsum0 + b20.to(tl.float32)" in lines
    add = next(i for i, line in enumerate(lines) if line.startswith("tl.atomic_add(out0_ptr"))
    assert add > loop and 'sem="relaxed"' in lines[add]
    assert lines[add + 1] == "if first == 0:" and lines[add + 2] == "zero_at = tl.arange(0, 32)"
    assert lines[add + 3].startswith("tl.store(out0_ptr + out0_other + zero_at, tl.zeros([32]")
    assert add < lines.index("tl.debug_barrier()")  # before the release of its event
    assert "out0_ptr = out0_ptr + (step % 2) * 32" in lines
    reader = _body_lines(decoder, "layer1.q_proj.proj")
    summed = [line for line in reader if "(step % 2)" in line]
    assert len(summed) == 1 and "tl.pointer_type(tl.float32)" not in summed[0]


@pytest.mark.parametrize(
    ("nan_rows", "inf_rows", "nan_norm"),
    [((), (), False), ((70, 37), (5,), False), ((), (5, 80), False), ((), (), True)],
)
def test_the_argmax_layer_picks_the_token_torch_argmax_picks(nan_rows, inf_rows, nan_norm):
    """NaN logits are the largest, the first one wins (as torch.argmax); a row of them all
    gives token 0. (Tied infinities: the first; the interpreter's own argmax skipped NaN and
    refused a row of them.)"""
    torch.manual_seed(2)
    pk = PersistentKernel(max_seq_len=8, tiles=SMALL_TILES)
    emb, head, norm = torch.randn(96, 32), 0.2 * torch.randn(96, 32), torch.ones(1, 32)
    for r in nan_rows:
        head[r] = float("nan")
    for r in inf_rows:
        head[r] = 0.0
        head[r, 0] = float("inf") * torch.sign(emb[7, 0])
    if nan_norm:
        norm[0, 3] = float("nan")
    x = pk.embed_layer(pk.attach_input(emb, "embed"))
    logits = pk.lm_head_layer(x, pk.attach_input(norm, "norm"), pk.attach_input(head, "head"))
    pk.argmax_layer(logits)
    program = pk.compile()
    program.step(7)
    got = program.buffer(logits).reshape(-1)
    assert torch.equal(got.isnan(), torch.tensor([i in nan_rows for i in range(96)]) | nan_norm)
    assert int(program.history[0]) == int(torch.argmax(got))
    if nan_rows:
        assert int(program.history[0]) == min(nan_rows)


def test_an_mlp_row_read_whole_is_added_by_a_kernel_of_its_own():
    """A fused MLP takes the rows the one before it left; a layer that cannot take them
    (here a linear + residual layer's input) reads them added by a ``residual_sum`` kernel.
    The step's logits match PyTorch's."""
    torch.manual_seed(0)
    pk = PersistentKernel(max_seq_len=8, tiles=FUSED_TILES)
    emb = torch.randn(96, 32)
    norms = [1 + 0.1 * torch.randn(1, 32) for _ in range(3)]
    mlps = [[0.2 * torch.randn(*s) for s in ((64, 32), (64, 32), (32, 64))] for _ in range(2)]
    head = 0.2 * torch.randn(96, 32)
    proj = 0.2 * torch.randn(32, 32)
    x = pk.embed_layer(pk.attach_input(emb, "embed"))
    for i, (wg, wu, wd) in enumerate(mlps):
        x = pk.mlp_layer(
            x,
            pk.attach_input(norms[i], f"norm{i}"),
            pk.attach_input(wg, f"gate{i}"),
            pk.attach_input(wu, f"up{i}"),
            pk.attach_input(wd, f"down{i}"),
        )
    x = pk.linear_residual_layer(x, pk.attach_input(proj, "proj"), x)
    final_norm = pk.attach_input(norms[2], "final_norm")
    logits = pk.lm_head_layer(x, final_norm, pk.attach_input(head, "head"))
    pk.argmax_layer(logits)
    assert [r.part for r in pk.roles.values()].count("sum") == 1
    program = pk.compile()
    program.step(7)

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-6) * w

    h = emb[7:8]
    for i, (wg, wu, wd) in enumerate(mlps):
        xn = rms(h, norms[i])
        h = h + (torch.nn.functional.silu(xn @ wg.T) * (xn @ wu.T)) @ wd.T
    h = h @ proj.T + h
    want = rms(h, norms[2]) @ head.T
    got = program.buffer(logits).reshape(want.shape)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_decode_with_four_levels_a_layer_matches_transformers():
    """``fuse_o_proj_heads`` with ``fuse_mlp_down``: the attention's combination and output
    projection are one kernel summed over the KV heads (Qwen3: two; Llama: one, nothing to
    sum), the q projection writes the row a layer starts from whole (o_proj's residual)."""
    tiles = replace(FUSED_TILES, fuse_o_proj_heads=True)
    for kind in ("qwen3", "llama"):
        model = tiny_model(kind, layers=2)
        prompt = [5, 17, 42]
        ref_tokens, _ = hf_greedy(model, prompt, 6)
        decoder = build_decoder(model, 16, tiles=tiles)
        parts = [role.part for role in decoder.kernel.roles.values()]
        assert parts.count("combine_proj_heads") == 2 and "combine" not in parts
        assert "sum" not in parts  # every reader took the rows, or the row written whole
        levels = 1 + max(t.depth for t in decoder.kernel.task_graph(4).tasks)
        assert levels == 2 * 4 + 4
        whole = [n for n in decoder.kernel.tensors if n.endswith(".whole")]
        assert len(whole) == 1  # layer 1's row (layer 0 starts from the embedding)
        assert decoder.compile().generate(prompt, 6) == ref_tokens


def test_per_block_atomics_where_the_blocks_add_into_different_columns():
    """The combination + projection kernel's blocks along the heads add into the columns of
    their rows of W: each block adds its tile (no task sum), and the first block's task
    zeroes the whole other row."""
    tiles = replace(FUSED_TILES, fuse_o_proj_heads=True)
    decoder = build_decoder(tiny_model("qwen3", layers=1), 16, tiles=tiles)
    text = next(t for label, t in _gpu_bodies(decoder).items() if label.endswith("heads"))
    raw = text.splitlines()
    loop = raw.index("    for blk in range(first, end):")
    adds = [i for i, line in enumerate(raw) if "tl.atomic_add(out0_ptr" in line]
    assert len(adds) == 1 and adds[0] > loop and "tsum" not in text
    assert raw[adds[0]].startswith("        tl.atomic_add(")  # in the block loop
    assert raw[adds[0] + 1] == "    if first == 0:"  # after it, the first task's zeroing
    assert raw[adds[0] + 2] == "        zero_at = tl.arange(0, 32)"


def test_default_tiles_give_a_qwen3_shaped_qkv_level_one_32kb_block_per_task():
    """``TilePolicy()``'s projections of a Qwen3-0.6B-shaped layer (hidden 1024, 16 query and
    8 KV heads of 128) at two programs per SM of an H100 (264): the q / k / v level is 256
    blocks of 32 KB of weights, one per task, so every task loads all its weights before it
    waits (the thirty-first session's ``min_blocks=64``)."""
    tg = build_decoder(_qwen3_shaped_layer(), 64).kernel.task_graph(264)
    rows = {"q_proj": 2048, "k_proj": 1024, "v_proj": 1024}  # each projection's weight rows
    qkv = {k.label.split(".")[1]: k for k in tg.kernels if k.label.split(".")[1] in rows}
    assert sorted(qkv) == sorted(rows)
    assert sum(k.num_blocks for k in qkv.values()) == 256
    for name, k in qkv.items():
        assert k.num_tasks == k.num_blocks, k
        assert rows[name] // k.grid[0] * 1024 * 2 == 32 * 1024, k  # bfloat16 rows of 1024


def _qwen3_shaped_layer():
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=256, hidden_size=1024, intermediate_size=3072, num_hidden_layers=1,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=64, tie_word_embeddings=True,
    )
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def test_role_budgets_tile_o_proj_and_gate_up_alone():
    """``TilePolicy(by_role=...)`` replaces the two budgets for one role's projections only:
    a Qwen3-0.6B-shaped o_proj aiming for 256 blocks takes 4 rows of 2048 (16 KB) per block,
    a gate / up with 48 KB per block 12 rows of each weight (256 blocks, one per task at 264
    programs); q / k / v and down keep the policy's tiles."""
    model = _qwen3_shaped_layer()
    by_role = (("linear_residual", 32 * 1024, 256), ("gate_up", 48 * 1024, 64))
    plain = build_decoder(model, 64).kernel.task_graph(264)
    roles = build_decoder(model, 64, tiles=TilePolicy(by_role=by_role)).kernel.task_graph(264)

    def blocks(tg):
        return {k.label.split(".", 1)[1]: k.num_blocks for k in tg.kernels}

    before, after = blocks(plain), blocks(roles)
    assert (before["o_proj.proj"], after["o_proj.proj"]) == (128, 256)
    assert (before["mlp.gate_up"], after["mlp.gate_up"]) == (384, 256)
    for part in ("q_proj.proj", "k_proj.proj", "v_proj.proj", "mlp.down"):
        assert before[part] == after[part], part
    gate_up = next(k for k in roles.kernels if k.label.endswith("mlp.gate_up"))
    assert gate_up.num_tasks == 256


@pytest.mark.parametrize(
    "by_role, match",
    [
        ((("o_proj", 32 * 1024, 256),), "role among"),
        ((("gate_up", 0, 64),), "positive ints"),
        ((("gate_up", 48 * 1024),), "role, weight_tile_bytes, min_blocks"),
        ((("down", 1024, 64), ("down", 2048, 64)), "given twice"),
    ],
)
def test_role_budgets_refuse_unknown_roles_and_bad_budgets(by_role, match):
    with pytest.raises(mugraph.MugraphError, match=match):
        TilePolicy(by_role=by_role)
