"""How much one core's work slows down when N cores do the same at once (issue 16: what the
machine allows a search on N workers, apart from the search).

Three kinds of work, each a fixed amount timed in N processes started together:
- ``python``: a pure-Python loop over tuples and dicts (like the enumeration);
- ``numpy``: modular multiply-adds on int64 arrays of 1 Mi elements (like a verification round);
- ``gemm``: float64 512x512 products on one BLAS thread (like a field product's tiles).

    OPENBLAS_NUM_THREADS=1 python benchmarks/probe_cpu.py [--procs 1 8 16]

Prints, per kind and N, the mean and the slowest process's seconds and the slowdown of the mean
against N=1; the table is printed last. Also ``os.cpu_count()`` and the CPU's model name.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

P = 2147483579


def python_work() -> None:
    table: dict = {}
    for i in range(1_500_000):
        key = (i % 977, i % 13)
        table[key] = table.get(key, 0) + 1


def numpy_work() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.integers(0, P, 1 << 20)
    b = rng.integers(0, P, 1 << 20)
    out = np.empty_like(a)
    for _ in range(60):
        np.multiply(a % 46337, b % 46337, out=out)
        np.add(out, a, out=out)
        np.remainder(out, P, out=out)


def gemm_work() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((512, 512))
    b = rng.random((512, 512))
    for _ in range(40):
        a @ b


KINDS = {"python": python_work, "numpy": numpy_work, "gemm": gemm_work}


def _timed(kind: str, barrier, queue) -> None:
    barrier.wait()
    started = time.perf_counter()
    KINDS[kind]()
    queue.put(time.perf_counter() - started)


def measure(kind: str, procs: int) -> list[float]:
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_timed, args=(kind, barrier, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    times = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    return times


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="*", default=[1, 8, 16])
    args = parser.parse_args()
    print(f"cpu_count {os.cpu_count()}, {cpu_model()}")
    rows = []
    for kind in KINDS:
        base = None
        for n in args.procs:
            times = measure(kind, n)
            mean = sum(times) / len(times)
            base = base or mean
            rows.append((kind, n, mean, max(times), mean / base))
            print(f"{kind} x{n}: mean {mean:.3f} s, slowest {max(times):.3f} s", flush=True)
    print("\n| work | processes | mean s | slowest s | slowdown |\n| --- | --- | --- | --- | --- |")
    for kind, n, mean, slowest, slowdown in rows:
        print(f"| {kind} | {n} | {mean:.3f} | {slowest:.3f} | {slowdown:.2f}x |")


if __name__ == "__main__":
    main()
