"""How long float32 atomic adds take when many programs add a row into the same row (GPU).

    python benchmarks/probe_atomics.py

Each of P = 264 programs (two per H100 SM, as the persistent kernel runs) adds an (1, N)
float32 row into one of C copies of an accumulator row (program p into copy p % C), with
relaxed ``tl.atomic_add``, ``reps`` times; "plain stores" writes every program's row to a row
of its own instead. The time per round, less an empty launch's, is what an output that
accumulates across blocks (a split-K down projection, say) would cost a level when every
task adds its row at once, and how much C copies (which its readers then sum) save.
"""

import torch
import triton
import triton.language as tl

PROGRAMS = 264


@triton.jit
def add_rows(acc, N: tl.constexpr, C: tl.constexpr, REPS: tl.constexpr, ATOMIC: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, N)
    vals = (cols + pid).to(tl.float32) * 1e-3
    for _ in range(REPS):
        if ATOMIC:
            tl.atomic_add(acc + (pid % C) * N + cols, vals, sem="relaxed")
        else:
            tl.store(acc + pid * N + cols, vals)


def bench(programs: int, n: int, copies: int, atomic: bool, reps: int = 1) -> float:
    """Microseconds per launch (``triton.testing.do_bench``)."""
    acc = torch.zeros((max(programs, copies), n), device="cuda", dtype=torch.float32)

    def launch():
        add_rows[(programs,)](acc, n, copies, reps, atomic, num_warps=4)

    launch()
    torch.cuda.synchronize()
    return triton.testing.do_bench(launch, warmup=50, rep=300) * 1e3


def main() -> None:
    empty = bench(PROGRAMS, 1024, 1, False, 0)
    print(f"empty launch {empty:.2f} us")
    for n in (1024, 2048):
        print(f"N={n} plain stores to distinct rows: {bench(PROGRAMS, n, 1, False):.2f} us")
        for copies in (1, 2, 4, 8, 16, PROGRAMS):
            for reps in (1, 4):
                t = bench(PROGRAMS, n, copies, True, reps)
                per_round = (t - empty) / reps
                print(f"N={n} C={copies} reps={reps}: {t:.2f} us ({per_round:.2f} per round)")


if __name__ == "__main__":
    main()
