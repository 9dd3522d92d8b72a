"""Must be rejected: reduction over dim 7 of a 2-d tensor."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.reduction(a, 7)
    return g
