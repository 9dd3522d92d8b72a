"""Must be rejected: g.exp(3): a number where a tensor of the graph belongs."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 8))
    g.exp(3)
    return g
