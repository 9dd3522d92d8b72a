"""bfloat16 accuracy of the persistent kernel against float32, beside transformers' own bf16.

CPU only (Triton's interpreter): a Qwen3-shaped tiny model with transformers' random
initialisation runs a prompt through the persistent kernel in bfloat16; its logits and
transformers' bfloat16 logits are both compared with the float32 model's. The interpreter
converts float32 to bfloat16 by truncation where a GPU rounds to nearest; ``--round-nearest``
(default on) makes the interpreter round like the GPU, so the numbers predict the GPU's::

    python benchmarks/bench_persistent_accuracy.py --layers 6
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics

os.environ.setdefault("TRITON_INTERPRET", "1")


def round_to_nearest_in_interpreter() -> None:
    """Make the interpreter's float32 -> bfloat16 casts round to nearest (as on a GPU)."""
    import numpy as np
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interp

    original = interp.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            values = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            data = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interp.TensorHandle(data, dst_type.scalar)
        return original(self, src, dst_type)

    interp.InterpreterBuilder.cast_impl = cast_impl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--prompt", type=int, default=6)
    p.add_argument("--truncate", action="store_true", help="keep the interpreter's truncation")
    args = p.parse_args()
    if not args.truncate:
        round_to_nearest_in_interpreter()
    import torch
    import transformers

    from mugraph.persistent import TilePolicy, build_decoder

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
        tie_word_embeddings=True)
    m16 = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    m32 = copy.deepcopy(m16).float()
    prompt = torch.randint(0, config.vocab_size, (args.prompt,)).tolist()
    with torch.no_grad():
        l16 = m16(torch.tensor([prompt])).logits[0].float()
        l32 = m32(torch.tensor([prompt])).logits[0].float()
    decoder = build_decoder(m16, 8, tiles=TilePolicy(min_blocks=2, attention_chunk=8,
                                                     argmax_parts=4))
    program = decoder.compile()
    logits = program.buffer(decoder.logits)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    ours, theirs = [], []
    for i, token in enumerate(prompt):
        program.step(token)
        ours.append(rel(logits[0].float(), l32[i]))
        theirs.append(rel(l16[i], l32[i]))
    mode = "truncation" if args.truncate else "round to nearest"
    print(f"{args.layers} layers, {len(prompt)} positions, interpreter casts by {mode}")
    print(f"persistent bf16 vs fp32: median relative error {statistics.median(ours):.4f}")
    print(f"transformers bf16 vs fp32: median relative error {statistics.median(theirs):.4f}")


if __name__ == "__main__":
    main()
