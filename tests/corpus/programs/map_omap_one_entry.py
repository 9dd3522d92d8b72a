"""Must be rejected: output_map (-1,)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, (-1, -1, -1), -1)
    tb.new_output(t, (-1,))
    return g
