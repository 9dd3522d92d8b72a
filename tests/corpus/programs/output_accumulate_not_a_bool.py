"""Must be rejected: accumulate given as something other than a bool."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((4,))
    t = tb.new_input(a, (-1, -1, -1), -1)
    tb.new_output(t, (-1, -1, -1), accumulate="yes")
    return g
