"""Whether a level's weight stream can overlap the level before's wake, work and signal (GPU).

    python benchmarks/probe_level_overlap.py [--levels 400] [--programs 264] [--tiles 4096 8192]

The persistent kernel's step costs about its bytes plus a fixed 1.2-2.3 µs a level (the
thirty-fourth session's trace of Qwen3-0.6B: the q/k/v level 4.06 µs for 2.8 µs of weights,
down 4.32 for 2.1): a program asks for a level's weights only once its task of the level
before has signalled, so the level's loads never overlap the level before's poll, work and
signal. Asking for them earlier, while the task of the level before still works, meets the
signal: a release (``MEMBAR.GPU`` then the atomic) waits for the program's loads still in
flight, the next level's included.

This probe runs a chain of LEVELS levels on P programs. At every level each program reads
the whole row of the level before, sums it with a tile of weights of its own (TILE int32
values, a new tile every level, cycling through WRAP levels' tiles so that they come from
DRAM), and writes its 4 values of the next row. Modes:

- ``stream``: no waits at all (each program reads only its own slice): the weights alone.
- ``counter``: the kernel's form. A level's tile is loaded before the program polls the
  level's counter (acquire atomic adds of 0), then the row (``.cg``); the program stores its
  slice, passes a barrier and adds 1 to the next counter with a release atomic.
- ``counter_ahead``: as ``counter``, but the next level's tile is asked for as soon as this
  level's row has arrived, before this level's sum, store and signal (carried in registers).
- ``flags``: every value of a row is one 64-bit word carrying its level in the high half
  (NCCL's LL protocol): a reader loads the row (volatile) until every word carries the level;
  a writer's store is its signal (no barrier, no fence, no counter). Tile loaded before.
- ``flags_ahead``: ``flags``, with the next level's tile asked for once the row is complete.
- ``hint_ahead``: tagged words as ``flags``, plus a relaxed counter per level as a hint: a
  reader polls the counter (relaxed atomic adds of 0), then reads the row and reads it again
  while a word is stale; a writer adds to the counter after a barrier, with no fence. The
  next level's tile is asked for once the row is complete.

Each mode's last row is checked against the host's. Under ``TRITON_INTERPRET=1`` (CPU) the
kernels run with one program (their arithmetic only; no times).

Measured on an H100 (thirty-sixth session, ``--programs 264 --tiles 8192 --levels 300
--repeats 3``: 8.65 MB of tiles a level), µs per level: stream 3.886, counter 3.721,
counter_ahead 4.219, flags 4.536, flags_ahead 4.328, hint_ahead 3.850. Under a weight stream
the events cost nothing a level on top of the stream itself (2.2-2.3 TB/s with one 32 KB tile
in flight per program); asking for the next tile early made the level slower with a release
fence after it, and flags that readers poll slower still (every reader reloads its row).
(Measured with the code of commit 337e2c0, whose events and flags were two kernels; they
were merged into :func:`level_chain` after, the same code per mode, not measured again.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_level_latency import (  # noqa: E402
    DEVICE,
    LINE,
    SLICE,
    store_tagged,
    tagged_row,
    tagged_values,
    timed_launch,
)

MODES = ("stream", "counter", "counter_ahead", "flags", "flags_ahead", "hint_ahead")


@triton.jit
def _tile(w_ptr, lvl, pid, P: tl.constexpr, TILE: tl.constexpr, WRAP: tl.constexpr):
    offs = ((lvl % WRAP) * P + pid).to(tl.int64) * TILE + tl.arange(0, TILE)
    return tl.load(w_ptr + offs, eviction_policy="evict_first")


SIGNALS = {"stream": 0, "counter": 1, "flags": 2, "hint": 3}  # mode prefix: SIGNAL


@triton.jit
def level_chain(rows, evt, w_ptr, LEVELS: tl.constexpr, P: tl.constexpr, WIDTH: tl.constexpr,
                TILE: tl.constexpr, WRAP: tl.constexpr, AHEAD: tl.constexpr,
                SIGNAL: tl.constexpr):
    """``SIGNAL`` 0: no waits (``rows`` int32, each program reads its own slice); 1: events
    (``rows`` int32, release adds, acquire polls); 2: tagged words (``rows`` int64); 3:
    tagged words and a relaxed counter as a hint. ``AHEAD``: the next level's tile is asked
    for once this level's row is in, carried in registers."""
    pid = tl.program_id(0)
    n = P * 4
    cols = tl.arange(0, WIDTH)
    mine = tl.arange(0, 4)
    w_next = _tile(w_ptr, 1, pid, P, TILE, WRAP)
    for lvl in range(1, LEVELS + 1):
        if AHEAD:
            w = w_next
        else:
            w = _tile(w_ptr, lvl, pid, P, TILE, WRAP)
        if SIGNAL == 1:
            while tl.atomic_add(evt + (lvl - 1) * LINE, 0, sem="acquire", scope="gpu") < P:
                pass
        if SIGNAL == 3:
            while tl.atomic_add(evt + (lvl - 1) * LINE, 0, sem="relaxed", scope="gpu") < P:
                pass
        if SIGNAL == 0:
            row = tl.load(rows + (lvl - 1) * n + pid * 4 + mine, cache_modifier=".cg")
        elif SIGNAL == 1:
            row = tl.load(rows + (lvl - 1) * n + cols, mask=cols < n, other=0,
                          cache_modifier=".cg")
        else:
            row = tagged_row(rows + (lvl - 1) * n + cols, cols < n, lvl - 1)
        rsum = tl.sum(row, axis=0)
        if AHEAD:
            w_next = _tile(w_ptr, lvl + 1, pid, P, TILE, WRAP)
        total = rsum + tl.sum(w, axis=0)
        if SIGNAL < 2:
            tl.store(rows + lvl * n + pid * 4 + mine, total + pid * 4 + mine)
        else:
            store_tagged(rows + lvl * n + pid * 4 + mine, total + pid * 4 + mine, lvl)
        if SIGNAL == 1:
            tl.debug_barrier()
            tl.atomic_add(evt + lvl * LINE, 1, sem="release", scope="gpu")
        if SIGNAL == 3:
            tl.debug_barrier()
            tl.atomic_add(evt + lvl * LINE, 1, sem="relaxed", scope="gpu")


