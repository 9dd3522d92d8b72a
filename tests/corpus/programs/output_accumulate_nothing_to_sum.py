"""Must be rejected: an accumulating output whose omap maps every grid axis of several blocks
(there are no blocks to sum)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((4,))
    t = tb.new_input(a, (0, -1, -1), -1)
    tb.new_output(t, (0, -1, -1), accumulate=True)
    return g
