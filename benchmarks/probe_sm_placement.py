"""Where the GPU places the programs of a persistent launch: which SM runs program p (GPU).

    python benchmarks/probe_sm_placement.py [--programs-per-sm 2] [--repeats 3]

Launches one program per slot (``programs_per_sm`` x SMs, as the persistent kernel does) of a
kernel that records ``%smid``; each program has 2048 / ``programs_per_sm`` threads, so that
exactly ``programs_per_sm`` fit on an SM (the persistent kernel's registers do the same).
Prints, for the two layouts of ``PersistentProgram(program_sets=2, program_set_layout=...)``,
how many SMs each set covers and the most programs of one set on one SM: the layout to use
is the one whose sets each cover every SM once.
"""

from __future__ import annotations

import argparse
import collections

import torch
import triton
import triton.language as tl


@triton.jit
def record_sm(out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    sm = tl.inline_asm_elementwise(
        "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )
    tl.store(out_ptr + pid + tl.zeros([BLOCK], tl.int32), sm, mask=tl.arange(0, BLOCK) == 0)


def layout_sets(num_programs: int, layout: str) -> list[list[int]]:
    if layout == "halves":
        return [list(range(num_programs // 2)), list(range(num_programs // 2, num_programs))]
    return [list(range(0, num_programs, 2)), list(range(1, num_programs, 2))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs-per-sm", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = args.programs_per_sm * sms
    warps = 64 // args.programs_per_sm  # 2048 threads per SM at most
    out = torch.full((n,), -1, dtype=torch.int32, device="cuda")
    for r in range(args.repeats):
        out.fill_(-1)
        record_sm[(n,)](out, BLOCK=32 * warps, num_warps=warps)
        torch.cuda.synchronize()
        sm_of = out.tolist()
        print(f"run {r}: {n} programs on {len(set(sm_of))} SMs; first 12: {sm_of[:12]}; "
              f"programs {sms}..{sms + 5}: {sm_of[sms:sms + 6]}")
        for layout in ("halves", "interleaved"):
            parts = []
            for members in layout_sets(n, layout):
                per_sm = collections.Counter(sm_of[q] for q in members)
                parts.append(f"{len(per_sm)} SMs, at most {max(per_sm.values())} per SM")
            print(f"  {layout}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
