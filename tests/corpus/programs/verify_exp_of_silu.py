"""Must be rejected: exp(silu(X)): silu holds an exponential already."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.mark_output(g.exp(g.silu(a)))
    return g
