import triton
import triton.language as tl


@triton.jit
def _mg_max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def mg_task0(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(2, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = in0_ptr + tl.load(meta_ptr + 2) * 2048
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    out0_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 2048
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 2
    ahead0 = tl.load(in0_ptr + (pid_x * 1024 + tl.arange(0, 1024)[None, :]) * in0_s1, eviction_policy="evict_first")
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    for blk in range(first, end):
        cur0 = ahead0
        pid_x = (blk + 1) % 2
        ahead0 = tl.load(in0_ptr + (pid_x * 1024 + tl.arange(0, 1024)[None, :]) * in0_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 2
        b0 = cur0
        tl.store(out0_ptr + (pid_x * 1024 + tl.arange(0, 1024)[None, :]) * out0_s1, b0.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task1_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    pid_x = blk % 512
    pf3 = in3_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task1(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(512, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 2048
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    out0_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 2048
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 512
    ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 2048)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 2048)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b4 = (b0f * b0f)
    b5 = tl.expand_dims(tl.sum(b4, axis=1), 1)
    b6 = (b5 * 0.00048828125)
    b2 = early2
    b2f = b2.to(tl.float32)
    b7 = (b6 + b2f)
    b8 = tl.sqrt(b7)
    b9 = (b0f / b8)
    b1 = early1
    b1f = b1.to(tl.float32)
    b10 = (b9 * b1f)
    for blk in range(first, end):
        cur3 = ahead3
        pid_x = (blk + 1) % 512
        ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 512
        if blk + 2 < end:
            mg_task1_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b11 = (b3f * b10)
        b12 = tl.expand_dims(tl.sum(b11, axis=1), 1)
        b13 = tl.reshape(b12, [1, 4])
        tl.store(out0_ptr + (pid_x * 4 + tl.arange(0, 4)[None, :]) * out0_s1, b13.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task2_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    pid_x = blk % 256
    pf3 = in3_ptr + tl.where((tl.arange(0, 2)[:, None] < 2) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 2 + tl.arange(0, 2)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task2(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(256, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 2048
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    out0_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 512
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 256
    ahead3 = tl.load(in3_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 2048)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 2048)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b4 = (b0f * b0f)
    b5 = tl.expand_dims(tl.sum(b4, axis=1), 1)
    b6 = (b5 * 0.00048828125)
    b2 = early2
    b2f = b2.to(tl.float32)
    b7 = (b6 + b2f)
    b8 = tl.sqrt(b7)
    b9 = (b0f / b8)
    b1 = early1
    b1f = b1.to(tl.float32)
    b10 = (b9 * b1f)
    for blk in range(first, end):
        cur3 = ahead3
        pid_x = (blk + 1) % 256
        ahead3 = tl.load(in3_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 256
        if blk + 2 < end:
            mg_task2_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b11 = (b3f * b10)
        b12 = tl.expand_dims(tl.sum(b11, axis=1), 1)
        b13 = tl.reshape(b12, [1, 2])
        tl.store(out0_ptr + (pid_x * 2 + tl.arange(0, 2)[None, :]) * out0_s1, b13.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task3_prefetch(desc, blk, pos, meta_ptr):
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1
    in1_s1 = 512
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 512
    in2_s1 = 1
    pid_x = blk % 8
    pid_y = (blk // 8) % 16
    pf1 = in1_ptr + tl.where((tl.arange(0, 64)[None, :] < 64), pid_x * 64 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * 512, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf1], dtype=tl.int32, is_pure=False, pack=1)
    pf2 = in2_ptr + tl.where((tl.arange(0, 64)[:, None] < 64), (pid_y * 64 + tl.arange(0, 64)[:, None]) * 512 + pid_x * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf2], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task3(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(8, 16, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1
    in1_s1 = 512
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 512
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = in3_ptr + pos * 1024
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = in4_ptr + pos * 64
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 64
    in4_s1 = 1
    in5_ptr = tl.load(desc + 13).to(tl.pointer_type(tl.bfloat16))
    in5_ptr = in5_ptr + pos * 64
    in5_ptr = tl.multiple_of(in5_ptr, 16)
    in5_s0 = 64
    in5_s1 = 1
    in6_ptr = tl.load(desc + 14).to(tl.pointer_type(tl.bfloat16))
    in6_ptr = tl.multiple_of(in6_ptr, 16)
    in6_s0 = 8
    in6_s1 = 1
    in7_ptr = tl.load(desc + 15).to(tl.pointer_type(tl.bfloat16))
    in7_ptr = tl.multiple_of(in7_ptr, 16)
    in7_s0 = 2
    in7_s1 = 1
    in8_ptr = tl.load(desc + 16).to(tl.pointer_type(tl.bfloat16))
    in8_ptr = tl.multiple_of(in8_ptr, 16)
    in8_s0 = 1
    in8_s1 = 1
    out0_ptr = tl.load(desc + 17).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 1024
    out0_s1 = 1
    out1_ptr = tl.load(desc + 18).to(tl.pointer_type(tl.bfloat16))
    out1_ptr = tl.multiple_of(out1_ptr, 16)
    out1_s0 = 16
    out1_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    scratch_blk = scratch_ptr + program * 768
    pid_x = first % 8
    pid_y = (first // 8) % 16
    ahead1 = tl.load(in1_ptr + (pid_x * 64 + tl.arange(0, 64)[:, None]) * in1_s0 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in1_s1, eviction_policy="evict_first")
    ahead3 = tl.load(in3_ptr + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in3_s1)
    ahead2 = tl.load(in2_ptr + (pid_y * 64 + tl.arange(0, 64)[:, None]) * in2_s0 + (pid_x * 64 + tl.arange(0, 64)[None, :]) * in2_s1, eviction_policy="evict_first")
    early4 = tl.load(in4_ptr + (tl.arange(0, 64)[None, :]) * in4_s1)
    early6 = tl.load(in6_ptr + (tl.arange(0, 16)[:, None]) * in6_s0 + (tl.arange(0, 16)[None, :]) * in6_s1, mask=(tl.arange(0, 16)[:, None] < 8) & (tl.arange(0, 16)[None, :] < 8), other=0.0)
    early5 = tl.load(in5_ptr + (tl.arange(0, 64)[None, :]) * in5_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b4 = early4
    b4f = b4.to(tl.float32)
    b6 = early6
    b5 = early5
    b5f = b5.to(tl.float32)
    for blk in range(first, end):
        cur1 = ahead1
        cur3 = ahead3
        cur2 = ahead2
        pid_x = (blk + 1) % 8
        pid_y = ((blk + 1) // 8) % 16
        ahead1 = tl.load(in1_ptr + (pid_x * 64 + tl.arange(0, 64)[:, None]) * in1_s0 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in1_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        ahead3 = tl.load(in3_ptr + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0)
        ahead2 = tl.load(in2_ptr + (pid_y * 64 + tl.arange(0, 64)[:, None]) * in2_s0 + (pid_x * 64 + tl.arange(0, 64)[None, :]) * in2_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 8
        pid_y = (blk // 8) % 16
        tile0 = tl.load(in0_ptr + (pid_x * 256 + tl.arange(0, 256)[None, :]) * in0_s1, cache_modifier=".cg")
        if blk + 2 < end:
            mg_task3_prefetch(desc, blk + 2, pos, meta_ptr)
        b0 = tile0
        b0f = b0.to(tl.float32)
        tl.debug_barrier()
        tl.store(scratch_blk + 0 + tl.arange(0, 256)[None, :], b0f)
        tl.debug_barrier()
        b9 = tl.load(scratch_blk + 0 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], mask=(tl.arange(0, 16)[:, None] < 4), other=0.0)
        b13 = (b9 * b4f)
        tl.debug_barrier()
        tl.store(scratch_blk + 256 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], b9, mask=(tl.arange(0, 16)[:, None] < 4))
        tl.debug_barrier()
        b10 = tl.load(scratch_blk + 256 + (tl.arange(0, 16)[:, None]) * 32 + tl.arange(0, 32)[None, :], mask=(tl.arange(0, 16)[:, None] < 8), other=0.0)
        b10d = b10.to(tl.bfloat16)
        b11 = tl.dot(b6, b10d)
        tl.debug_barrier()
        tl.store(scratch_blk + 512 + (tl.arange(0, 16)[:, None]) * 32 + tl.arange(0, 32)[None, :], b11, mask=(tl.arange(0, 16)[:, None] < 8))
        tl.debug_barrier()
        b12 = tl.load(scratch_blk + 512 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], mask=(tl.arange(0, 16)[:, None] < 4), other=0.0)
        b14 = (b12 * b5f)
        b15 = (b13 + b14)
        b15z = tl.where((tl.arange(0, 16)[:, None] < 4), b15, tl.zeros_like(b15))
        b1 = cur1
        b15zd = b15z.to(tl.bfloat16)
        b16 = tl.dot(b15zd, b1)
        b17 = (b16 * 0.125)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b18 = (b17 + b3f)
        b19 = tl.exp(b18)
        b19z = tl.where((tl.arange(0, 16)[:, None] < 4), b19, tl.zeros_like(b19))
        b2 = cur2
        b19zd = b19z.to(tl.bfloat16)
        b20 = tl.dot(b19zd, b2)
        tl.store(out0_ptr + (pid_x * 4 + tl.arange(0, 16)[:, None]) * out0_s0 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * out0_s1, b20.to(out0_ptr.dtype.element_ty), mask=(tl.arange(0, 16)[:, None] < 4))
        b22 = tl.expand_dims(tl.sum(b19z, axis=1), 1)
        tl.store(out1_ptr + (pid_x * 4 + tl.arange(0, 16)[:, None]) * out1_s0 + (pid_y * 1) * out1_s1, b22.to(out1_ptr.dtype.element_ty), mask=(tl.arange(0, 16)[:, None] < 4))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task4(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(8, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 512
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 512
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = in3_ptr + pos * 64
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 64
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = in4_ptr + pos * 64
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 64
    in4_s1 = 1
    in5_ptr = tl.load(desc + 13).to(tl.pointer_type(tl.bfloat16))
    in5_ptr = tl.multiple_of(in5_ptr, 16)
    in5_s0 = 8
    in5_s1 = 1
    in6_ptr = tl.load(desc + 14).to(tl.pointer_type(tl.bfloat16))
    in6_ptr = tl.multiple_of(in6_ptr, 16)
    in6_s0 = 2
    in6_s1 = 1
    in7_ptr = tl.load(desc + 15).to(tl.pointer_type(tl.bfloat16))
    in7_ptr = tl.multiple_of(in7_ptr, 16)
    in7_s0 = 1
    in7_s1 = 1
    out0_ptr = tl.load(desc + 16).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 64
    out0_s1 = 1
    out1_ptr = tl.load(desc + 17).to(tl.pointer_type(tl.bfloat16))
    out1_ptr = tl.multiple_of(out1_ptr, 16)
    out1_s0 = 1
    out1_s1 = 1
    out2_ptr = tl.load(desc + 18).to(tl.pointer_type(tl.bfloat16))
    out2_ptr = out2_ptr + pos * 512
    out2_ptr = tl.multiple_of(out2_ptr, 16)
    out2_s0 = 512
    out2_s1 = 1
    out3_ptr = tl.load(desc + 19).to(tl.pointer_type(tl.bfloat16))
    out3_ptr = out3_ptr + pos * 512
    out3_ptr = tl.multiple_of(out3_ptr, 16)
    out3_s0 = 512
    out3_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    scratch_blk = scratch_ptr + program * 640
    pid_x = first % 8
    early3 = tl.load(in3_ptr + (tl.arange(0, 64)[None, :]) * in3_s1)
    early5 = tl.load(in5_ptr + (tl.arange(0, 16)[:, None]) * in5_s0 + (tl.arange(0, 16)[None, :]) * in5_s1, mask=(tl.arange(0, 16)[:, None] < 8) & (tl.arange(0, 16)[None, :] < 8), other=0.0)
    early4 = tl.load(in4_ptr + (tl.arange(0, 64)[None, :]) * in4_s1)
    early6 = tl.load(in6_ptr + (tl.arange(0, 16)[:, None]) * in6_s0 + (tl.arange(0, 16)[None, :]) * in6_s1, mask=(tl.arange(0, 16)[:, None] < 2) & (tl.arange(0, 16)[None, :] < 2), other=0.0)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b3 = early3
    b3f = b3.to(tl.float32)
    b5 = early5
    b4 = early4
    b4f = b4.to(tl.float32)
    b6 = early6
    for blk in range(first, end):
        pid_x = blk % 8
        tile0 = tl.load(in0_ptr + (pid_x * 256 + tl.arange(0, 256)[None, :]) * in0_s1, cache_modifier=".cg")
        tile1 = tl.load(in1_ptr + (pid_x * 64 + tl.arange(0, 64)[None, :]) * in1_s1, cache_modifier=".cg")
        tile2 = tl.load(in2_ptr + (pid_x * 64 + tl.arange(0, 64)[None, :]) * in2_s1, cache_modifier=".cg")
        b0 = tile0
        b8 = tl.reshape(b0, [4, 64])
        b8f = b8.to(tl.float32)
        b12 = (b8f * b3f)
        tl.debug_barrier()
        tl.store(scratch_blk + 0 + (tl.arange(0, 4)[:, None]) * 64 + tl.arange(0, 64)[None, :], b8f)
        tl.debug_barrier()
        b9 = tl.load(scratch_blk + 0 + (tl.arange(0, 16)[:, None]) * 32 + tl.arange(0, 32)[None, :], mask=(tl.arange(0, 16)[:, None] < 8), other=0.0)
        b9d = b9.to(tl.bfloat16)
        b10 = tl.dot(b5, b9d)
        tl.debug_barrier()
        tl.store(scratch_blk + 256 + (tl.arange(0, 16)[:, None]) * 32 + tl.arange(0, 32)[None, :], b10, mask=(tl.arange(0, 16)[:, None] < 8))
        tl.debug_barrier()
        b11 = tl.load(scratch_blk + 256 + (tl.arange(0, 4)[:, None]) * 64 + tl.arange(0, 64)[None, :])
        b13 = (b11 * b4f)
        b14 = (b12 + b13)
        b1 = tile1
        b1f = b1.to(tl.float32)
        b18 = (b1f * b3f)
        tl.debug_barrier()
        tl.store(scratch_blk + 512 + tl.arange(0, 64)[None, :], b1f)
        tl.debug_barrier()
        b15 = tl.load(scratch_blk + 512 + (tl.arange(0, 16)[:, None]) * 32 + tl.arange(0, 32)[None, :], mask=(tl.arange(0, 16)[:, None] < 2), other=0.0)
        b15d = b15.to(tl.bfloat16)
        b16 = tl.dot(b6, b15d)
        tl.debug_barrier()
        tl.store(scratch_blk + 576 + (tl.arange(0, 16)[:, None]) * 32 + tl.arange(0, 32)[None, :], b16, mask=(tl.arange(0, 16)[:, None] < 2))
        tl.debug_barrier()
        b17 = tl.load(scratch_blk + 576 + tl.arange(0, 64)[None, :])
        b19 = (b17 * b4f)
        b20 = (b18 + b19)
        b21 = (b14 * b20)
        b22 = tl.expand_dims(tl.sum(b21, axis=1), 1)
        b23 = (b22 * 0.125)
        b24 = tl.exp(b23)
        b2 = tile2
        b2f = b2.to(tl.float32)
        b25 = (b24 * b2f)
        tl.store(out0_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * out0_s0 + (tl.arange(0, 64)[None, :]) * out0_s1, b25.to(out0_ptr.dtype.element_ty))
        tl.store(out1_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * out1_s0, b24.to(out1_ptr.dtype.element_ty))
        tl.store(out2_ptr + (pid_x * 64 + tl.arange(0, 64)[None, :]) * out2_s1, b20.to(out2_ptr.dtype.element_ty))
        tl.store(out3_ptr + (pid_x * 64 + tl.arange(0, 64)[None, :]) * out3_s1, b2.to(out3_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task5(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(8, 1, 1) forloop_range=16
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 1024
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 16
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 64
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1
    in3_s1 = 1
    out0_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 2048
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    for blk in range(first, end):
        pid_x = blk % 8
        tile2 = tl.load(in2_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in2_s0 + (tl.arange(0, 64)[None, :]) * in2_s1, cache_modifier=".cg")
        tile3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0, cache_modifier=".cg")
        acc4 = tl.full([4, 64], 0.0, tl.float32)
        b2 = tile2
        b2f = b2.to(tl.float32)
        acc6 = tl.full([4, 1], 0.0, tl.float32)
        b3 = tile3
        b3f = b3.to(tl.float32)
        for it in tl.static_range(0, 16):
            b0 = tl.load(in0_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in0_s0 + (it * 64 + tl.arange(0, 64)[None, :]) * in0_s1, cache_modifier=".cg")
            b0f = b0.to(tl.float32)
            acc4 += b0f
            b1 = tl.load(in1_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in1_s0 + (it * 1) * in1_s1, cache_modifier=".cg")
            b1f = b1.to(tl.float32)
            acc6 += b1f
        b5 = (acc4 + b2f)
        b7 = (acc6 + b3f)
        b8 = (b5 / b7)
        b9 = tl.reshape(b8, [1, 256])
        tl.store(out0_ptr + (pid_x * 256 + tl.arange(0, 256)[None, :]) * out0_s1, b9.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task6_prefetch(desc, blk, pos, meta_ptr):
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 2048
    in1_s1 = 1
    pid_x = blk % 512
    pf1 = in1_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf1], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task6(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(512, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 2048
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 2048
    in2_s1 = 1
    out0_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 2048
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 512
    ahead1 = tl.load(in1_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in1_s0 + (tl.arange(0, 2048)[None, :]) * in1_s1, eviction_policy="evict_first")
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 2048)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    for blk in range(first, end):
        cur1 = ahead1
        pid_x = (blk + 1) % 512
        ahead1 = tl.load(in1_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in1_s0 + (tl.arange(0, 2048)[None, :]) * in1_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 512
        tile2 = tl.load(in2_ptr + (pid_x * 4 + tl.arange(0, 4)[None, :]) * in2_s1, cache_modifier=".cg")
        if blk + 2 < end:
            mg_task6_prefetch(desc, blk + 2, pos, meta_ptr)
        b1 = cur1
        b1f = b1.to(tl.float32)
        b3 = (b1f * b0f)
        b4 = tl.expand_dims(tl.sum(b3, axis=1), 1)
        b5 = tl.reshape(b4, [1, 4])
        b2 = tile2
        b2f = b2.to(tl.float32)
        b6 = (b5 + b2f)
        tl.store(out0_ptr + (pid_x * 4 + tl.arange(0, 4)[None, :]) * out0_s1, b6.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task7_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 2048
    in4_s1 = 1
    pid_x = blk % 4096
    pf3 = in3_ptr + tl.where((tl.arange(0, 2)[:, None] < 2) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 2 + tl.arange(0, 2)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)
    pf4 = in4_ptr + tl.where((tl.arange(0, 2)[:, None] < 2) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 2 + tl.arange(0, 2)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf4], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task7(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(4096, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 2048
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 2048
    in4_s1 = 1
    out0_ptr = tl.load(desc + 13).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 8192
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 4096
    ahead3 = tl.load(in3_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, eviction_policy="evict_first")
    ahead4 = tl.load(in4_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in4_s0 + (tl.arange(0, 2048)[None, :]) * in4_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 2048)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 2048)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b5 = (b0f * b0f)
    b6 = tl.expand_dims(tl.sum(b5, axis=1), 1)
    b7 = (b6 * 0.00048828125)
    b2 = early2
    b2f = b2.to(tl.float32)
    b8 = (b7 + b2f)
    b9 = tl.sqrt(b8)
    b10 = (b0f / b9)
    b1 = early1
    b1f = b1.to(tl.float32)
    b11 = (b10 * b1f)
    for blk in range(first, end):
        cur3 = ahead3
        cur4 = ahead4
        pid_x = (blk + 1) % 4096
        ahead3 = tl.load(in3_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        ahead4 = tl.load(in4_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in4_s0 + (tl.arange(0, 2048)[None, :]) * in4_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 4096
        if blk + 2 < end:
            mg_task7_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b12 = (b3f * b11)
        b13 = tl.expand_dims(tl.sum(b12, axis=1), 1)
        b14 = tl.reshape(b13, [1, 2])
        b18 = (b14 / (1.0 + tl.exp(-(b14))))
        b4 = cur4
        b4f = b4.to(tl.float32)
        b15 = (b4f * b11)
        b16 = tl.expand_dims(tl.sum(b15, axis=1), 1)
        b17 = tl.reshape(b16, [1, 2])
        b19 = (b18 * b17)
        tl.store(out0_ptr + (pid_x * 2 + tl.arange(0, 2)[None, :]) * out0_s1, b19.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task8_prefetch(desc, blk, pos, meta_ptr):
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 8192
    in1_s1 = 1
    pid_x = blk % 2048
    pf1 = in1_ptr + tl.where((tl.arange(0, 128)[None, :] * 64 < 8192), (pid_x * 1) * 8192 + tl.arange(0, 128)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf1], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task8(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(2048, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 8192
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 8192
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 2048
    in2_s1 = 1
    out0_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 2048
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 2048
    ahead1 = tl.load(in1_ptr + (pid_x * 1) * in1_s0 + (tl.arange(0, 8192)[None, :]) * in1_s1, eviction_policy="evict_first")
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 8192)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    for blk in range(first, end):
        cur1 = ahead1
        pid_x = (blk + 1) % 2048
        ahead1 = tl.load(in1_ptr + (pid_x * 1) * in1_s0 + (tl.arange(0, 8192)[None, :]) * in1_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 2048
        tile2 = tl.load(in2_ptr + (pid_x * 1) * in2_s1 + tl.zeros([1, 1], dtype=tl.int32), cache_modifier=".cg")
        if blk + 2 < end:
            mg_task8_prefetch(desc, blk + 2, pos, meta_ptr)
        b1 = cur1
        b1f = b1.to(tl.float32)
        b3 = (b1f * b0f)
        b4 = tl.expand_dims(tl.sum(b3, axis=1), 1)
        b5 = tl.reshape(b4, [1, 1])
        b2 = tile2
        b2f = b2.to(tl.float32)
        b6 = (b5 + b2f)
        tl.store(out0_ptr + (pid_x * 1) * out0_s1 + tl.zeros([1, 1], dtype=tl.int32), b6.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task9_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    pid_x = blk % 32064
    pf3 = in3_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task9(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(32064, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 2048
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 2048
    in3_s1 = 1
    out0_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 128256
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 32064
    ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 2048)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 2048)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b4 = (b0f * b0f)
    b5 = tl.expand_dims(tl.sum(b4, axis=1), 1)
    b6 = (b5 * 0.00048828125)
    b2 = early2
    b2f = b2.to(tl.float32)
    b7 = (b6 + b2f)
    b8 = tl.sqrt(b7)
    b9 = (b0f / b8)
    b1 = early1
    b1f = b1.to(tl.float32)
    b10 = (b9 * b1f)
    for blk in range(first, end):
        cur3 = ahead3
        pid_x = (blk + 1) % 32064
        ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 2048)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 32064
        if blk + 2 < end:
            mg_task9_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b11 = (b3f * b10)
        b12 = tl.expand_dims(tl.sum(b11, axis=1), 1)
        b13 = tl.reshape(b12, [1, 4])
        tl.store(out0_ptr + (pid_x * 4 + tl.arange(0, 4)[None, :]) * out0_s1, b13.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task10(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(128, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 128256
    in0_s1 = 1
    out0_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 128
    out0_s1 = 1
    cmp0_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.int32))
    cmp0_s0 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    for blk in range(first, end):
        pid_x = blk % 128
        tile0 = tl.load(in0_ptr + (pid_x * 1002 + tl.arange(0, 1024)[None, :]) * in0_s1, mask=(tl.arange(0, 1024)[None, :] < 1002), other=0.0, cache_modifier=".cg")
        b0 = tile0
        b0f = b0.to(tl.float32)
        b1 = tl.expand_dims(tl.reduce(tl.where((tl.arange(0, 1024)[None, :] < 1002), b0f, float('-inf')), 1, _mg_max_nan), 1)
        tl.store(out0_ptr + (pid_x * 1) * out0_s1 + tl.zeros([1, 1], dtype=tl.int32), b1.to(out0_ptr.dtype.element_ty))
        am_i = tl.argmax(tl.where((tl.arange(0, 1024)[None, :] < 1002), b0f, float('-inf')), axis=1)
        tl.store(cmp0_ptr + pid_x + tl.zeros([1], dtype=tl.int32), am_i + pid_x * 1002)
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task11(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(1, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 128
    in0_s1 = 1
    out0_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 1
    out0_s1 = 1
    cmp0_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.int32))
    cmp0_s0 = 1
    cmp1_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.int32))
    cmp1_s0 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 128)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b1 = tl.expand_dims(tl.reduce(b0f, 1, _mg_max_nan), 1)
    for blk in range(first, end):
        tl.store(out0_ptr + tl.zeros([1, 1], dtype=tl.int32), b1.to(out0_ptr.dtype.element_ty))
        am_i = tl.argmax(b0f, axis=1)
        am_tok = tl.load(cmp0_ptr + am_i)
        tl.store(meta_ptr + 2 + tl.zeros([1], dtype=tl.int32), am_tok)
        tl.store(cmp1_ptr + step + tl.zeros([1], dtype=tl.int32), am_tok)
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_persistent(desc_ptr, queue_ptr, qstart_ptr, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr):
    program = tl.program_id(0)
    pos = tl.load(meta_ptr + 0)
    step = tl.load(meta_ptr + 1)
    epoch = step + 1
    q_first = tl.load(qstart_ptr + program)
    q_end = tl.load(qstart_ptr + program + 1)
    for qi in range(q_first, q_end):
        desc = desc_ptr + qi * 20
        kind = tl.load(desc + 0).to(tl.int32)
        if qi + 1 < q_end:
            pnxt = desc + 20
            pkind = tl.load(pnxt + 0).to(tl.int32)
            nfirst = tl.load(pnxt + 1).to(tl.int32)
            nend = nfirst + 1
            if pkind == 1:
                for nblk in range(nfirst, nend):
                    mg_task1_prefetch(pnxt, nblk, pos, meta_ptr)
            if pkind == 2:
                for nblk in range(nfirst, nend):
                    mg_task2_prefetch(pnxt, nblk, pos, meta_ptr)
            if pkind == 3:
                for nblk in range(nfirst, nend):
                    mg_task3_prefetch(pnxt, nblk, pos, meta_ptr)
            if pkind == 6:
                for nblk in range(nfirst, nend):
                    mg_task6_prefetch(pnxt, nblk, pos, meta_ptr)
            if pkind == 7:
                for nblk in range(nfirst, nend):
                    mg_task7_prefetch(pnxt, nblk, pos, meta_ptr)
            if pkind == 8:
                for nblk in range(nfirst, nend):
                    mg_task8_prefetch(pnxt, nblk, pos, meta_ptr)
            if pkind == 9:
                for nblk in range(nfirst, nend):
                    mg_task9_prefetch(pnxt, nblk, pos, meta_ptr)
        if kind == 0:  # %4 embed.copy
            mg_task0(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 1:  # %8 layer0.q_proj.proj, %35 layer1.q_proj.proj, %56 layer2.q_proj.proj, %77 layer3.q_proj.proj, %98 layer4.q_proj.proj, %119 layer5.q_proj.proj, %140 layer6.q_proj.proj, %161 layer7.q_proj.proj, %182 layer8.q_proj.proj, %203 layer9.q_proj.proj, %224 layer10.q_proj.proj, %245 layer11.q_proj.proj, %266 layer12.q_proj.proj, %287 layer13.q_proj.proj, %308 layer14.q_proj.proj, %329 layer15.q_proj.proj
            mg_task1(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 2:  # %10 layer0.k_proj.proj, %12 layer0.v_proj.proj, %37 layer1.k_proj.proj, %39 layer1.v_proj.proj, %58 layer2.k_proj.proj, %60 layer2.v_proj.proj, %79 layer3.k_proj.proj, %81 layer3.v_proj.proj, %100 layer4.k_proj.proj, %102 layer4.v_proj.proj, %121 layer5.k_proj.proj, %123 layer5.v_proj.proj, %142 layer6.k_proj.proj, %144 layer6.v_proj.proj, %163 layer7.k_proj.proj, %165 layer7.v_proj.proj, %184 layer8.k_proj.proj, %186 layer8.v_proj.proj, %205 layer9.k_proj.proj, %207 layer9.v_proj.proj, %226 layer10.k_proj.proj, %228 layer10.v_proj.proj, %247 layer11.k_proj.proj, %249 layer11.v_proj.proj, %268 layer12.k_proj.proj, %270 layer12.v_proj.proj, %289 layer13.k_proj.proj, %291 layer13.v_proj.proj, %310 layer14.k_proj.proj, %312 layer14.v_proj.proj, %331 layer15.k_proj.proj, %333 layer15.v_proj.proj
            mg_task2(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 3:  # %22 layer0.attn.partials, %43 layer1.attn.partials, %64 layer2.attn.partials, %85 layer3.attn.partials, %106 layer4.attn.partials, %127 layer5.attn.partials, %148 layer6.attn.partials, %169 layer7.attn.partials, %190 layer8.attn.partials, %211 layer9.attn.partials, %232 layer10.attn.partials, %253 layer11.attn.partials, %274 layer12.attn.partials, %295 layer13.attn.partials, %316 layer14.attn.partials, %337 layer15.attn.partials
            mg_task3(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 4:  # %23 layer0.attn.new_token, %44 layer1.attn.new_token, %65 layer2.attn.new_token, %86 layer3.attn.new_token, %107 layer4.attn.new_token, %128 layer5.attn.new_token, %149 layer6.attn.new_token, %170 layer7.attn.new_token, %191 layer8.attn.new_token, %212 layer9.attn.new_token, %233 layer10.attn.new_token, %254 layer11.attn.new_token, %275 layer12.attn.new_token, %296 layer13.attn.new_token, %317 layer14.attn.new_token, %338 layer15.attn.new_token
            mg_task4(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 5:  # %24 layer0.attn.combine, %45 layer1.attn.combine, %66 layer2.attn.combine, %87 layer3.attn.combine, %108 layer4.attn.combine, %129 layer5.attn.combine, %150 layer6.attn.combine, %171 layer7.attn.combine, %192 layer8.attn.combine, %213 layer9.attn.combine, %234 layer10.attn.combine, %255 layer11.attn.combine, %276 layer12.attn.combine, %297 layer13.attn.combine, %318 layer14.attn.combine, %339 layer15.attn.combine
            mg_task5(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 6:  # %26 layer0.o_proj.proj, %47 layer1.o_proj.proj, %68 layer2.o_proj.proj, %89 layer3.o_proj.proj, %110 layer4.o_proj.proj, %131 layer5.o_proj.proj, %152 layer6.o_proj.proj, %173 layer7.o_proj.proj, %194 layer8.o_proj.proj, %215 layer9.o_proj.proj, %236 layer10.o_proj.proj, %257 layer11.o_proj.proj, %278 layer12.o_proj.proj, %299 layer13.o_proj.proj, %320 layer14.o_proj.proj, %341 layer15.o_proj.proj
            mg_task6(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 7:  # %31 layer0.mlp.gate_up, %52 layer1.mlp.gate_up, %73 layer2.mlp.gate_up, %94 layer3.mlp.gate_up, %115 layer4.mlp.gate_up, %136 layer5.mlp.gate_up, %157 layer6.mlp.gate_up, %178 layer7.mlp.gate_up, %199 layer8.mlp.gate_up, %220 layer9.mlp.gate_up, %241 layer10.mlp.gate_up, %262 layer11.mlp.gate_up, %283 layer12.mlp.gate_up, %304 layer13.mlp.gate_up, %325 layer14.mlp.gate_up, %346 layer15.mlp.gate_up
            mg_task7(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 8:  # %32 layer0.mlp.down, %53 layer1.mlp.down, %74 layer2.mlp.down, %95 layer3.mlp.down, %116 layer4.mlp.down, %137 layer5.mlp.down, %158 layer6.mlp.down, %179 layer7.mlp.down, %200 layer8.mlp.down, %221 layer9.mlp.down, %242 layer10.mlp.down, %263 layer11.mlp.down, %284 layer12.mlp.down, %305 layer13.mlp.down, %326 layer14.mlp.down, %347 layer15.mlp.down
            mg_task8(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 9:  # %349 lm_head.proj
            mg_task9(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 10:  # %350 argmax.partial
            mg_task10(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 11:  # %351 argmax.final
            mg_task11(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
    tl.debug_barrier()
    done = tl.atomic_add(meta_ptr + 3, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.store(meta_ptr + 3, 0)
        tl.store(meta_ptr + 0, pos + 1)
        tl.store(meta_ptr + 1, step + 1)
