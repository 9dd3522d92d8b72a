"""Must be rejected: an output marked with overlapping strides."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.mark_output(g.exp(a), strides=(2, 1))
    return g
