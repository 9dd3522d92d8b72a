import triton
import triton.language as tl


@triton.jit
def _mg_max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def mg_task0(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(1, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = in0_ptr + tl.load(meta_ptr + 2) * 1024
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 1024
    in0_s1 = 1
    out0_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 1024
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    early0 = tl.load(in0_ptr + (tl.arange(0, 1024)[None, :]) * in0_s1, eviction_policy="evict_first")
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = early0
    for blk in range(first, end):
        tl.store(out0_ptr + (tl.arange(0, 1024)[None, :]) * out0_s1, b0.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task1_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    pid_x = blk % 256
    pf3 = in3_ptr + tl.where((tl.arange(0, 8)[:, None] < 8) & (tl.arange(0, 16)[None, :] * 64 < 1024), (pid_x * 8 + tl.arange(0, 8)[:, None]) * 1024 + tl.arange(0, 16)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task1(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(256, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 1024
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1024
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
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
    pid_x = first % 256
    ahead3 = tl.load(in3_ptr + (pid_x * 8 + tl.arange(0, 8)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 1024)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 1024)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b4 = (b0f * b0f)
    b5 = tl.expand_dims(tl.sum(b4, axis=1), 1)
    b6 = (b5 * 0.0009765625)
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
        ahead3 = tl.load(in3_ptr + (pid_x * 8 + tl.arange(0, 8)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 256
        if blk + 2 < end:
            mg_task1_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b11 = (b3f * b10)
        b12 = tl.expand_dims(tl.sum(b11, axis=1), 1)
        b13 = tl.reshape(b12, [1, 8])
        tl.store(out0_ptr + (pid_x * 8 + tl.arange(0, 8)[None, :]) * out0_s1, b13.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task2_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    pid_x = blk % 256
    pf3 = in3_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 16)[None, :] * 64 < 1024), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 1024 + tl.arange(0, 16)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task2(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(256, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 1024
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1024
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    out0_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 1024
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 256
    ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 1024)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 1024)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b4 = (b0f * b0f)
    b5 = tl.expand_dims(tl.sum(b4, axis=1), 1)
    b6 = (b5 * 0.0009765625)
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
        ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 256
        if blk + 2 < end:
            mg_task2_prefetch(desc, blk + 2, pos, meta_ptr)
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
def mg_task3_prefetch(desc, blk, pos, meta_ptr):
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1
    in1_s1 = 1024
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1024
    in2_s1 = 1
    pid_x = blk % 8
    pid_y = (blk // 8) % 16
    pf1 = in1_ptr + tl.where((tl.arange(0, 2)[:, None] * 64 < 128) & (tl.arange(0, 64)[None, :] < 64), pid_x * 128 + tl.arange(0, 2)[:, None] * 64 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * 1024, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf1], dtype=tl.int32, is_pure=False, pack=1)
    pf2 = in2_ptr + tl.where((tl.arange(0, 64)[:, None] < 64) & (tl.arange(0, 2)[None, :] * 64 < 128), (pid_y * 64 + tl.arange(0, 64)[:, None]) * 1024 + pid_x * 128 + tl.arange(0, 2)[None, :] * 64, 0)
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
    in1_s1 = 1024
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1024
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = in3_ptr + pos * 1024
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = in4_ptr + pos * 128
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 128
    in4_s1 = 1
    in5_ptr = tl.load(desc + 13).to(tl.pointer_type(tl.bfloat16))
    in5_ptr = in5_ptr + pos * 128
    in5_ptr = tl.multiple_of(in5_ptr, 16)
    in5_s0 = 128
    in5_s1 = 1
    in6_ptr = tl.load(desc + 14).to(tl.pointer_type(tl.bfloat16))
    in6_ptr = tl.multiple_of(in6_ptr, 16)
    in6_s0 = 4
    in6_s1 = 1
    in7_ptr = tl.load(desc + 15).to(tl.pointer_type(tl.bfloat16))
    in7_ptr = tl.multiple_of(in7_ptr, 16)
    in7_s0 = 2
    in7_s1 = 1
    in8_ptr = tl.load(desc + 16).to(tl.pointer_type(tl.bfloat16))
    in8_ptr = tl.multiple_of(in8_ptr, 16)
    in8_s0 = 1
    in8_s1 = 1
    in9_ptr = tl.load(desc + 17).to(tl.pointer_type(tl.bfloat16))
    in9_ptr = tl.multiple_of(in9_ptr, 16)
    in9_s0 = 128
    in9_s1 = 1
    in10_ptr = tl.load(desc + 18).to(tl.pointer_type(tl.bfloat16))
    in10_ptr = tl.multiple_of(in10_ptr, 16)
    in10_s0 = 128
    in10_s1 = 1
    out0_ptr = tl.load(desc + 19).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 2048
    out0_s1 = 1
    out1_ptr = tl.load(desc + 20).to(tl.pointer_type(tl.bfloat16))
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
    ahead1 = tl.load(in1_ptr + (pid_x * 128 + tl.arange(0, 128)[:, None]) * in1_s0 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in1_s1, eviction_policy="evict_first")
    ahead3 = tl.load(in3_ptr + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in3_s1)
    ahead2 = tl.load(in2_ptr + (pid_y * 64 + tl.arange(0, 64)[:, None]) * in2_s0 + (pid_x * 128 + tl.arange(0, 128)[None, :]) * in2_s1, eviction_policy="evict_first")
    early8 = tl.load(in8_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early9 = tl.load(in9_ptr + (tl.arange(0, 128)[None, :]) * in9_s1)
    early4 = tl.load(in4_ptr + (tl.arange(0, 128)[None, :]) * in4_s1)
    early6 = tl.load(in6_ptr + (tl.arange(0, 16)[:, None]) * in6_s0 + (tl.arange(0, 16)[None, :]) * in6_s1, mask=(tl.arange(0, 16)[:, None] < 4) & (tl.arange(0, 16)[None, :] < 4), other=0.0)
    early5 = tl.load(in5_ptr + (tl.arange(0, 128)[None, :]) * in5_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b8 = early8
    b8f = b8.to(tl.float32)
    b9 = early9
    b9f = b9.to(tl.float32)
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
        ahead1 = tl.load(in1_ptr + (pid_x * 128 + tl.arange(0, 128)[:, None]) * in1_s0 + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in1_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        ahead3 = tl.load(in3_ptr + (pid_y * 64 + tl.arange(0, 64)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0)
        ahead2 = tl.load(in2_ptr + (pid_y * 64 + tl.arange(0, 64)[:, None]) * in2_s0 + (pid_x * 128 + tl.arange(0, 128)[None, :]) * in2_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
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
        b11 = tl.load(scratch_blk + 0 + (tl.arange(0, 16)[:, None]) * 128 + tl.arange(0, 128)[None, :], mask=(tl.arange(0, 16)[:, None] < 2), other=0.0)
        b12 = (b11 * b11)
        b13 = tl.expand_dims(tl.sum(b12, axis=1), 1)
        b14 = (b13 * 0.0078125)
        b15 = (b14 + b8f)
        b16 = tl.sqrt(b15)
        b17 = (b11 / b16)
        b18 = (b17 * b9f)
        b22 = (b18 * b4f)
        tl.debug_barrier()
        tl.store(scratch_blk + 256 + (tl.arange(0, 16)[:, None]) * 128 + tl.arange(0, 128)[None, :], b18, mask=(tl.arange(0, 16)[:, None] < 2))
        tl.debug_barrier()
        b19 = tl.load(scratch_blk + 256 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], mask=(tl.arange(0, 16)[:, None] < 4), other=0.0)
        b19d = b19.to(tl.bfloat16)
        b20 = tl.dot(b6, b19d)
        tl.debug_barrier()
        tl.store(scratch_blk + 512 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], b20, mask=(tl.arange(0, 16)[:, None] < 4))
        tl.debug_barrier()
        b21 = tl.load(scratch_blk + 512 + (tl.arange(0, 16)[:, None]) * 128 + tl.arange(0, 128)[None, :], mask=(tl.arange(0, 16)[:, None] < 2), other=0.0)
        b23 = (b21 * b5f)
        b24 = (b22 + b23)
        b24z = tl.where((tl.arange(0, 16)[:, None] < 2), b24, tl.zeros_like(b24))
        b1 = cur1
        b24zd = b24z.to(tl.bfloat16)
        b25 = tl.dot(b24zd, b1)
        b26 = (b25 * 0.08838834764831843)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b27 = (b26 + b3f)
        b28 = tl.exp(b27)
        b28z = tl.where((tl.arange(0, 16)[:, None] < 2), b28, tl.zeros_like(b28))
        b2 = cur2
        b28zd = b28z.to(tl.bfloat16)
        b29 = tl.dot(b28zd, b2)
        tl.store(out0_ptr + (pid_x * 2 + tl.arange(0, 16)[:, None]) * out0_s0 + (pid_y * 128 + tl.arange(0, 128)[None, :]) * out0_s1, b29.to(out0_ptr.dtype.element_ty), mask=(tl.arange(0, 16)[:, None] < 2))
        b31 = tl.expand_dims(tl.sum(b28z, axis=1), 1)
        tl.store(out1_ptr + (pid_x * 2 + tl.arange(0, 16)[:, None]) * out1_s0 + (pid_y * 1) * out1_s1, b31.to(out1_ptr.dtype.element_ty), mask=(tl.arange(0, 16)[:, None] < 2))
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
    in1_s0 = 1024
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1024
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = in3_ptr + pos * 128
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 128
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = in4_ptr + pos * 128
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 128
    in4_s1 = 1
    in5_ptr = tl.load(desc + 13).to(tl.pointer_type(tl.bfloat16))
    in5_ptr = tl.multiple_of(in5_ptr, 16)
    in5_s0 = 4
    in5_s1 = 1
    in6_ptr = tl.load(desc + 14).to(tl.pointer_type(tl.bfloat16))
    in6_ptr = tl.multiple_of(in6_ptr, 16)
    in6_s0 = 2
    in6_s1 = 1
    in7_ptr = tl.load(desc + 15).to(tl.pointer_type(tl.bfloat16))
    in7_ptr = tl.multiple_of(in7_ptr, 16)
    in7_s0 = 1
    in7_s1 = 1
    in8_ptr = tl.load(desc + 16).to(tl.pointer_type(tl.bfloat16))
    in8_ptr = tl.multiple_of(in8_ptr, 16)
    in8_s0 = 128
    in8_s1 = 1
    in9_ptr = tl.load(desc + 17).to(tl.pointer_type(tl.bfloat16))
    in9_ptr = tl.multiple_of(in9_ptr, 16)
    in9_s0 = 128
    in9_s1 = 1
    out0_ptr = tl.load(desc + 18).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 128
    out0_s1 = 1
    out1_ptr = tl.load(desc + 19).to(tl.pointer_type(tl.bfloat16))
    out1_ptr = tl.multiple_of(out1_ptr, 16)
    out1_s0 = 1
    out1_s1 = 1
    out2_ptr = tl.load(desc + 20).to(tl.pointer_type(tl.bfloat16))
    out2_ptr = out2_ptr + pos * 1024
    out2_ptr = tl.multiple_of(out2_ptr, 16)
    out2_s0 = 1024
    out2_s1 = 1
    out3_ptr = tl.load(desc + 21).to(tl.pointer_type(tl.bfloat16))
    out3_ptr = out3_ptr + pos * 1024
    out3_ptr = tl.multiple_of(out3_ptr, 16)
    out3_s0 = 1024
    out3_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    scratch_blk = scratch_ptr + program * 768
    pid_x = first % 8
    early7 = tl.load(in7_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early8 = tl.load(in8_ptr + (tl.arange(0, 128)[None, :]) * in8_s1)
    early3 = tl.load(in3_ptr + (tl.arange(0, 128)[None, :]) * in3_s1)
    early5 = tl.load(in5_ptr + (tl.arange(0, 16)[:, None]) * in5_s0 + (tl.arange(0, 16)[None, :]) * in5_s1, mask=(tl.arange(0, 16)[:, None] < 4) & (tl.arange(0, 16)[None, :] < 4), other=0.0)
    early4 = tl.load(in4_ptr + (tl.arange(0, 128)[None, :]) * in4_s1)
    early9 = tl.load(in9_ptr + (tl.arange(0, 128)[None, :]) * in9_s1)
    early6 = tl.load(in6_ptr + (tl.arange(0, 16)[:, None]) * in6_s0 + (tl.arange(0, 16)[None, :]) * in6_s1, mask=(tl.arange(0, 16)[:, None] < 2) & (tl.arange(0, 16)[None, :] < 2), other=0.0)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b7 = early7
    b7f = b7.to(tl.float32)
    b8 = early8
    b8f = b8.to(tl.float32)
    b3 = early3
    b3f = b3.to(tl.float32)
    b5 = early5
    b4 = early4
    b4f = b4.to(tl.float32)
    b9 = early9
    b9f = b9.to(tl.float32)
    b6 = early6
    for blk in range(first, end):
        pid_x = blk % 8
        tile0 = tl.load(in0_ptr + (pid_x * 256 + tl.arange(0, 256)[None, :]) * in0_s1, cache_modifier=".cg")
        tile1 = tl.load(in1_ptr + (pid_x * 128 + tl.arange(0, 128)[None, :]) * in1_s1, cache_modifier=".cg")
        tile2 = tl.load(in2_ptr + (pid_x * 128 + tl.arange(0, 128)[None, :]) * in2_s1, cache_modifier=".cg")
        b0 = tile0
        b10 = tl.reshape(b0, [2, 128])
        b10f = b10.to(tl.float32)
        b11 = (b10f * b10f)
        b12 = tl.expand_dims(tl.sum(b11, axis=1), 1)
        b13 = (b12 * 0.0078125)
        b14 = (b13 + b7f)
        b15 = tl.sqrt(b14)
        b16 = (b10f / b15)
        b17 = (b16 * b8f)
        b21 = (b17 * b3f)
        tl.debug_barrier()
        tl.store(scratch_blk + 0 + (tl.arange(0, 2)[:, None]) * 128 + tl.arange(0, 128)[None, :], b17)
        tl.debug_barrier()
        b18 = tl.load(scratch_blk + 0 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], mask=(tl.arange(0, 16)[:, None] < 4), other=0.0)
        b18d = b18.to(tl.bfloat16)
        b19 = tl.dot(b5, b18d)
        tl.debug_barrier()
        tl.store(scratch_blk + 256 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], b19, mask=(tl.arange(0, 16)[:, None] < 4))
        tl.debug_barrier()
        b20 = tl.load(scratch_blk + 256 + (tl.arange(0, 2)[:, None]) * 128 + tl.arange(0, 128)[None, :])
        b22 = (b20 * b4f)
        b23 = (b21 + b22)
        b1 = tile1
        b1f = b1.to(tl.float32)
        b24 = (b1f * b1f)
        b25 = tl.expand_dims(tl.sum(b24, axis=1), 1)
        b26 = (b25 * 0.0078125)
        b27 = (b26 + b7f)
        b28 = tl.sqrt(b27)
        b29 = (b1f / b28)
        b30 = (b29 * b9f)
        b34 = (b30 * b3f)
        tl.debug_barrier()
        tl.store(scratch_blk + 512 + tl.arange(0, 128)[None, :], b30)
        tl.debug_barrier()
        b31 = tl.load(scratch_blk + 512 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], mask=(tl.arange(0, 16)[:, None] < 2), other=0.0)
        b31d = b31.to(tl.bfloat16)
        b32 = tl.dot(b6, b31d)
        tl.debug_barrier()
        tl.store(scratch_blk + 640 + (tl.arange(0, 16)[:, None]) * 64 + tl.arange(0, 64)[None, :], b32, mask=(tl.arange(0, 16)[:, None] < 2))
        tl.debug_barrier()
        b33 = tl.load(scratch_blk + 640 + tl.arange(0, 128)[None, :])
        b35 = (b33 * b4f)
        b36 = (b34 + b35)
        b37 = (b23 * b36)
        b38 = tl.expand_dims(tl.sum(b37, axis=1), 1)
        b39 = (b38 * 0.08838834764831843)
        b40 = tl.exp(b39)
        b2 = tile2
        b2f = b2.to(tl.float32)
        b41 = (b40 * b2f)
        tl.store(out0_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * out0_s0 + (tl.arange(0, 128)[None, :]) * out0_s1, b41.to(out0_ptr.dtype.element_ty))
        tl.store(out1_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * out1_s0, b40.to(out1_ptr.dtype.element_ty))
        tl.store(out2_ptr + (pid_x * 128 + tl.arange(0, 128)[None, :]) * out2_s1, b36.to(out2_ptr.dtype.element_ty))
        tl.store(out3_ptr + (pid_x * 128 + tl.arange(0, 128)[None, :]) * out3_s1, b2.to(out3_ptr.dtype.element_ty))
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
    in0_s0 = 2048
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 16
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 128
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
        tile2 = tl.load(in2_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in2_s0 + (tl.arange(0, 128)[None, :]) * in2_s1, cache_modifier=".cg")
        tile3 = tl.load(in3_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in3_s0, cache_modifier=".cg")
        acc4 = tl.full([2, 128], 0.0, tl.float32)
        b2 = tile2
        b2f = b2.to(tl.float32)
        acc6 = tl.full([2, 1], 0.0, tl.float32)
        b3 = tile3
        b3f = b3.to(tl.float32)
        for it in tl.static_range(0, 16):
            b0 = tl.load(in0_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in0_s0 + (it * 128 + tl.arange(0, 128)[None, :]) * in0_s1, cache_modifier=".cg")
            b0f = b0.to(tl.float32)
            acc4 += b0f
            b1 = tl.load(in1_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in1_s0 + (it * 1) * in1_s1, cache_modifier=".cg")
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
    pid_x = blk % 256
    pf1 = in1_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 32)[None, :] * 64 < 2048), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 2048 + tl.arange(0, 32)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf1], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task6(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
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
    in2_s0 = 1024
    in2_s1 = 1
    out0_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 1024
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 256
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
        pid_x = (blk + 1) % 256
        ahead1 = tl.load(in1_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in1_s0 + (tl.arange(0, 2048)[None, :]) * in1_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 256
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
    in3_s0 = 1024
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 1024
    in4_s1 = 1
    pid_x = blk % 768
    pf3 = in3_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 16)[None, :] * 64 < 1024), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 1024 + tl.arange(0, 16)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)
    pf4 = in4_ptr + tl.where((tl.arange(0, 4)[:, None] < 4) & (tl.arange(0, 16)[None, :] * 64 < 1024), (pid_x * 4 + tl.arange(0, 4)[:, None]) * 1024 + tl.arange(0, 16)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf4], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task7(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(768, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 1024
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1024
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    in4_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    in4_ptr = tl.multiple_of(in4_ptr, 16)
    in4_s0 = 1024
    in4_s1 = 1
    out0_ptr = tl.load(desc + 13).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 3072
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 768
    ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, eviction_policy="evict_first")
    ahead4 = tl.load(in4_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in4_s0 + (tl.arange(0, 1024)[None, :]) * in4_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 1024)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 1024)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b5 = (b0f * b0f)
    b6 = tl.expand_dims(tl.sum(b5, axis=1), 1)
    b7 = (b6 * 0.0009765625)
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
        pid_x = (blk + 1) % 768
        ahead3 = tl.load(in3_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        ahead4 = tl.load(in4_ptr + (pid_x * 4 + tl.arange(0, 4)[:, None]) * in4_s0 + (tl.arange(0, 1024)[None, :]) * in4_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 768
        if blk + 2 < end:
            mg_task7_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b12 = (b3f * b11)
        b13 = tl.expand_dims(tl.sum(b12, axis=1), 1)
        b14 = tl.reshape(b13, [1, 4])
        b18 = (b14 / (1.0 + tl.exp(-(b14))))
        b4 = cur4
        b4f = b4.to(tl.float32)
        b15 = (b4f * b11)
        b16 = tl.expand_dims(tl.sum(b15, axis=1), 1)
        b17 = tl.reshape(b16, [1, 4])
        b19 = (b18 * b17)
        tl.store(out0_ptr + (pid_x * 4 + tl.arange(0, 4)[None, :]) * out0_s1, b19.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task8_prefetch(desc, blk, pos, meta_ptr):
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 3072
    in1_s1 = 1
    pid_x = blk % 512
    pf1 = in1_ptr + tl.where((tl.arange(0, 2)[:, None] < 2) & (tl.arange(0, 64)[None, :] * 64 < 3072), (pid_x * 2 + tl.arange(0, 2)[:, None]) * 3072 + tl.arange(0, 64)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf1], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task8(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(512, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 3072
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 3072
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1024
    in2_s1 = 1
    out0_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 1024
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 512
    ahead1 = tl.load(in1_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in1_s0 + (tl.arange(0, 4096)[None, :]) * in1_s1, mask=(tl.arange(0, 4096)[None, :] < 3072), other=0.0, eviction_policy="evict_first")
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 4096)[None, :]) * in0_s1, mask=(tl.arange(0, 4096)[None, :] < 3072), other=0.0, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    for blk in range(first, end):
        cur1 = ahead1
        pid_x = (blk + 1) % 512
        ahead1 = tl.load(in1_ptr + (pid_x * 2 + tl.arange(0, 2)[:, None]) * in1_s0 + (tl.arange(0, 4096)[None, :]) * in1_s1, mask=(tl.arange(0, 4096)[None, :] < 3072) & (tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 512
        tile2 = tl.load(in2_ptr + (pid_x * 2 + tl.arange(0, 2)[None, :]) * in2_s1, cache_modifier=".cg")
        if blk + 2 < end:
            mg_task8_prefetch(desc, blk + 2, pos, meta_ptr)
        b1 = cur1
        b1f = b1.to(tl.float32)
        b3 = (b1f * b0f)
        b3z = tl.where((tl.arange(0, 4096)[None, :] < 3072), b3, tl.zeros_like(b3))
        b4 = tl.expand_dims(tl.sum(b3z, axis=1), 1)
        b5 = tl.reshape(b4, [1, 2])
        b2 = tile2
        b2f = b2.to(tl.float32)
        b6 = (b5 + b2f)
        tl.store(out0_ptr + (pid_x * 2 + tl.arange(0, 2)[None, :]) * out0_s1, b6.to(out0_ptr.dtype.element_ty))
    tl.debug_barrier()
    if trig_first < trig_end:
        tl.atomic_add(evt_ptr + trig_evt, 1, sem="release", scope="gpu")
    for trig in range(trig_first + 1, trig_end):
        tl.atomic_add(evt_ptr + tl.load(trig_ptr + 3 * trig), 1, sem="release", scope="gpu")


@triton.jit
def mg_task9_prefetch(desc, blk, pos, meta_ptr):
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    pid_x = blk % 18992
    pf3 = in3_ptr + tl.where((tl.arange(0, 8)[:, None] < 8) & (tl.arange(0, 16)[None, :] * 64 < 1024), (pid_x * 8 + tl.arange(0, 8)[:, None]) * 1024 + tl.arange(0, 16)[None, :] * 64, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [pf3], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mg_task9(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, nxt, nkind):
    # grid=(18992, 1, 1) forloop_range=1
    in0_ptr = tl.load(desc + 8).to(tl.pointer_type(tl.bfloat16))
    in0_ptr = tl.multiple_of(in0_ptr, 16)
    in0_s0 = 1024
    in0_s1 = 1
    in1_ptr = tl.load(desc + 9).to(tl.pointer_type(tl.bfloat16))
    in1_ptr = tl.multiple_of(in1_ptr, 16)
    in1_s0 = 1024
    in1_s1 = 1
    in2_ptr = tl.load(desc + 10).to(tl.pointer_type(tl.bfloat16))
    in2_ptr = tl.multiple_of(in2_ptr, 16)
    in2_s0 = 1
    in2_s1 = 1
    in3_ptr = tl.load(desc + 11).to(tl.pointer_type(tl.bfloat16))
    in3_ptr = tl.multiple_of(in3_ptr, 16)
    in3_s0 = 1024
    in3_s1 = 1
    out0_ptr = tl.load(desc + 12).to(tl.pointer_type(tl.bfloat16))
    out0_ptr = tl.multiple_of(out0_ptr, 16)
    out0_s0 = 151936
    out0_s1 = 1
    first = tl.load(desc + 1).to(tl.int32)
    end = first + tl.load(desc + 2).to(tl.int32)
    wait_evt = tl.load(desc + 3).to(tl.int32)
    wait_target = tl.load(desc + 4).to(tl.int32) * epoch
    trig_first = tl.load(desc + 5).to(tl.int32)
    trig_end = trig_first + tl.load(desc + 6).to(tl.int32)
    trig_evt = tl.load(trig_ptr + 3 * trig_first, mask=trig_first < trig_end, other=0)
    pid_x = first % 18992
    ahead3 = tl.load(in3_ptr + (pid_x * 8 + tl.arange(0, 8)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, eviction_policy="evict_first")
    early2 = tl.load(in2_ptr + tl.zeros([1, 1], dtype=tl.int32))
    early1 = tl.load(in1_ptr + (tl.arange(0, 1024)[None, :]) * in1_s1)
    if wait_evt >= 0:
        if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
            spins = tl.full([], 0, tl.int32)
            while ((tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target) & (spins < 4194304):
                spins += 1
            if spins >= 4194304:
                if (tl.atomic_add(evt_ptr + wait_evt, 0, sem="acquire", scope="gpu")) < wait_target:
                    tl.atomic_xchg(meta_ptr + 4, tl.load(desc + 7).to(tl.int32) + 1)
    b0 = tl.load(in0_ptr + (tl.arange(0, 1024)[None, :]) * in0_s1, cache_modifier=".cg")
    b0f = b0.to(tl.float32)
    b4 = (b0f * b0f)
    b5 = tl.expand_dims(tl.sum(b4, axis=1), 1)
    b6 = (b5 * 0.0009765625)
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
        pid_x = (blk + 1) % 18992
        ahead3 = tl.load(in3_ptr + (pid_x * 8 + tl.arange(0, 8)[:, None]) * in3_s0 + (tl.arange(0, 1024)[None, :]) * in3_s1, mask=(tl.full([1, 1], blk + 1, tl.int32) < end), other=0.0, eviction_policy="evict_first")
        pid_x = blk % 18992
        if blk + 2 < end:
            mg_task9_prefetch(desc, blk + 2, pos, meta_ptr)
        b3 = cur3
        b3f = b3.to(tl.float32)
        b11 = (b3f * b10)
        b12 = tl.expand_dims(tl.sum(b11, axis=1), 1)
        b13 = tl.reshape(b12, [1, 8])
        tl.store(out0_ptr + (pid_x * 8 + tl.arange(0, 8)[None, :]) * out0_s1, b13.to(out0_ptr.dtype.element_ty))
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
    in0_s0 = 151936
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
        tile0 = tl.load(in0_ptr + (pid_x * 1187 + tl.arange(0, 2048)[None, :]) * in0_s1, mask=(tl.arange(0, 2048)[None, :] < 1187), other=0.0, cache_modifier=".cg")
        b0 = tile0
        b0f = b0.to(tl.float32)
        b1 = tl.expand_dims(tl.reduce(tl.where((tl.arange(0, 2048)[None, :] < 1187), b0f, float('-inf')), 1, _mg_max_nan), 1)
        tl.store(out0_ptr + (pid_x * 1) * out0_s1 + tl.zeros([1, 1], dtype=tl.int32), b1.to(out0_ptr.dtype.element_ty))
        am_i = tl.argmax(tl.where((tl.arange(0, 2048)[None, :] < 1187), b0f, float('-inf')), axis=1)
        tl.store(cmp0_ptr + pid_x + tl.zeros([1], dtype=tl.int32), am_i + pid_x * 1187)
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
        desc = desc_ptr + qi * 22
        kind = tl.load(desc + 0).to(tl.int32)
        if qi + 1 < q_end:
            pnxt = desc + 22
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
        if kind == 1:  # %8 layer0.q_proj.proj, %37 layer1.q_proj.proj, %60 layer2.q_proj.proj, %83 layer3.q_proj.proj, %106 layer4.q_proj.proj, %129 layer5.q_proj.proj, %152 layer6.q_proj.proj, %175 layer7.q_proj.proj, %198 layer8.q_proj.proj, %221 layer9.q_proj.proj, %244 layer10.q_proj.proj, %267 layer11.q_proj.proj, %290 layer12.q_proj.proj, %313 layer13.q_proj.proj, %336 layer14.q_proj.proj, %359 layer15.q_proj.proj, %382 layer16.q_proj.proj, %405 layer17.q_proj.proj, %428 layer18.q_proj.proj, %451 layer19.q_proj.proj, %474 layer20.q_proj.proj, %497 layer21.q_proj.proj, %520 layer22.q_proj.proj, %543 layer23.q_proj.proj, %566 layer24.q_proj.proj, %589 layer25.q_proj.proj, %612 layer26.q_proj.proj, %635 layer27.q_proj.proj
            mg_task1(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 2:  # %10 layer0.k_proj.proj, %12 layer0.v_proj.proj, %39 layer1.k_proj.proj, %41 layer1.v_proj.proj, %62 layer2.k_proj.proj, %64 layer2.v_proj.proj, %85 layer3.k_proj.proj, %87 layer3.v_proj.proj, %108 layer4.k_proj.proj, %110 layer4.v_proj.proj, %131 layer5.k_proj.proj, %133 layer5.v_proj.proj, %154 layer6.k_proj.proj, %156 layer6.v_proj.proj, %177 layer7.k_proj.proj, %179 layer7.v_proj.proj, %200 layer8.k_proj.proj, %202 layer8.v_proj.proj, %223 layer9.k_proj.proj, %225 layer9.v_proj.proj, %246 layer10.k_proj.proj, %248 layer10.v_proj.proj, %269 layer11.k_proj.proj, %271 layer11.v_proj.proj, %292 layer12.k_proj.proj, %294 layer12.v_proj.proj, %315 layer13.k_proj.proj, %317 layer13.v_proj.proj, %338 layer14.k_proj.proj, %340 layer14.v_proj.proj, %361 layer15.k_proj.proj, %363 layer15.v_proj.proj, %384 layer16.k_proj.proj, %386 layer16.v_proj.proj, %407 layer17.k_proj.proj, %409 layer17.v_proj.proj, %430 layer18.k_proj.proj, %432 layer18.v_proj.proj, %453 layer19.k_proj.proj, %455 layer19.v_proj.proj, %476 layer20.k_proj.proj, %478 layer20.v_proj.proj, %499 layer21.k_proj.proj, %501 layer21.v_proj.proj, %522 layer22.k_proj.proj, %524 layer22.v_proj.proj, %545 layer23.k_proj.proj, %547 layer23.v_proj.proj, %568 layer24.k_proj.proj, %570 layer24.v_proj.proj, %591 layer25.k_proj.proj, %593 layer25.v_proj.proj, %614 layer26.k_proj.proj, %616 layer26.v_proj.proj, %637 layer27.k_proj.proj, %639 layer27.v_proj.proj
            mg_task2(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 3:  # %24 layer0.attn.partials, %47 layer1.attn.partials, %70 layer2.attn.partials, %93 layer3.attn.partials, %116 layer4.attn.partials, %139 layer5.attn.partials, %162 layer6.attn.partials, %185 layer7.attn.partials, %208 layer8.attn.partials, %231 layer9.attn.partials, %254 layer10.attn.partials, %277 layer11.attn.partials, %300 layer12.attn.partials, %323 layer13.attn.partials, %346 layer14.attn.partials, %369 layer15.attn.partials, %392 layer16.attn.partials, %415 layer17.attn.partials, %438 layer18.attn.partials, %461 layer19.attn.partials, %484 layer20.attn.partials, %507 layer21.attn.partials, %530 layer22.attn.partials, %553 layer23.attn.partials, %576 layer24.attn.partials, %599 layer25.attn.partials, %622 layer26.attn.partials, %645 layer27.attn.partials
            mg_task3(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 4:  # %25 layer0.attn.new_token, %48 layer1.attn.new_token, %71 layer2.attn.new_token, %94 layer3.attn.new_token, %117 layer4.attn.new_token, %140 layer5.attn.new_token, %163 layer6.attn.new_token, %186 layer7.attn.new_token, %209 layer8.attn.new_token, %232 layer9.attn.new_token, %255 layer10.attn.new_token, %278 layer11.attn.new_token, %301 layer12.attn.new_token, %324 layer13.attn.new_token, %347 layer14.attn.new_token, %370 layer15.attn.new_token, %393 layer16.attn.new_token, %416 layer17.attn.new_token, %439 layer18.attn.new_token, %462 layer19.attn.new_token, %485 layer20.attn.new_token, %508 layer21.attn.new_token, %531 layer22.attn.new_token, %554 layer23.attn.new_token, %577 layer24.attn.new_token, %600 layer25.attn.new_token, %623 layer26.attn.new_token, %646 layer27.attn.new_token
            mg_task4(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 5:  # %26 layer0.attn.combine, %49 layer1.attn.combine, %72 layer2.attn.combine, %95 layer3.attn.combine, %118 layer4.attn.combine, %141 layer5.attn.combine, %164 layer6.attn.combine, %187 layer7.attn.combine, %210 layer8.attn.combine, %233 layer9.attn.combine, %256 layer10.attn.combine, %279 layer11.attn.combine, %302 layer12.attn.combine, %325 layer13.attn.combine, %348 layer14.attn.combine, %371 layer15.attn.combine, %394 layer16.attn.combine, %417 layer17.attn.combine, %440 layer18.attn.combine, %463 layer19.attn.combine, %486 layer20.attn.combine, %509 layer21.attn.combine, %532 layer22.attn.combine, %555 layer23.attn.combine, %578 layer24.attn.combine, %601 layer25.attn.combine, %624 layer26.attn.combine, %647 layer27.attn.combine
            mg_task5(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 6:  # %28 layer0.o_proj.proj, %51 layer1.o_proj.proj, %74 layer2.o_proj.proj, %97 layer3.o_proj.proj, %120 layer4.o_proj.proj, %143 layer5.o_proj.proj, %166 layer6.o_proj.proj, %189 layer7.o_proj.proj, %212 layer8.o_proj.proj, %235 layer9.o_proj.proj, %258 layer10.o_proj.proj, %281 layer11.o_proj.proj, %304 layer12.o_proj.proj, %327 layer13.o_proj.proj, %350 layer14.o_proj.proj, %373 layer15.o_proj.proj, %396 layer16.o_proj.proj, %419 layer17.o_proj.proj, %442 layer18.o_proj.proj, %465 layer19.o_proj.proj, %488 layer20.o_proj.proj, %511 layer21.o_proj.proj, %534 layer22.o_proj.proj, %557 layer23.o_proj.proj, %580 layer24.o_proj.proj, %603 layer25.o_proj.proj, %626 layer26.o_proj.proj, %649 layer27.o_proj.proj
            mg_task6(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 7:  # %33 layer0.mlp.gate_up, %56 layer1.mlp.gate_up, %79 layer2.mlp.gate_up, %102 layer3.mlp.gate_up, %125 layer4.mlp.gate_up, %148 layer5.mlp.gate_up, %171 layer6.mlp.gate_up, %194 layer7.mlp.gate_up, %217 layer8.mlp.gate_up, %240 layer9.mlp.gate_up, %263 layer10.mlp.gate_up, %286 layer11.mlp.gate_up, %309 layer12.mlp.gate_up, %332 layer13.mlp.gate_up, %355 layer14.mlp.gate_up, %378 layer15.mlp.gate_up, %401 layer16.mlp.gate_up, %424 layer17.mlp.gate_up, %447 layer18.mlp.gate_up, %470 layer19.mlp.gate_up, %493 layer20.mlp.gate_up, %516 layer21.mlp.gate_up, %539 layer22.mlp.gate_up, %562 layer23.mlp.gate_up, %585 layer24.mlp.gate_up, %608 layer25.mlp.gate_up, %631 layer26.mlp.gate_up, %654 layer27.mlp.gate_up
            mg_task7(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 8:  # %34 layer0.mlp.down, %57 layer1.mlp.down, %80 layer2.mlp.down, %103 layer3.mlp.down, %126 layer4.mlp.down, %149 layer5.mlp.down, %172 layer6.mlp.down, %195 layer7.mlp.down, %218 layer8.mlp.down, %241 layer9.mlp.down, %264 layer10.mlp.down, %287 layer11.mlp.down, %310 layer12.mlp.down, %333 layer13.mlp.down, %356 layer14.mlp.down, %379 layer15.mlp.down, %402 layer16.mlp.down, %425 layer17.mlp.down, %448 layer18.mlp.down, %471 layer19.mlp.down, %494 layer20.mlp.down, %517 layer21.mlp.down, %540 layer22.mlp.down, %563 layer23.mlp.down, %586 layer24.mlp.down, %609 layer25.mlp.down, %632 layer26.mlp.down, %655 layer27.mlp.down
            mg_task8(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 9:  # %657 lm_head.proj
            mg_task9(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 10:  # %658 argmax.partial
            mg_task10(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
        if kind == 11:  # %659 argmax.final
            mg_task11(desc, evt_ptr, trig_ptr, meta_ptr, scratch_ptr, trace_ptr, pos, step, epoch, program, desc, -1)
    tl.debug_barrier()
    done = tl.atomic_add(meta_ptr + 3, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.store(meta_ptr + 3, 0)
        tl.store(meta_ptr + 0, pos + 1)
        tl.store(meta_ptr + 1, step + 1)
