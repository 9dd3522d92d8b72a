"""Must be rejected: a float32 tile of 512 x 1024 (2 MB) in one block."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((1024, 1024), dtype=mugraph.float32)
    tb = mugraph.new_threadblock_graph((2,))
    tb.new_input(a, (0, -1, -1), -1)
    return g
