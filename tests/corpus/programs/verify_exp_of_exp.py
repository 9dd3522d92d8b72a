"""Must be rejected: exp(exp(X @ W)): two exponentials on one path are outside LAX."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((8, 8))
    g.mark_output(g.exp(g.exp(g.matmul(a, b))))
    return g
