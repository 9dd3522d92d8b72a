"""Per-token decode latency: mugraph's persistent kernel against PyTorch, and the floor.

One call measures, for a Qwen3-0.6B-shaped and a Llama-3.2-1B-shaped model (or `--models
qwen2.5-0.5b`: Qwen2, biases on q / k / v; bfloat16, random
weights, batch 1, KV cache of 1024 positions), the time of one decode step with:

- eager: a plain PyTorch decode step over the transformers module's weights, with a static KV
  cache (attention over all 1024 positions with a mask, SDPA), run from Python;
- torch.compile of that step; eager + CUDA graph; torch.compile + CUDA graph (manual capture);
- mugraph persistent: ``build_decoder(model)`` compiled to one persistent Triton kernel, replayed
  from a CUDA graph (the kernel advances the position itself);
- the floor: every weight read once (the tied LM head reads the embedding table) plus the KV
  cache, over the measured device-to-device copy bandwidth.

Correctness first: transformers' ``generate`` (greedy, 32 new tokens after a random prompt) is
the reference; the persistent kernel's greedy tokens and the PyTorch step's are compared with
it, and teacher-forced logits give a relative error per step. On a GPU the model in float32
is a second reference: its logits along the same tokens, and its own greedy tokens (with
random weights the logits are near ties, which bfloat16 roundings flip: the table's tokens
column says whether the kernel's tokens equal the float32 model's as well).

Each model runs in a subprocess under a time limit (a hung kernel cannot eat the whole run);
results go to ``--out`` as JSON and a table is printed last::

    timeout 530 python benchmarks/bench_persistent.py --out $OUT

``--layers N`` shrinks the models (smoke tests). On a machine without a GPU only a tiny model
fits (the cache holds 64 positions there), its persistent kernel in Triton's interpreter::

    python benchmarks/bench_persistent.py --models tiny-qwen3 --parts persistent \
        --prompt 8 --new-tokens 8

Every variant's teacher-forced pass runs twice and must give the same bits
(``repeat_bit_equal``): nothing of the default step is summed in a run-dependent order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MODELS = {
    "qwen3-0.6b": dict(
        kind="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
    "llama-3.2-1b": dict(
        kind="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "llama-3.1-8b": dict(  # a larger model: the levels' fixed costs against 15 GB of weights
        kind="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2.5-0.5b": dict(  # Qwen2: biases on q / k / v, 14 heads over 2 KV heads, hidden 896
        kind="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "tiny-qwen3": dict(
        kind="qwen3",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
}
COLUMNS = ["eager", "compile", "eager_graph", "compile_graph", "persistent", "floor"]


def make_model(name: str, layers: int | None, device, dtype):
    import torch
    import transformers

    spec = dict(MODELS[name])
    kind = spec.pop("kind")
    if layers:
        spec["num_hidden_layers"] = layers
    config_cls = {"qwen3": transformers.Qwen3Config, "qwen2": transformers.Qwen2Config,
                  "llama": transformers.LlamaConfig}[kind]
    config = config_cls(**spec)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


# ---- a plain PyTorch decode step with a static cache (the baselines) ---------------------------


class TorchDecode:
    """One decode step in plain PyTorch over the module's weights, static KV caches."""

    def __init__(self, model, max_seq: int) -> None:
        import torch

        from mugraph.persistent.hf import ModelShape, rope_tables

        self.shape = s = ModelShape.of(model.config)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.layers = list(inner.layers)
        self.norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.cos, self.sin = rope_tables(model, max_seq)
        self.k = torch.zeros(
            s.layers, s.kv_heads, max_seq, s.head_dim, dtype=p.dtype, device=p.device
        )
        self.v = torch.zeros_like(self.k)
        j = torch.arange(max_seq, device=p.device)
        self.mask = torch.where(j[None, :] <= j[:, None], 0.0, float("-inf")).to(p.dtype)

    def rms(self, x, w):
        import torch

        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.shape.eps)).to(x.dtype) * w

    def rope(self, x, cos, sin):
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def step(self, token, pos):
        """``token`` and ``pos``: (1,) int64 device tensors. Returns the logits (1, vocab)."""
        import torch.nn.functional as F

        s = self.shape
        x = self.embed[token]
        cos, sin = self.cos[pos], self.sin[pos]
        mask = self.mask[pos].view(1, 1, 1, -1)
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self.rms(x, layer.input_layernorm.weight)
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(s.heads, s.head_dim)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(s.kv_heads, s.head_dim)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(s.kv_heads, s.head_dim)
            if s.qk_norm:
                q, k = self.rms(q, attn.q_norm.weight), self.rms(k, attn.k_norm.weight)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            self.k[i].index_copy_(1, pos, k.unsqueeze(1))
            self.v[i].index_copy_(1, pos, v.unsqueeze(1))
            o = F.scaled_dot_product_attention(
                q.view(1, s.heads, 1, s.head_dim),
                self.k[i].unsqueeze(0),
                self.v[i].unsqueeze(0),
                attn_mask=mask,
                enable_gqa=True,
            )
            x = x + F.linear(o.reshape(1, -1), attn.o_proj.weight)
            h = self.rms(x, layer.post_attention_layernorm.weight)
            x = x + F.linear(
                F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                mlp.down_proj.weight,
            )
        return F.linear(self.rms(x, self.norm), self.lm_head)

    def generate(self, prompt: list[int], n: int) -> list[int]:
        import torch

        out = []
        token = torch.tensor([prompt[0]], device=self.device)
        for i in range(len(prompt) + n - 1):
            logits = self.step(token, torch.tensor([i], device=self.device))
            nxt = int(logits.argmax(-1))
            if i + 1 < len(prompt):
                token = torch.tensor([prompt[i + 1]], device=self.device)
            else:
                out.append(nxt)
                token = torch.tensor([nxt], device=self.device)
        return out


