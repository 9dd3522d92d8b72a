"""Dump the programs (and class representatives) of a small Llama's mugraph partitions.

    python benchmarks/probe_partitions.py OUT_DIR [--device cuda] [--class attention]

Builds ``bench_models.MINI`` (or ``LLAMA_1B``; random weights), runs one prefill through
``torch.compile(backend="mugraph")`` with a fresh cache, and writes each partition's program
and representative in mugraph's text form, with the class search's outcome, to OUT_DIR: to
compare what two machines (two ``transformers`` versions) hand the search.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    import tempfile

    import torch
    import transformers

    import mugraph.integration as mgi
    from benchmarks.bench_models import LLAMA_1B, MINI, build
    from mugraph.integration import dynamo
    from mugraph.search import shape_class as sc

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=["float16", "float32"])
    parser.add_argument("--sizes", default="mini", choices=["mini", "1b"])
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--only", default="attention", help="shape class to dump ('' = all)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    original = dynamo._optimize_by_class
    seen: list[str] = []

    def dumping(program, cls, options, arch, part, cache):
        best = original(program, cls, options, arch, part, cache)
        if args.only and cls.name != args.only:
            return best
        n = len(seen)
        seen.append(cls.name)
        small = sc.representative(program)
        text = [f"# class {cls.name}: {part.status}, {part.search} {part.detail}",
                "## program", program.to_text()]
        if small is not None:
            text += ["## representative", small.to_text()]
        (out / f"{n:02d}_{cls.name}.mgt").write_text("\n".join(text) + "\n")
        return best

    dynamo._optimize_by_class = dumping
    dtype = getattr(torch, args.dtype or ("float16" if args.device == "cuda" else "float32"))
    sizes = dict(MINI if args.sizes == "mini" else LLAMA_1B)
    if args.layers:
        sizes["num_hidden_layers"] = args.layers
    model = build(sizes, dtype, args.device)
    ids = torch.randint(0, sizes["vocab_size"], (1, args.tokens), device=args.device)
    with tempfile.TemporaryDirectory() as cache_dir, torch.no_grad():
        compiled = torch.compile(model, backend="mugraph", dynamic=False,
                                 options={"time_limit": 30, "cache_dir": cache_dir})
        compiled(ids, use_cache=False, logits_to_keep=1)
    (out / "versions.txt").write_text(f"torch {torch.__version__} transformers "
                                      f"{transformers.__version__}\n")
    for report in mgi.reports():
        print(report)
    print(f"{len(seen)} partitions dumped to {out}")


if __name__ == "__main__":
    main()
