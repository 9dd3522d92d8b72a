"""Must be rejected: a 1 KB budget of a custom GPU spec, exceeded by an exp."""

import mugraph


def program():
    tiny = mugraph.GPUSpec(name='tiny', shared_memory_per_block=1024, device_memory=1 << 30,
                           multiprocessors=1)
    g = mugraph.new_kernel_graph()
    a = g.new_input((16, 64))
    tb = mugraph.new_threadblock_graph((2,), gpu=tiny)
    t = tb.new_input(a, (0, -1, -1), -1)
    tb.exp(t)
    return g
