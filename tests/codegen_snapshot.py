"""The generated Triton source of every known graph, as hashes: what tests/test_codegen_lowered.py
compares with the stored snapshot (tests/golden/codegen_sources.json), so a change to how the
code generator reaches its decisions cannot silently change what it emits.

Covered: every kernel of tests/known_graphs.py (library and searched graphs), and the graphs of
tests/test_codegen.py that take the Triton 3.6 workaround (:func:`workaround_graphs`), under
the codegen options the tests and the runtime use (:data:`VARIANTS`), the chained launches, and
the task bodies of the persistent decoders of tests/test_persistent.py (when transformers is
present).

``python tests/codegen_snapshot.py --write`` rewrites the snapshot; without ``--write`` it
prints the keys whose hash changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mugraph.codegen.chained import generate_chained  # noqa: E402
from mugraph.codegen.stable_exp import NO_CARRY, softmax_carry_plan  # noqa: E402
from mugraph.codegen.triton_gen import CodegenOptions, generate_kernel  # noqa: E402
from mugraph.errors import MugraphError  # noqa: E402
from mugraph.ir.ops import OpKind  # noqa: E402

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "golden" / "codegen_sources.json"

BASE = CodegenOptions(interpret=True)
VARIANTS: dict[str, CodegenOptions] = {
    "interpret": BASE,
    "gpu": replace(BASE, interpret=False),
    "index64": replace(BASE, index64=True),
    "no_hoist": replace(BASE, hoist_invariants=False),
    "unroll": replace(BASE, unroll=True),
    "no_unroll": replace(BASE, unroll=False),
    "no_stable_exp": replace(BASE, stable_exp=False),
    "no_defer": replace(BASE, defer_reductions=False),
    "gemv_defer": replace(BASE, gemv_form="defer"),
    "gemv_dot": replace(BASE, gemv_form="dot", interpret=False),
    "no_stream": replace(BASE, stream_loads=False),
    "no_split": replace(BASE, split_mixed_loads=False),
    "dot32": replace(BASE, dot_min_dim=32),
}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def known_graphs():
    sys.path.insert(0, str(HERE))
    from known_graphs import library_graphs, searched_graphs

    yield from library_graphs()
    yield from searched_graphs()
    yield from workaround_graphs()


def _outcome(make) -> str:
    try:
        return digest(make())
    except MugraphError as error:
        return "error " + digest(f"{type(error).__name__}: {error}")


def workaround_graphs():
    """(name, graph) of products whose B operand comes from a tl.dot (the Triton 3.6
    workaround: transposed products, float32 operands), which no known graph has."""
    sys.path.insert(0, str(HERE))
    from known_graphs import one_kernel

    lora = [((16, 64), (-1, -1, -1), 1), ((64, 64), (1, -1, -1), 0),
            ((64, 16), (-1, -1, -1), 0), ((16, 64), (1, -1, -1), -1)]
    flat = [((16, 64), (-1, -1, -1), -1), ((64, 64), (-1, -1, -1), -1),
            ((64, 16), (-1, -1, -1), -1), ((16, 64), (1, -1, -1), -1)]
    pair = [((16, 32), (-1, -1, -1), -1), ((32, 64), (-1, -1, -1), -1),
            ((64, 16), (-1, -1, -1), -1), ((16, 64), (1, -1, -1), -1)]
    out = (1, -1, -1)
    yield "workaround/chained", one_kernel(lora, lambda tb, t: [
        (tb.forloop_accum(tb.matmul(t[0], tb.matmul(t[2], t[3]))), out, -1)], loops=4)
    yield "workaround/sum", one_kernel(lora, lambda tb, t: [
        (tb.forloop_accum(tb.matmul(t[0], tb.add(t[1], tb.matmul(t[2], t[3])))), out, -1)],
        loops=4)
    yield "workaround/dot3", one_kernel(flat, lambda tb, t: [
        (tb.matmul(t[0], tb.matmul(t[1], tb.matmul(t[2], t[3]))), out, -1)])
    yield "workaround/two_dots", one_kernel(pair, lambda tb, t: [
        (tb.matmul(tb.matmul(t[0], t[1]), tb.matmul(t[2], t[3])), out, -1)])


def graph_sources(name: str, graph) -> dict[str, str]:
    """Key -> hash of every kernel source (or error) of ``graph`` under every variant."""
    found = {}
    kernels = [i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED]
    for variant, options in VARIANTS.items():
        carry = softmax_carry_plan(graph) if options.stable_exp else NO_CARRY
        for i in kernels:
            part = (graph.ops[i].attr("graph"), f"mg_k{i}", f"kernel %{i}", options, carry.of(i))
            found[f"{name} %{i} {variant}"] = _outcome(
                lambda p=part: generate_kernel(*p).source)
    carry = softmax_carry_plan(graph)
    for i, j in zip(kernels, kernels[1:], strict=False):  # adjacent pairs, chained
        parts = [(graph.ops[k].attr("graph"), f"mg_k{k}", f"kernel %{k}", BASE, carry.of(k))
                 for k in (i, j)]
        found[f"{name} %{i}+%{j} chained"] = _outcome(
            lambda p=parts: generate_chained(p, "mg_c", "chained").source)
    return found


def persistent_sources() -> dict[str, str]:
    """Key -> hash of every task body of the tiny persistent decoders (empty without
    transformers)."""
    try:
        import torch
        import transformers
    except ImportError:
        return {}
    from mugraph.persistent import TilePolicy, build_decoder
    from mugraph.persistent.codegen import PersistentOptions, generate_body
    from mugraph.persistent.runtime import kernel_specs

    tiles = TilePolicy(weight_tile_bytes=64 * 1024, min_blocks=2, attention_chunk=16,
                       argmax_parts=4, copy_tile=32)
    found = {}
    for kind in ("qwen3", "llama"):
        torch.manual_seed(0)
        common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=True)
        config = (transformers.Qwen3Config(num_key_value_heads=2, **common) if kind == "qwen3"
                  else transformers.LlamaConfig(num_key_value_heads=1, **common))
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        decoder = build_decoder(model, 16, tiles=tiles)
        for label, options in (("topo", PersistentOptions(interpret=True)),
                               ("gpu", PersistentOptions(interpret=False)),
                               ("no_hoist", PersistentOptions(interpret=True, hoist=False))):
            for spec in kernel_specs(decoder.kernel):
                found[f"persistent {kind} {spec.label} {label}"] = _outcome(
                    lambda s=spec, o=options: generate_body(s, "mg_body", o).text)
    return found


def all_sources() -> dict[str, str]:
    found = {}
    for name, graph in known_graphs():
        found.update(graph_sources(name, graph))
    found.update(persistent_sources())
    return found


def main() -> int:
    now = all_sources()
    if "--write" in sys.argv:
        SNAPSHOT.write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
        print(f"wrote {len(now)} hashes to {SNAPSHOT}")
        return 0
    stored = json.loads(SNAPSHOT.read_text())
    changed = sorted(k for k in stored.keys() | now.keys() if stored.get(k) != now.get(k))
    for key in changed:
        print(key, stored.get(key), now.get(key))
    print(f"{len(now)} sources, {len(changed)} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
