"""Must be rejected: permute of [4, 6] with perm (1, 0, 2) (not an order of its 2 dims)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.permute(a, (1, 0, 2))
    return g
