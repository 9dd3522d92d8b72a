"""A Llama-3.2-1B-sized model (random weights) through eager PyTorch, ``torch.compile`` (default:
Inductor) and ``torch.compile(backend="mugraph")``: prefill and one decode step.

    python benchmarks/bench_models.py                      # on a GPU: the 1B model, float16
    python benchmarks/bench_models.py --warm-cache DIR     # on the CPU: fill DIR with the class
                                                           # searches the 1B run needs
The GPU run prints, per mode, the first call (compile) time, the median time of a prefill of
``--prefill`` tokens and of a decode step whose attention sees ``--kv`` keys (a cache of
``kv - 1`` tokens plus the new one; the cache is cropped back after each step), the largest
relative difference of the last-token logits from eager, and the speedup over torch.compile.
mugraph's class searches only depend on the representative programs (every large dim 64), so
``--warm-cache`` runs a small model with the same representatives on the CPU to fill the
cache; the GPU run then tiles, verifies and compiles for the real sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path

import torch

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=True)
# the same shape-class representatives as LLAMA_1B (large dims > 16, small dims 2..16)
MINI = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
            rope_theta=500000.0, tie_word_embeddings=True)


def build(sizes: dict, dtype: torch.dtype, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**sizes, attn_implementation="sdpa"))
    return model.to(dtype).eval()


def prefill_fn(model, ids):
    return lambda: model(ids, use_cache=False, logits_to_keep=1).logits


def decode_setup(model, kv: int, vocab: int, device: str):
    """A DynamicCache of ``kv - 1`` tokens (from an eager prefill) and the next token."""
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (1, kv - 1), device=device)
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
    return out.past_key_values, torch.randint(0, vocab, (1, 1), device=device)


def decode_fn(model, cache, token, kv: int):
    position = torch.tensor([[kv - 1]], device=token.device)

    def step():
        logits = model(token, past_key_values=cache, position_ids=position, use_cache=True,
                       logits_to_keep=1).logits
        cache.crop(-1)  # back to kv - 1 tokens
        return logits

    return step


def timed(fn, reps: int, cuda: bool) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls (after 3 warm-up calls)."""
    return statistics.median(samples(fn, reps, cuda))


