"""Must be rejected: concat of a float16 and a float32 tensor."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 4), dtype=mugraph.float16)
    b = g.new_input((4, 4), dtype=mugraph.float32)
    g.concat(a, b, 0)
    return g
