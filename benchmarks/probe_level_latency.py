"""How long one dependency level of the persistent kernel takes when it does no work (GPU).

    python benchmarks/probe_level_latency.py [--levels 2000] [--programs 264]

A chain of LEVELS levels runs on P programs (two per H100 SM, as the persistent kernel runs).
At every level each program waits until the whole row of the level before is written, reads
it, sums it, and writes its own slice of the next row (4 int32 values): the shape of a decode
step's levels, where every task of a projection reads the whole hidden row that every task of
the level before wrote a piece of. The time per level is the floor that a level's wake, read
and signal cost, whatever its body computes. Two ways to signal, each checked against the
host's values of the last row:

- ``counter`` (the persistent kernel's events): a program stores its slice, passes a barrier
  and adds 1 to the level's counter with a release atomic; a reader polls that counter with
  acquire atomic adds of 0 until it reaches P, then loads the row (``.cg``).
- ``barrier``: the same, but no level reads the row before it: what the signal alone costs.
- ``shardsK``: the counter split into K counters on lines of their own; program p adds to
  counter p % K, and a reader polls all K at once (one atomic per counter).
- ``counter_ld`` / ``barrier_ld``: as ``counter`` / ``barrier``, but a reader polls with
  plain loads, ``ld.acquire.gpu`` in every thread, instead of one thread's atomic add of 0
  whose value Triton broadcasts behind a barrier (atomics on one address are served one by
  one where the adds arrive; loads of a line are not).
- ``counter_fence``: polls with ``ld.relaxed.gpu``, then one ``fence.acq_rel.gpu``.
  On the H100 (thirty-second session) both were slower than ``counter``: 2.410 and 2.847
  against 1.716 µs a level at 264 programs (``barrier_ld`` 2.048 against 1.267).
- ``flags`` (data that carries its own flag, as NCCL's LL protocol does): every value is
  stored as one 64-bit word, its step tag in the high half, and a reader loads the row
  (volatile) until every word carries this level's tag: no counter, no fence, no second load.

Under ``TRITON_INTERPRET=1`` (CPU) it runs the kernels with one program, as a check of their
arithmetic (no times).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

SLICE = 4  # values each program writes a level
LINE: tl.constexpr = tl.constexpr(32)  # int32 between two counters: one 128-byte line each
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, 1 program


@triton.jit
def _poll(ptr, POLL: tl.constexpr):
    """One read of a counter: 0, an acquire atomic add of 0; 1, ``ld.acquire.gpu``; 2,
    ``ld.relaxed.gpu`` (the caller fences once it has seen enough)."""
    if POLL == 0:
        value = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    elif POLL == 1:
        value = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                          dtype=tl.int32, is_pure=False, pack=1)
    else:
        value = tl.inline_asm_elementwise("ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                          dtype=tl.int32, is_pure=False, pack=1)
    return value


@triton.jit
def counter_chain(rows, evt, LEVELS: tl.constexpr, P: tl.constexpr, WIDTH: tl.constexpr,
                  SHARDS: tl.constexpr, READ: tl.constexpr, POLL: tl.constexpr = 0):
    """Program p adds 1 to shard p % SHARDS of the level's counter (each shard on a line of
    its own, LINE int32 apart); a reader polls every shard until each has all its adds
    (``POLL``: how, see :func:`_poll`)."""
    pid = tl.program_id(0)
    n = P * 4
    cols = tl.arange(0, WIDTH)
    mine = tl.arange(0, 4)
    shard = tl.arange(0, SHARDS)
    want = P // SHARDS + (shard < P % SHARDS).to(tl.int32)  # programs per shard
    for lvl in range(1, LEVELS + 1):
        if SHARDS == 1:
            while _poll(evt + (lvl - 1) * LINE, POLL) < P:
                pass
            if POLL == 2:
                tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [],
                                          dtype=tl.int32, is_pure=False, pack=1)
        else:  # every shard polled at once (a tensor carried by the loop crashed Triton 3.6)
            lines = evt + ((lvl - 1) * SHARDS + shard) * LINE
            while tl.sum((tl.atomic_add(lines, tl.zeros_like(shard), sem="acquire",
                                        scope="gpu") < want).to(tl.int32), axis=0) > 0:
                pass
        if READ:
            row = tl.load(rows + (lvl - 1) * n + cols, mask=cols < n, other=0,
                          cache_modifier=".cg")
            total = tl.sum(row, axis=0)
        else:
            total = 0
        tl.store(rows + lvl * n + pid * 4 + mine, total + pid * 4 + mine)
        tl.debug_barrier()
        tl.atomic_add(evt + (lvl * SHARDS + pid % SHARDS) * LINE, 1, sem="release",
                      scope="gpu")


@triton.jit
def flag_chain(words, LEVELS: tl.constexpr, P: tl.constexpr, WIDTH: tl.constexpr):
    pid = tl.program_id(0)
    n = P * 4
    cols = tl.arange(0, WIDTH)
    mine = tl.arange(0, 4)
    for lvl in range(1, LEVELS + 1):
        total = tl.sum(tagged_row(words + (lvl - 1) * n + cols, cols < n, lvl - 1), axis=0)
        store_tagged(words + lvl * n + pid * 4 + mine, total + pid * 4 + mine, lvl)


@triton.jit
def tagged_row(ptrs, valid, level):
    """A row of 64-bit words (value | level << 32) read (volatile) until every valid word
    carries ``level``; its int32 values."""
    tag = tl.full([], level, tl.int64)
    word = tl.load(ptrs, mask=valid, other=tag << 32, volatile=True)
    while tl.min(((word >> 32) == tag).to(tl.int32), axis=0) == 0:
        word = tl.load(ptrs, mask=valid, other=tag << 32, volatile=True)
    return (word & 0xFFFFFFFF).to(tl.uint32).to(tl.int32, bitcast=True)


@triton.jit
def store_tagged(ptrs, values, level):
    """int32 ``values`` stored as 64-bit words carrying ``level`` in their high half."""
    words = values.to(tl.uint32, bitcast=True).to(tl.int64)
    tl.store(ptrs, words | (tl.full([], level, tl.int64) << 32), cache_modifier=".cg")


MODES = ("counter", "barrier", "shards4", "shards8", "shards16", "flags", "counter_ld",
         "barrier_ld", "counter_fence")
POLLS = {"_ld": 1, "_fence": 2}  # mode suffix: how a reader polls (inline PTX: GPU only)


def runnable(modes) -> list[str]:
    """The modes this machine runs: the interpreter (CPU) runs no inline PTX."""
    if DEVICE == "cuda":
        return list(modes)
    return [m for m in modes if poll_of(m)[1] == 0]


def poll_of(mode: str) -> tuple[str, int]:
    """The mode without its poll suffix, and how its readers poll (0: the atomic)."""
    for suffix, poll in POLLS.items():
        if mode.endswith(suffix):
            return mode.removesuffix(suffix), poll
    return mode, 0


def expected_last_row(first: torch.Tensor, levels: int, programs: int) -> torch.Tensor:
    """The host's last row: every value of a row is the wrapped int32 sum of the row before
    plus its position."""
    row = first.to(torch.int64)
    pos = torch.arange(programs * SLICE, dtype=torch.int64)
    for _ in range(levels):
        total = int(row.sum()) & 0xFFFFFFFF
        row = (total + pos) & 0xFFFFFFFF
    return torch.where(row >= 2**31, row - 2**32, row)


def timed_launch(kernel, programs: int, args) -> float:
    """Microseconds of one launch of ``kernel`` on ``programs`` programs (CUDA events; 0 in
    the interpreter, which only runs it)."""
    if DEVICE != "cuda":
        kernel[(programs,)](*args)
        return 0.0
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kernel[(programs,)](*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


def tagged_values(words: torch.Tensor) -> torch.Tensor:
    """The int32 values (as int64) in the low halves of a row of tagged 64-bit words."""
    low = words.cpu() & 0xFFFFFFFF
    return torch.where(low >= 2**31, low - 2**32, low)


def run(mode: str, levels: int, programs: int, repeats: int) -> tuple[float, bool | None]:
    """Microseconds per level (median of ``repeats`` launches) and whether the last row was
    right every time (None where the levels read nothing: ``barrier``)."""
    n = programs * SLICE
    width = triton.next_power_of_2(n)
    first = torch.arange(n, dtype=torch.int32) * 7 + 3
    want = expected_last_row(first, levels, programs)
    base, poll = poll_of(mode)
    shards = int(base[len("shards"):]) if base.startswith("shards") else 1
    read = base != "barrier"  # barrier_ld too
    times, right = [], True
    for _ in range(repeats + 1):
        if mode == "flags":
            words = torch.zeros((levels + 1, n), dtype=torch.int64, device=DEVICE)
            words[0] = first.to(torch.int64).to(DEVICE) & 0xFFFFFFFF
            kernel, args = flag_chain, (words, levels, programs, width)
        else:
            rows = torch.zeros((levels + 1, n), dtype=torch.int32, device=DEVICE)
            rows[0] = first.to(DEVICE)
            evt = torch.zeros((levels + 1, shards, LINE.value), dtype=torch.int32, device=DEVICE)
            evt[0, :, 0] = programs  # the first row is there
            kernel, args = counter_chain, (rows, evt, levels, programs, width, shards, read,
                                           poll)
        times.append(timed_launch(kernel, programs, args) / levels)
        if mode == "flags":
            got = tagged_values(words[levels])
        else:
            got = rows[levels].cpu().to(torch.int64)
        right &= bool(torch.equal(got, want))
    times = sorted(times[1:])  # the first launch compiles
    return times[len(times) // 2], right if read else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=2000)
    parser.add_argument("--programs", type=int, nargs="+", default=[264, 132])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    args = parser.parse_args()
    print("| signal | programs | µs per level | last row right |")
    print("| --- | --- | --- | --- |")
    modes = runnable(args.modes)
    for programs in args.programs:
        for mode in modes:
            us, right = run(mode, args.levels, programs, args.repeats)
            print(f"| {mode} | {programs} | {us:.3f} | {right} |", flush=True)


if __name__ == "__main__":
    main()