def samples(fn, reps: int, cuda: bool, warmup: int = 3) -> list[float]:
    """Milliseconds of each of ``reps`` calls of ``fn()`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.float().abs().max().clamp_min(1e-30)
    return float((got.float() - want.float()).abs().max() / scale)


def compiled_model(model, mode: str, options: dict):
    import mugraph.integration  # noqa: F401 - registers the backend

    # the modes' compiled graphs live side by side (Dynamo guards each on its backend), so
    # that their timing can be interleaved: no reset, room for every mode's graphs
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    if mode == "eager":
        return model
    if mode == "torch.compile":
        return torch.compile(model)
    return torch.compile(model, backend="mugraph", options=options, dynamic=False)


def run_mode(model, mode: str, args, ids, cache0, token, reference: dict, options: dict,
             calls: dict) -> dict:
    """Compile ``mode`` and make its first calls (the row's compile times and errors); its
    callables go to ``calls[(mode, phase)]`` for the interleaved timing."""
    import mugraph.integration as mgi

    cuda = args.device == "cuda"
    row: dict = {"mode": mode}
    fn_model = compiled_model(model, mode, options)
    mgi.clear_reports()
    for phase in args.phases.split(","):
        if phase == "prefill":
            fn = prefill_fn(fn_model, ids)
        else:
            cache = copy.deepcopy(cache0)
            fn = decode_fn(fn_model, cache, token, args.kv)
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                out = fn()
                if cuda:
                    torch.cuda.synchronize()
                row[f"{phase}_compile_s"] = time.perf_counter() - t0
                if mode == "eager":
                    reference[phase] = out.clone()
                row[f"{phase}_err"] = rel_err(out, reference[phase])
                samples(fn, 0, cuda)  # warm-up calls (Dynamo may specialize once more)
                calls[(mode, phase)] = fn
        except Exception as error:  # noqa: BLE001 - report the failure, keep the other modes
            row[f"{phase}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    if mode == "mugraph":
        row["reports"] = [r.format() for r in mgi.reports()]
        row["taken"] = {}
        for report in mgi.reports():
            for part in report.taken:
                key = part.shape_class or "other"
                row["taken"][key] = row["taken"].get(key, 0) + 1
    return row


@contextlib.contextmanager
def _counting_slow_calls():
    """Counts calls of mugraph's compiled programs that take the checked (slow) path."""
    from mugraph.runtime.compiled import CompiledProgram

    count = [0]
    checked = CompiledProgram._call_checked

    def counting(self, inputs):
        count[0] += 1
        return checked(self, inputs)

    CompiledProgram._call_checked = counting
    try:
        yield count
    finally:
        CompiledProgram._call_checked = checked


def time_interleaved(rows: list[dict], calls: dict, rounds: int, reps: int, cuda: bool) -> None:
    """Time every (mode, phase) in ``rounds`` rounds of ``reps`` calls each, the modes one
    after the other within a round, so that a drift of the machine's speed (the host's
    speed moved by up to 2x between calls of the same program minutes apart) falls on every
    mode alike. The row gets the median of all calls and the spread of the round medians."""
    import mugraph.integration as mgi

    times: dict = {key: [] for key in calls}
    medians: dict = {key: [] for key in calls}
    slow = dict.fromkeys(calls, 0)
    reports = len(mgi.reports())
    with torch.no_grad():
        for _ in range(rounds):
            for key, fn in calls.items():
                with _counting_slow_calls() as count:
                    got = samples(fn, reps, cuda, warmup=1)
                slow[key] += count[0]
                times[key] += got
                medians[key].append(statistics.median(got))
    by_mode = {r["mode"]: r for r in rows}
    for (mode, phase), got in times.items():
        row = by_mode[mode]
        row[f"{phase}_ms"] = statistics.median(got)
        row[f"{phase}_round_ms"] = [round(m, 3) for m in medians[(mode, phase)]]
        if mode == "mugraph":  # compiled-program calls that missed their fast plan
            row[f"{phase}_slow_calls"] = slow[(mode, phase)]
    if len(mgi.reports()) != reports:
        print(f"warning: mugraph compiled {len(mgi.reports()) - reports} more graphs while "
              "timing (a Dynamo guard failed)")


FULL_PATH = "mugraph, full calls"


def full_path_row(calls: dict) -> dict:
    """The mugraph mode's compiled model again, its operator calls kept off their recorded
    launches (``mugraph.integration.flat_calls``): the same kernels through the full Python
    path, timed in the same rounds."""
    from mugraph.integration import flat_calls

    def full(fn):
        def call():
            flat_calls.enabled = False
            try:
                return fn()
            finally:
                flat_calls.enabled = True

        return call

    for (mode, phase), fn in list(calls.items()):
        if mode == "mugraph":
            calls[(FULL_PATH, phase)] = full(fn)
    return {"mode": FULL_PATH}


def errors_after_timing(rows: list[dict], calls: dict, reference: dict) -> None:
    """Each mode's output once more after the timed calls, against eager's first (a decode
    step is the same step every call): what the steady state computes, recorded launches
    included."""
    by_mode = {r["mode"]: r for r in rows}
    with torch.no_grad():
        for (mode, phase), fn in calls.items():
            if phase in reference:
                by_mode[mode][f"{phase}_err_after"] = rel_err(fn(), reference[phase])


def print_call_sites() -> None:
    """How mugraph's operator call sites ran while timing (recorded launches or full path)."""
    from mugraph.integration.runtime import call_site_stats

    stats = call_site_stats()
    if not stats:
        return
    flat = sum(s["flat_calls"] for s in stats)
    full = sum(s["full_calls"] for s in stats)
    print(f"mugraph operator calls: {flat} on recorded launches, {full} on the full path, "
          f"{len(stats)} call sites")
    notes: dict[str, int] = {}
    for s in stats:
        notes[s["note"]] = notes.get(s["note"], 0) + 1
    for note, count in sorted(notes.items(), key=lambda kv: -kv[1]):
        print(f"  {count} sites: {note}")


def graph_replays(rows: list[dict], calls: dict, reps: int) -> None:
    """Each mode's prefill captured in one CUDA graph and replayed: its GPU time without the
    host (what the mode's kernels cost; the timed calls above add the host's launching). Run
    last: a capture leaves the model's state as it was, but nothing is timed after it."""
    by_mode = {r["mode"]: r for r in rows}
    with torch.no_grad():
        for (mode, phase), fn in calls.items():
            if phase != "prefill" or mode == FULL_PATH:
                continue
            try:
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    fn()
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    fn()
                by_mode[mode]["prefill_graph_ms"] = statistics.median(
                    samples(graph.replay, reps, True))
            except Exception as error:  # noqa: BLE001 - reported, the other modes go on
                by_mode[mode]["prefill_graph_error"] = f"{type(error).__name__}: {error}"[:200]
    base = by_mode.get("torch.compile", {}).get("prefill_graph_ms")
    print("\n| mode | prefill as one CUDA graph, ms (GPU only) | vs torch.compile |\n"
          "| --- | --- | --- |")
    for r in rows:
        if "prefill_graph_ms" in r:
            ratio = f"{base / r['prefill_graph_ms']:.2f}x" if base else "-"
            print(f"| {r['mode']} | {r['prefill_graph_ms']:.3f} | {ratio} |")
        elif "prefill_graph_error" in r:
            print(f"| {r['mode']} | {r['prefill_graph_error']} | - |")


def table(rows: list[dict]) -> str:
    base = {r["mode"]: r for r in rows}.get("torch.compile", {})
    lines = ["| mode | prefill ms | decode ms | prefill vs torch.compile | decode vs "
             "torch.compile | best round prefill / decode ms (vs torch.compile) | first call "
             "prefill / decode s | max rel err (prefill, decode) | after timing |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    def cell(r, key):
        if key in r:
            return f"{r[key]:.3f}"
        return "failed" if key.replace("_ms", "_error") in r else "-"

    def speed(r, phase):
        k = f"{phase}_ms"
        return f"{base[k] / r[k]:.2f}x" if k in r and k in base else "-"

    def best(r):
        """The fastest round's median per phase, and its ratio to torch.compile's fastest
        round (on a host whose speed swings between rounds, the unloaded speeds)."""
        cells = []
        for phase in ("prefill", "decode"):
            k = f"{phase}_round_ms"
            if not r.get(k):
                cells.append("-")
                continue
            ratio = f" ({min(base[k]) / min(r[k]):.2f}x)" if base.get(k) else ""
            cells.append(f"{min(r[k]):.3f}{ratio}")
        return " / ".join(cells)

    for r in rows:
        first = " / ".join(f"{r[f'{p}_compile_s']:.1f}" if f"{p}_compile_s" in r else "-"
                           for p in ("prefill", "decode"))
        errs, after = (", ".join(f"{r[f'{p}{k}']:.1e}" if f"{p}{k}" in r else "-"
                                 for p in ("prefill", "decode"))
                       for k in ("_err", "_err_after"))
        lines.append(f"| {r['mode']} | {cell(r, 'prefill_ms')} | {cell(r, 'decode_ms')} | "
                     f"{speed(r, 'prefill')} | {speed(r, 'decode')} | {best(r)} | {first} | "
                     f"{errs} | {after} |")
    return "\n".join(lines)


def warm_cache(directory: str, time_limit: float, kv: int, workers: int = 1) -> None:
    """Fill ``directory`` with the class searches of the 1B run (CPU, float16): also the
    answers with a for-loop required that a GPU tiles next to a one-block answer (the CPU
    searches them only when the one-block answer has no tiling), by taking the backend's GPU
    branch here with no timer (the first answer is kept; only the cache matters). The decode
    step's attention is also searched at its real sizes on a GPU (its class answer cannot
    split the KV sequence): a one-layer model of the 1B's widths fills that search (ranked
    by the cost model here; without it the GPU searches and ranks it at the first call)."""
    import mugraph.integration as mgi
    from mugraph.integration import dynamo

    dynamo._arch = lambda captured: "sm_90"
    dynamo._tiling_timer = lambda program: None
    model = build(MINI, torch.float16, "cpu")
    options = {"time_limit": time_limit, "cache_dir": directory, "workers": workers}
    ids = torch.randint(0, MINI["vocab_size"], (1, 32))
    cache, token = decode_setup(model, 32, MINI["vocab_size"], "cpu")
    compiled = compiled_model(model, "mugraph", options)
    with torch.no_grad():
        prefill_fn(compiled, ids)()
        decode_fn(compiled, cache, token, 32)()
        with _decode_mask_kept(True):
            torch._dynamo.reset()
            decode_fn(compiled_model(model, "mugraph", options), cache, token, 32)()
    wide = {**LLAMA_1B, "num_hidden_layers": 1, "vocab_size": MINI["vocab_size"]}
    model = build(wide, torch.float16, "cpu")
    cache, token = decode_setup(model, kv, wide["vocab_size"], "cpu")
    for causal_mask in (False, True):
        torch._dynamo.reset()
        compiled = compiled_model(model, "mugraph", options)
        with torch.no_grad(), _decode_mask_kept(causal_mask):
            decode_fn(compiled, cache, token, kv)()
    for report in mgi.reports():
        print(report.format())


@contextlib.contextmanager
def _decode_mask_kept(kept: bool):
    """Whether transformers passes the decode step's (all-true) causal mask to SDPA under
    torch.compile: it does on PyTorch before 2.14 (the GPU machine's 2.11), so the attention
    partition there multiplies by a mask; the CPU's PyTorch drops it. Both forms are cached."""
    if not kept:
        yield
        return
    from transformers import masking_utils

    skip = masking_utils._ignore_causal_mask_sdpa
    masking_utils._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--kv", type=int, default=1024, help="keys the decode step attends to")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per mode and phase")
    parser.add_argument("--rounds", type=int, default=5,
                        help="the timed calls are split into this many interleaved rounds")
    parser.add_argument("--layers", type=int, default=LLAMA_1B["num_hidden_layers"])
    parser.add_argument("--modes", default="eager,mugraph,torch.compile")
    parser.add_argument("--phases", default="prefill,decode", help="prefill, decode or both")
    parser.add_argument("--rest", default="inductor", choices=["eager", "inductor"],
                        help="what runs the nodes outside mugraph's partitions")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1, help="search worker processes")
    parser.add_argument("--out", default=None, help="write results.json and the reports here")
    parser.add_argument("--warm-cache", default=None, metavar="DIR")
    parser.add_argument("--mini", action="store_true", help="the small model (a CPU dry run)")
    parser.add_argument("--no-graph-replay", action="store_true",
                        help="do not also time each mode's prefill replayed as a CUDA graph")
    parser.add_argument("--no-full-path-row", action="store_true",
                        help="do not also time mugraph with its calls on the full path")
    args = parser.parse_args(argv)
    if args.warm_cache:
        warm_cache(args.warm_cache, args.time_limit, args.kv, args.workers)
        return 0
    dtype = getattr(torch, args.dtype)
    sizes = dict(MINI) if args.mini else {**LLAMA_1B, "num_hidden_layers": args.layers}
    model = build(sizes, dtype, args.device)
    ids = torch.randint(0, sizes["vocab_size"], (1, args.prefill), device=args.device)
    cache0, token = decode_setup(model, args.kv, sizes["vocab_size"], args.device)
    options = {"time_limit": args.time_limit, "cache_dir": args.cache_dir, "rest": args.rest,
               "workers": args.workers}
    reference: dict = {}
    rows = []
    calls: dict = {}
    for mode in ["eager", *[m for m in args.modes.split(",") if m != "eager"]]:
        started = time.perf_counter()
        rows.append(run_mode(model, mode, args, ids, cache0, token, reference, options, calls))
        print(f"{mode}: done in {time.perf_counter() - started:.1f} s "
              f"{ {k: v for k, v in rows[-1].items() if k not in ('reports',)} }", flush=True)
        if args.out:  # after every mode, so a run cut short keeps what it measured
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
        if mode == "mugraph":
            for text in rows[-1].get("reports", []):
                print("\n".join(line for line in text.splitlines()
                                if "mugraph_partition" in line or line.startswith("mugraph")))
    if "mugraph" in args.modes.split(",") and not args.no_full_path_row:
        rows.append(full_path_row(calls))
    time_interleaved(rows, calls, args.rounds, max(1, args.reps // args.rounds),
                     args.device == "cuda")
    errors_after_timing(rows, calls, reference)
    print_call_sites()
    if args.device == "cuda" and not args.no_graph_replay:
        graph_replays(rows, calls, args.reps)
    if args.out:
        (Path(args.out) / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    for r in rows:
        print(f"{r['mode']}: " + ", ".join(f"{p} round medians {r.get(p + '_round_ms')}"
                                             for p in ("prefill", "decode")))
    layers = sizes["num_hidden_layers"]
    print(f"\nLlama-3.2-1B-sized ({layers} layers, random weights, {args.dtype}) on "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else args.device}: prefill "
          f"{args.prefill} tokens, decode with {args.kv} keys; rest={args.rest}")
    print(table(rows))
    for r in rows:
        if "taken" in r:
            print(f"mugraph partitions on mugraph, by class: {r['taken']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
