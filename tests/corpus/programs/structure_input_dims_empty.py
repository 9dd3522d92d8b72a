"""Must be rejected: an input of dims ()."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input(())
    return g