def expected_last_row(first: torch.Tensor, wsum: torch.Tensor, levels: int, programs: int,
                      waits: bool) -> torch.Tensor:
    """The host's last row (int64 of the int32 values). ``wsum``: (WRAP, P) wrapped sums of
    the tiles. With waits a value is the sum of the whole row before, its program's tile and
    its position; without, of its own slice of the row before."""
    row = first.to(torch.int64)
    pos = torch.arange(programs * SLICE, dtype=torch.int64)
    wrap = wsum.shape[0]
    for lvl in range(1, levels + 1):
        tile = wsum[lvl % wrap].repeat_interleave(SLICE)
        if waits:
            prev = int(row.sum()) & 0xFFFFFFFF
        else:
            prev = row.view(programs, SLICE).sum(1).repeat_interleave(SLICE) & 0xFFFFFFFF
        row = (prev + tile + pos) & 0xFFFFFFFF
    return torch.where(row >= 2**31, row - 2**32, row)


def tiles(programs: int, tile: int, wrap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(WRAP, P, TILE) int32 weights on the device and their wrapped sums (WRAP, P)."""
    gen = torch.Generator().manual_seed(0)
    weights = torch.randint(-1000, 1000, (wrap, programs, tile), dtype=torch.int32,
                            generator=gen)
    return weights.to(DEVICE), weights.to(torch.int64).sum(-1) & 0xFFFFFFFF


def run(mode: str, levels: int, programs: int, weights: torch.Tensor, wsum: torch.Tensor,
        repeats: int) -> tuple[float, bool]:
    """Microseconds per level (median of ``repeats`` launches) and whether the last row was
    right every time."""
    wrap, _, tile = weights.shape
    n = programs * SLICE
    width = triton.next_power_of_2(n)
    first = torch.arange(n, dtype=torch.int32) * 7 + 3
    ahead = mode.endswith("_ahead")
    want = expected_last_row(first, wsum, levels, programs, waits=mode != "stream")
    times, right = [], True
    for _ in range(repeats + 1):
        evt = torch.zeros((levels + 1, LINE.value), dtype=torch.int32, device=DEVICE)
        evt[0, 0] = programs  # the first row is there
        signal = SIGNALS[mode.removesuffix("_ahead")]
        tagged = signal >= 2
        rows = torch.zeros((levels + 1, n), dtype=torch.int64 if tagged else torch.int32,
                           device=DEVICE)
        rows[0] = (first.to(torch.int64) & 0xFFFFFFFF if tagged else first).to(DEVICE)
        args = (rows, evt, weights, levels, programs, width, tile, wrap, ahead, signal)
        times.append(timed_launch(level_chain, programs, args) / levels)
        if tagged:
            got = tagged_values(rows[levels])
        else:
            got = rows[levels].cpu().to(torch.int64)
        right &= bool(torch.equal(got, want))
    times = sorted(times[1:])  # the first launch compiles
    return times[len(times) // 2], right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=400)
    parser.add_argument("--programs", type=int, default=264 if DEVICE == "cuda" else 1)
    parser.add_argument("--tiles", type=int, nargs="+", default=[4096, 8192],
                        help="int32 weights per program a level (8192: 32 KB, the kernel's)")
    parser.add_argument("--wrap", type=int, default=64,
                        help="levels of distinct tiles before they repeat (keep them over L2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = parser.parse_args()
    print("| mode | programs | tile KB | MB a level | µs per level | GB/s of tiles | "
          "last row right |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tile in args.tiles:
        mb = args.programs * tile * 4 / 1e6
        weights, wsum = tiles(args.programs, tile, args.wrap)
        for mode in args.modes:
            us, right = run(mode, args.levels, args.programs, weights, wsum, args.repeats)
            rate = mb * 1e3 / us if us else 0.0
            print(f"| {mode} | {args.programs} | {tile * 4 // 1024} | {mb:.2f} | {us:.3f} | "
                  f"{rate:.0f} | {right} |", flush=True)


if __name__ == "__main__":
    main()
