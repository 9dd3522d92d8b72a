"""Must be rejected: rms_norm over a shape that is not the trailing dims."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.rms_norm(a, 4)
    return g
