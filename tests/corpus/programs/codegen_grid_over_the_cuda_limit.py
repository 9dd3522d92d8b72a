"""Must be rejected: 70000 blocks on grid axis y (CUDA allows 65535)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((70000, 2))
    tb = mugraph.new_threadblock_graph((1, 70000, 1))
    tb.new_output(tb.exp(tb.new_input(a, (-1, 0, -1), -1)), (-1, 0, -1))
    g.mark_output(g.customized([a], tb)[0])
    return g
