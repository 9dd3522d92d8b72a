"""Must be rejected: a 128 x 256 register tile with max_tile_elements=4096."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((128, 256))
    tb = mugraph.new_threadblock_graph((1,))
    tb.new_output(tb.exp(tb.new_input(a, (-1, -1, -1), -1)), (-1, -1, -1))
    g.mark_output(g.customized([a], tb)[0])
    return g