# ---- timing ---------------------------------------------------------------------------------


def time_calls(fn, warmup: int, calls: int, repeats: int, sync) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``calls`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    sync()
    results = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            results.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            results.append((time.perf_counter() - t0) / calls)
    return statistics.median(results)


def copy_bandwidth(device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    import torch

    n = 1 << 28  # 256 Mi float32 = 1 GiB
    a = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)
    t = time_calls(lambda: b.copy_(a), 3, 10, 3, torch.cuda.synchronize)
    return 2 * a.numel() * 4 / t


def floor_bytes(model, max_seq: int) -> int:
    from mugraph.persistent.hf import ModelShape

    s = ModelShape.of(model.config)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = 2 * s.layers * max_seq * s.kv_heads * s.head_dim * next(model.parameters()).element_size()
    return weights + kv


def graph_of(fn):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


# ---- one model ------------------------------------------------------------------------------


class Recorder:
    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        self.row: dict = {"model": name}

    def __call__(self, **kw) -> None:
        self.row.update(kw)
        with open(self.path, "a") as f:
            f.write(json.dumps({"model": self.name, **kw}) + "\n")
        print(f"[{self.name}] " + ", ".join(f"{k}={v}" for k, v in kw.items()), flush=True)


def run_model(name: str, args) -> None:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    record = Recorder(Path(args.out) / "rows.jsonl", name)
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = make_model(name, args.layers, device, dtype)
    max_seq = args.cache if cuda else 64
    prompt = torch.randint(0, model.config.vocab_size, (args.prompt,)).tolist()
    record(setup_s=round(time.perf_counter() - t0, 1), max_seq=max_seq)

    # reference: transformers' own greedy decoding
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=device),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    ref_tokens = out.sequences[0, len(prompt) :].tolist()
    ref_logits = [x[0].float() for x in out.logits]

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if args.part in ("torch", "all"):
        run_torch(model, prompt, ref_tokens, max_seq, device, sync, record, args)
    if args.part in ("persistent", "all"):
        run_persistent(model, prompt, ref_tokens, ref_logits, max_seq, sync, record, args)


def run_torch(model, prompt, ref_tokens, max_seq, device, sync, record, args) -> None:
    import torch

    cuda = device == "cuda"
    base = TorchDecode(model, max_seq)
    with torch.no_grad():
        record(torch_tokens_match=base.generate(prompt, args.new_tokens) == ref_tokens)
        token = torch.tensor([prompt[-1]], device=device)
        pos = torch.tensor([len(prompt) + 40], device=device)
        step = lambda: base.step(token, pos)  # noqa: E731
        record(eager_s=time_calls(step, 3, args.calls, 3, sync))
        if cuda:
            record(eager_graph_s=time_calls(graph_of(step).replay, 5, args.calls, 3, sync))
            t1 = time.perf_counter()
            compiled = torch.compile(base.step)
            cstep = lambda: compiled(token, pos)  # noqa: E731
            cstep()
            record(compile_time_s=round(time.perf_counter() - t1, 1))
            record(compile_s=time_calls(cstep, 3, args.calls, 3, sync))
            record(compile_graph_s=time_calls(graph_of(cstep).replay, 5, args.calls, 3, sync))
            bw = copy_bandwidth(device)
            nbytes = floor_bytes(model, max_seq)
            record(copy_bandwidth_GBs=round(bw / 1e9, 1), floor_bytes=nbytes, floor_s=nbytes / bw)


# The seventeenth session's defaults: unaligned loads, no pipeline, 64 KB weight tiles.
S17 = ({"align_hints": False, "pipeline": False}, {"weight_tile_bytes": 64 * 1024})
TILE16K = ({}, {"weight_tile_bytes": 16 * 1024})  # no L2 prefetches, 16 KB weight tiles
UNPIPELINED = {"pipeline": False}  # 64 KB tiles with it (the pipeline spills them)
PPS3 = {"programs_per_sm": 3, "max_registers": 168}  # three programs per SM: 65536 / (3 x 128)

OPROJ256 = ("linear_residual", 32 * 1024, 256)  # TilePolicy.by_role entries (see below)
GATEUP48K = ("gate_up", 48 * 1024, 64)
GATEUP16K = ("gate_up", 16 * 1024, 64)
VARIANTS = {
    # name: (compile options, TilePolicy options); "default" is the runtime's defaults: two
    # programs of 4 warps per SM, aligned loads, static tiles loaded a block ahead, no L2
    # prefetches and 32 KB weight tiles (thirtieth session), task bodies as functions of their
    # own (thirty-first); the variants of the prefetches turn them on
    "default": ({}, {}),
    "s17_default": S17,
    "one_per_sm": ({**S17[0], "num_warps": 8, "programs_per_sm": 1}, S17[1]),  # s16 default
    "unaligned": ({"align_hints": False}, {}),
    "no_pipeline": (UNPIPELINED, {}),
    "continuations": ({"continuations": True}, {}),
    "scratch_reshapes": ({"align_reshapes": False}, {}),  # RoPE's reshapes before s39
    "aligned": (UNPIPELINED, S17[1]),
    "aligned_one_per_sm": ({**UNPIPELINED, "num_warps": 8, "programs_per_sm": 1}, S17[1]),
    "aligned_tile32k": (UNPIPELINED, {"weight_tile_bytes": 32 * 1024}),
    "tile64k": ({}, {"weight_tile_bytes": 64 * 1024}),
    "tile32k": ({"prefetch": True}, {"weight_tile_bytes": 32 * 1024}),  # with the prefetches
    "tile8k": ({}, {"weight_tile_bytes": 8 * 1024}),
    "min_blocks512": ({}, {"min_blocks": 512}),
    "attn_chunk32": ({}, {"attention_chunk": 32}),  # twice the attention tasks, half as long
    "attn_chunk128": ({}, {"attention_chunk": 128}),
    "evict_last": ({"prefetch": True, "prefetch_priority": "evict_last"}, {}),
    "poll_load": ({"poll_load": True}, {}),
    # key / value projections of 128 blocks (16 KB of weights each) instead of 256 (8 KB)
    "min_blocks128": ({}, {"min_blocks": 128}),
    "pf4": ({"prefetch": True, "prefetch_distance": 4}, {}),
    "pf8": ({"prefetch": True, "prefetch_distance": 8}, {}),
    "lookahead": ({"prefetch": True, "lookahead": True}, {}),
    "warps8": ({"num_warps": 8}, {}),
    "prefetch": ({"prefetch": True}, {}),  # L2 prefetches, as before the thirtieth session
    # task bodies as functions of their own (fewer registers for the whole kernel; the
    # default since the thirty-first session), on two programs per SM and on three (capped at
    # 168 registers: 65536 / (3 x 128) = 170); "inline": the bodies inlined, as before
    "separate": ({"separate_bodies": True}, {}),
    "inline": ({"separate_bodies": False}, {}),
    # projections aiming for 64 blocks (the default since the thirty-first session): Qwen3-0.6B's
    # q / k / v in 256 blocks of 32 KB in all (one per program, loaded before its wait)
    # against 768 of 8-16 KB; "min_blocks256": as before
    "min_blocks64": ({}, {"min_blocks": 64}),
    "min_blocks256": ({}, {"min_blocks": 256}),
    "pps3_min_blocks64": (PPS3, {"min_blocks": 64}),
    # budgets by role (thirty-second session): Qwen3-0.6B's o_proj in 256 blocks of 16 KB (it
    # is alone in its level) instead of 128 of 32 KB; its gate / up in 256 blocks of 48 KB (one
    # per program) instead of 384 of 32 KB (120 programs taking two). Llama-3.2-1B's tiles
    # stay as they are in both (a control). On the H100 (thirty-second session, call 1)
    # role_tiles ran Qwen3-0.6B's step in 750.6 against 720.2 µs: gate / up's polls came back
    # behind 48 KB of weight loads per program
    "oproj256": ({}, {"by_role": (OPROJ256,)}),
    "gateup48k": ({}, {"by_role": (GATEUP48K,)}),
    "role_tiles": ({}, {"by_role": (OPROJ256, GATEUP48K)}),
    # Qwen3-0.6B's gate / up in 768 blocks of 16 KB: every program 2-3 blocks (48 KB at most)
    # where 384 of 32 KB give 120 programs two (64 KB) and 144 one; "_d3": all three loaded
    # before the wait (48 KB, the default pipeline_bytes). On the H100 (thirty-eighth
    # session, call 3) 715.2 and 726.4 against 709.7 µs: not kept
    "gateup16k": ({}, {"by_role": (GATEUP16K,)}),
    "gateup16k_d3": ({"pipeline_depth": 3}, {"by_role": (GATEUP16K,)}),
    # one program of 8 warps per SM with 64 KB weight tiles (the same bytes in flight per SM
    # as two programs of 32 KB): half the programs meet at every level
    "pps1_64k": ({"num_warps": 8, "programs_per_sm": 1},
                 {"weight_tile_bytes": 64 * 1024, "min_blocks": 32}),
    # each level's weights streamed into L2 (one bulk prefetch per task, issued by the tasks
    # 1 / 2 / 3 depths before the level; thirty-third session)
    "stream1": ({"l2_stream": 1}, {}),
    "stream2": ({"l2_stream": 2}, {}),
    "stream3": ({"l2_stream": 3}, {}),
    "stream2_tiles": ({"l2_stream": 2}, {"by_role": (OPROJ256, GATEUP48K)}),
    # the same, each task's ranges issued after its triggers instead of before its wait
    "stream3_after": ({"l2_stream": 3, "l2_stream_after": True}, {}),
    "stream2_after": ({"l2_stream": 2, "l2_stream_after": True}, {}),
    # only some weights streamed, a level ahead: the down projection's (by the gate / up
    # tasks: down was the level that gained in stream1), and the whole MLP's
    "stream1_down": ({"l2_stream": 1, "l2_stream_names": ("*.down_proj",)}, {}),
    "stream1_down_after": ({"l2_stream": 1, "l2_stream_after": True,
                            "l2_stream_names": ("*.down_proj",)}, {}),
    "stream1_mlp": ({"l2_stream": 1,
                     "l2_stream_names": ("*.gate_proj", "*.up_proj", "*.down_proj")}, {}),
    "stream1_after": ({"l2_stream": 1, "l2_stream_after": True}, {}),
    "separate_pps3": ({"separate_bodies": True, **PPS3}, {}),
    # Qwen3-0.6B's attention partials in 32-position blocks: its kernel then fits 168
    # registers with no spill (offline sm_90a, thirtieth session)
    "separate_pps3_chunk32": ({"separate_bodies": True, **PPS3}, {"attention_chunk": 32}),
    # the thirtieth session's call 5 (H200): the prefetches off with 16 KB tiles; off with 32 KB
    # (the default since)
    "no_prefetch": TILE16K,
    "tile32k_no_prefetch": ({}, {}),  # the default since
    # before the thirtieth session: L2 prefetches, 16 KB weight tiles
    "s29_default": ({"prefetch": True}, {"weight_tile_bytes": 16 * 1024}),
    "tile16k": TILE16K,
    "plain_ladder": ({"prefetch_ahead": False}, {}),  # the dispatcher before s27
    # static tiles loaded 2 / 3 blocks ahead into registers (a task's first blocks' before
    # its wait)
    "depth2": ({"pipeline_depth": 2}, {}),
    "depth3": ({"pipeline_depth": 3}, {}),
    "fuse_mlp_depth3": ({"pipeline_depth": 3}, {"fuse_mlp_down": True}),
    "prefetch_task": ({"prefetch": True, "prefetch_task": True}, {}),
    "per_kernel_tasks": ({"task_allocation": "kernel"}, {}),
    "no_hoist": ({"hoist": False}, {}),
    # hoisted static tiles (norm weights, rotary rows) loaded after the wait (before s24)
    "no_early": ({"early_static": False}, {}),
    # a block's tiles written in this step (a residual) loaded where first used (before s24)
    "no_loads_first": ({"loads_first": False}, {}),
    "no_early_no_loads_first": ({"early_static": False, "loads_first": False}, {}),
    # the trigger table read after the task's last store (before s24)
    "late_triggers": ({"early_triggers": False}, {}),
    # descriptors found through the queue entries (before s24)
    "queue_entries": ({"desc_by_position": False}, {}),
    "s23_default": (
        {"early_static": False, "loads_first": False, "early_triggers": False,
         "desc_by_position": False},
        {},
    ),
    "fuse": ({}, {"fuse_attention_output": True}),
    # the MLP as one kernel, its down projection summed over blocks (twenty-fifth session)
    "fuse_mlp": ({}, {"fuse_mlp_down": True}),
    "fuse_mlp3": ({}, {"fuse_mlp_down": True, "fused_mlp_weights": 3}),  # 16 KB blocks
    # and the combination with o_proj, summed over the KV heads: four levels a layer
    "fuse_all": ({}, {"fuse_mlp_down": True, "fuse_o_proj_heads": True}),
    # more programs per SM, the kernel's registers capped so that they fit (its heaviest body,
    # the attention partials, spills; the projections need 56-106 registers)
    "pps3_r168": (PPS3, {}),
    "pps4_r128": ({"programs_per_sm": 4, "max_registers": 128}, {}),
    # the same with the attention partials (the bodies with a tl.dot) not pipelined (the
    # default since the twenty-ninth session)
    "pps3_r168_nodot": ({**PPS3, "pipeline_dots": False}, {}),
    "no_dot_pipeline": ({"pipeline_dots": False}, {}),
    "dot_pipeline": ({"pipeline_dots": True}, {}),  # attention partials pipelined (before s29)
    # the attention partials' KV tiles of a task's first block loaded before its wait,
    # nothing carried for a next block (thirty-third session); with 32-position blocks, twice
    # the partials' tasks (256 of 264 programs) of half the bytes each
    "first_early": ({"first_block_early": True}, {}),
    "first_early_chunk32": ({"first_block_early": True}, {"attention_chunk": 32}),
    "dot_pipeline_chunk32": ({"pipeline_dots": True}, {"attention_chunk": 32}),
    # the levels given to two sets of programs in turn (thirty-fourth session): a program has
    # a whole level to load its next task's tiles before its wait; which layout puts both
    # sets on every SM depends on where the GPU places the programs
    "sets2_halves": ({"program_sets": 2, "program_set_layout": "halves"}, {}),
    "sets2_interleaved": ({"program_sets": 2, "program_set_layout": "interleaved"}, {}),
    # the same with a task's first two (three) 32 KB blocks loaded before its wait, so that a
    # set's tasks of a level hold their level's weights before the level before ends
    # (thirty-seventh session; sets2 lost in the thirty-fourth with only the first block
    # loaded ahead); "depth2_64k": the deeper loads without the sets. Measured in the
    # thirty-eighth session, Qwen3-0.6B: all slower than the default (RESULTS.md)
    "sets2_depth2": ({"program_sets": 2, "pipeline_depth": 2, "pipeline_bytes": 64 * 1024}, {}),
    "sets2_depth3": ({"program_sets": 2, "pipeline_depth": 3, "pipeline_bytes": 96 * 1024}, {}),
    "depth2_64k": ({"pipeline_depth": 2, "pipeline_bytes": 64 * 1024}, {}),
    # and the attention partials' KV tiles before their wait (their set is idle a level)
    "sets2_depth2_first": ({"program_sets": 2, "pipeline_depth": 2, "pipeline_bytes": 64 * 1024,
                            "first_block_early": True}, {}),
    # and a level of more than 4 blocks a program of a set (the LM head) on every program
    "sets2_depth2_spread": ({"program_sets": 2, "pipeline_depth": 2, "pipeline_bytes": 64 * 1024,
                             "program_set_spread": 4}, {}),
    # blocks taken from counters, one per 8 (4, 32) tasks of a kernel (twenty-third session)
    # q / k / v blocks of at most 16 KB, as few as that allows (at least 16 a projection):
    # Qwen2.5-0.5B's q in 112 blocks of 14 KB and k, v in 16 each, where the default's 64
    # blocks a projection make q's 25 KB and k's 3.5 KB (thirty-fifth session; not run yet)
    "qkv16k": ({}, {"by_role": (("rmsnorm_linear", 16 * 1024, 16),)}),
    # the attention's combination in one block per KV head (its group's query heads), as
    # before the thirty-fifth session; since, one block per query head
    "combine_kv_head": ({}, {"combine_per_query_head": False}),
    "claims": ({"claim_blocks": True}, {}),
    "claims4": ({"claim_blocks": 4}, {}),
    "claims32": ({"claim_blocks": 32}, {}),
}


@dataclass
class Float32Reference:
    """The model in float32: its logits along the bfloat16 reference's tokens (teacher
    forcing, one causal pass) and its own greedy tokens from the prompt."""

    logits: object  # (new tokens, vocab) tensor
    tokens: list[int]


def fp32_reference(model, prompt, ref_tokens) -> Float32Reference:
    """:class:`Float32Reference` of ``model`` (a float32 copy, freed afterwards)."""
    import copy

    import torch

    m32 = copy.deepcopy(model).float()
    device = next(model.parameters()).device
    seq = torch.tensor([prompt + ref_tokens[:-1]], device=device)
    n = len(ref_tokens)
    with torch.no_grad():
        logits = m32(seq).logits[0, len(prompt) - 1 :].float()
        out = m32.generate(torch.tensor([prompt], device=device), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False)
    del m32
    return Float32Reference(logits, out[0, len(prompt) :].tolist())


def first_mismatch(tokens: list[int], reference: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b),
                None)


def relative_errors(rows, ref):
    return [float((a - b).norm() / b.norm()) for a, b in zip(rows, ref, strict=True)]


def gaps_where_argmax_differs(rows, exact) -> list[float]:
    """Where a row's argmax is not the float32 logits' (teacher forcing): how far the float32
    logit of that token lies below the float32 maximum, in standard deviations of the float32
    row (a near tie when small)."""
    out = []
    for a, b in zip(rows, exact, strict=True):
        chosen = int(a.argmax())
        if chosen != int(b.argmax()):
            out.append(round(float((b.max() - b[chosen]) / b.std()), 4))
    return out


def run_persistent(model, prompt, ref_tokens, ref_logits, max_seq, sync, record, args) -> None:
    import torch

    cuda = torch.cuda.is_available()
    exact = fp32_reference(model, prompt, ref_tokens) if cuda else None
    if exact is not None:
        hf_err = relative_errors(ref_logits, exact.logits)
        hf_agree = sum(
            int(a.argmax()) == int(b.argmax())
            for a, b in zip(ref_logits, exact.logits, strict=True)
        )
        record(
            hf_bf16_vs_fp32_err=round(statistics.median(hf_err), 5),
            hf_bf16_argmax_vs_fp32=f"{hf_agree}/{len(hf_err)}",
            hf_bf16_first_mismatch_fp32_tokens=first_mismatch(ref_tokens, exact.tokens),
            hf_bf16_fp32_gaps_where_argmax_differs=gaps_where_argmax_differs(
                ref_logits, exact.logits),
        )
    names = args.variants if cuda else ["default"]
    for i, name in enumerate(names):
        compile_options, tile_options = VARIANTS[name]
        suffix = "" if i == 0 else f"@{name}"
        run_variant(
            model,
            prompt,
            ref_tokens,
            ref_logits,
            exact,
            max_seq,
            sync,
            record,
            args,
            compile_options,
            tile_options,
            suffix,
            trace=args.trace,
        )


def run_variant(
    model,
    prompt,
    ref_tokens,
    ref_logits,
    exact,
    max_seq,
    sync,
    record,
    args,
    compile_options,
    tile_options,
    suffix,
    trace,
) -> None:
    import torch

    from mugraph.persistent import TilePolicy, build_decoder

    cuda = torch.cuda.is_available()
    t1 = time.perf_counter()
    given = {} if args.min_blocks is None else {"min_blocks": args.min_blocks}
    tiles = (
        TilePolicy(**(given | tile_options))
        if cuda
        else TilePolicy(attention_chunk=32, min_blocks=4)
    )
    decoder = build_decoder(model, max_seq, tiles=tiles)
    t2 = time.perf_counter()
    options = {"num_warps": args.warps} if args.warps else {}
    options.update(compile_options)
    program = decoder.compile(**options)
    key = lambda k: k + suffix  # noqa: E731
    record(
        **{
            key("build_s"): round(t2 - t1, 1),
            key("codegen_s"): round(time.perf_counter() - t2, 1),
            key("tasks"): program.describe(),
        }
    )
    if not suffix:
        (Path(args.out) / f"{args.model}_persistent.py").write_text(program.source)
    with torch.no_grad():
        t3 = time.perf_counter()
        tokens = program.generate(prompt, args.new_tokens)
        mismatch = first_mismatch(tokens, ref_tokens)
        fp32 = {} if exact is None else {  # the float32 model's own greedy tokens
            key("persistent_tokens_match_fp32"): tokens == exact.tokens,
            key("first_mismatch_fp32"): first_mismatch(tokens, exact.tokens),
        }
        record(
            **{
                key("first_run_s"): round(time.perf_counter() - t3, 1),
                key("persistent_tokens_match"): tokens == ref_tokens,
                key("first_mismatch"): mismatch,
                **fp32,
                key("resources"): getattr(program, "resources", None),
            }
        )
        # teacher forcing: the reference's tokens in, our logits against its logits
        feed = prompt + ref_tokens[:-1]
        logits_buf = program.buffer(decoder.logits)
        ours = teacher_forced(program, logits_buf, feed, len(prompt) - 1)
        # a second pass must give the same bits (nothing of the default is summed in a
        # run-dependent order; a race between tasks shows here: twenty-eighth session)
        again = teacher_forced(program, logits_buf, feed, len(prompt) - 1)
        record(**{key("repeat_bit_equal"): all(
            torch.equal(a, b) for a, b in zip(ours, again, strict=True))})
        errors = relative_errors(ours, ref_logits)
        agree = sum(
            int(a.argmax()) == int(b.argmax()) for a, b in zip(ours, ref_logits, strict=True)
        )
        row = {
            key("logits_rel_err_vs_hf_bf16"): round(statistics.median(errors), 5),
            key("argmax_agree_hf_bf16"): f"{agree}/{len(errors)}",
        }
        if exact is not None:
            e32 = relative_errors(ours, exact.logits)
            a32 = sum(int(a.argmax()) == int(b.argmax())
                      for a, b in zip(ours, exact.logits, strict=True))
            row.update(
                {
                    key("logits_rel_err_vs_fp32"): round(statistics.median(e32), 5),
                    key("argmax_agree_fp32"): f"{a32}/{len(e32)}",
                    key("fp32_gaps_where_argmax_differs"): gaps_where_argmax_differs(
                        ours, exact.logits),
                }
            )
        record(**row)
        if cuda:
            record(**{key("persistent_s"): time_replayed(program, decoder, args.calls)})
    if trace and cuda:
        traced = decoder.compile(**options, trace=True, cuda_graph=False)
        traced.step(prompt[0])
        traced.step(prompt[1])
        sync()
        summary = trace_summary(traced)
        record(**{key("trace"): summary})
        stem = f"{args.model}{suffix.replace('@', '-')}_trace"
        (Path(args.out) / f"{stem}.json").write_text(json.dumps(summary, indent=1))
        save_trace(traced, Path(args.out) / f"{stem}.npz")


def time_replayed(program, decoder, calls: int) -> float:
    """Seconds per step of ``program`` replayed from a CUDA graph from its current position
    (median of 3 runs of up to ``calls`` steps, as many as the cache has room for)."""
    import torch

    # the rest of the cache holds random values (masked: they change nothing)
    for cache in decoder.k_caches + decoder.v_caches:
        cache[program.pos :].normal_()
    program.capture()
    calls = min(calls, (decoder.kernel.max_seq_len - program.pos - 10) // 4)
    seconds = time_calls(program.launch, 5, calls, 3, torch.cuda.synchronize)
    program.check_errors()
    return seconds


def teacher_forced(program, logits_buf, feed: list[int], first: int) -> list:
    """From position 0, the kernel's logits (float32) after each step from ``first`` on."""
    program.reset()
    out = []
    for i, tok in enumerate(feed):
        program.step(tok)
        if i >= first:
            out.append(logits_buf[0].float().clone())
    program.check_errors()
    return out


def save_trace(program, path: Path) -> None:
    """The raw stamps of the traced step beside each task's level, kind, program and blocks
    (for analyses the summary does not make)."""
    import numpy as np

    from mugraph.persistent.codegen import TRACE_STAMPS

    tg = program.tasks
    np.savez_compressed(
        path,
        stamps=program.trace.view(-1, TRACE_STAMPS).cpu().numpy(),
        depth=np.array([t.depth for t in tg.tasks]),
        blocks=np.array([t.num_blocks for t in tg.tasks]),
        program=np.array(task_programs(program)),
        kind=np.array(task_kinds(program)),
    )


def task_kinds(program) -> list[str]:
    """The kind of each task: its kernel's part in its layer ("proj", "gate_up"...)."""
    roles = program.kernel.roles
    return [roles[t.kernel].part if t.kernel in roles else "?" for t in program.tasks.tasks]


def task_programs(program) -> list[int]:
    """The program whose queue holds each task (-1: none, e.g. a continuation)."""
    owner = [-1] * len(program.tasks.tasks)
    for p, queue in enumerate(program.tasks.queues):
        for task in queue:
            owner[task] = p
    return owner


def trace_summary(program) -> dict:
    """Where a step's time goes, from the per-task globaltimer stamps of the last step."""
    import numpy as np

    from mugraph.persistent.codegen import TRACE_STAMPS

    tg = program.tasks
    stamps = program.trace.view(-1, TRACE_STAMPS).cpu().numpy().astype(np.float64) / 1e3  # µs
    t0 = stamps[:, 0].min()
    start, woke, end = stamps[:, 0] - t0, stamps[:, 1] - t0, stamps[:, 2] - t0
    depth = np.array([t.depth for t in tg.tasks])
    label_of = task_kinds(program)
    kind: dict[str, list[int]] = {}
    for index, label in enumerate(label_of):
        kind.setdefault(label, []).append(index)
    per_kind = {
        k: {
            "tasks": len(ix),
            "blocks": int(sum(tg.tasks[i].num_blocks for i in ix)),
            "wait_us": round(float(np.mean(woke[ix] - start[ix])), 2),
            "work_us": round(float(np.mean(end[ix] - woke[ix])), 2),
        }
        for k, ix in kind.items()
    }
    levels = []
    for d in range(int(depth.max()) + 1):
        ix = np.where(depth == d)[0]
        levels.append((float(woke[ix].min()), float(end[ix].max())))
    gaps = [levels[d][0] - levels[d - 1][1] for d in range(1, len(levels))]
    spans = [levels[d][1] - levels[d - 1][1] for d in range(1, len(levels))]
    per_level_kind: dict[str, dict] = {}  # the step's time by the kinds of task a level holds
    for d, span in enumerate(spans, start=1):
        label = "+".join(sorted({label_of[int(i)] for i in np.where(depth == d)[0]}))
        entry = per_level_kind.setdefault(label, {"levels": 0, "us": 0.0})
        entry["levels"] += 1
        entry["us"] = round(entry["us"] + span, 1)
    busy = float(np.sum(end - woke))
    total = float(end.max())
    return {
        "step_us": round(total, 1),
        "levels": len(levels),
        "mean_level_us": round(float(np.mean(spans)), 2),
        "mean_wake_after_previous_level_us": round(float(np.mean(gaps)), 2),
        "busy_fraction": round(busy / (total * program.grid[0]), 3),
        "per_kind": per_kind,
        "per_level_kind": per_level_kind,
    }


def table(rows: list[dict]) -> str:
    def us(v):
        return f"{v * 1e6:.0f} µs" if isinstance(v, (int, float)) else "-"

    head = [
        "model",
        "eager",
        "torch.compile",
        "eager + CUDA graph",
        "compile + CUDA graph",
        "mugraph persistent",
        "floor",
        "persistent / floor",
        "tokens = reference",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio = (
            f"{r['persistent_s'] / r['floor_s']:.2f}x"
            if "persistent_s" in r and "floor_s" in r
            else "-"
        )
        ours, torch_step = r.get("persistent_tokens_match", "-"), r.get("torch_tokens_match", "-")
        fp32 = r.get("persistent_tokens_match_fp32")
        also = "" if fp32 is None else f" (float32 model: {fp32})"
        match = f"{ours}{also} (torch step {torch_step})"
        cells = [
            r["model"],
            us(r.get("eager_s")),
            us(r.get("compile_s")),
            us(r.get("eager_graph_s")),
            us(r.get("compile_graph_s")),
            us(r.get("persistent_s")),
            us(r.get("floor_s")),
            ratio,
            match,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b", "llama-3.2-1b"])
    p.add_argument("--model", help=argparse.SUPPRESS)  # one model, in a subprocess
    p.add_argument("--out", default="bench_persistent_out")
    p.add_argument("--layers", type=int, default=None, help="fewer layers (smoke tests)")
    p.add_argument("--cache", type=int, default=1024)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument(
        "--warps", type=int, default=None, help="warps per program (default: the runtime's)"
    )
    p.add_argument("--min-blocks", type=int, default=None,
                   help="TilePolicy.min_blocks (default: TilePolicy's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--variants",
        nargs="+",
        default=["default"],
        choices=sorted(VARIANTS),
        help="persistent-kernel variants (the first is the table's column)",
    )
    p.add_argument("--trace", action="store_true", help="trace one step of every variant")
    p.add_argument(
        "--parts", nargs="+", default=["persistent", "torch"], choices=("persistent", "torch")
    )
    p.add_argument(
        "--part", choices=("persistent", "torch", "all"), default="all", help=argparse.SUPPRESS
    )
    p.add_argument(
        "--limits",
        type=int,
        nargs=2,
        default=(150, 110),
        metavar=("P", "T"),
        help="seconds for the persistent and the PyTorch part of each model",
    )
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.model:
        run_model(args.model, args)
        return 0
    rows_path = Path(args.out) / "rows.jsonl"
    rows_path.unlink(missing_ok=True)
    for name in args.models:
        for part, limit in zip(("persistent", "torch"), args.limits, strict=True):
            if part not in args.parts:
                continue
            cmd = [sys.executable, __file__, "--model", name, "--out", args.out, "--part", part]
            cmd += ["--variants", *args.variants] + (["--trace"] if args.trace else [])
            for key in (
                "layers",
                "cache",
                "prompt",
                "new_tokens",
                "calls",
                "warps",
                "min_blocks",
                "seed",
            ):
                value = getattr(args, key)
                if value is not None:
                    cmd += [f"--{key.replace('_', '-')}", str(value)]
            t0 = time.perf_counter()
            try:
                rc = subprocess.run(cmd, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            print(f"[{name}] {part}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
    rows: dict[str, dict] = {}
    if rows_path.exists():
        for line in rows_path.read_text().splitlines():
            d = json.loads(line)
            rows.setdefault(d["model"], {"model": d["model"]}).update(d)
    (Path(args.out) / "results.json").write_text(json.dumps(list(rows.values()), indent=1))
    print()
    print(table(list(rows.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
