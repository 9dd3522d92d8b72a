"""Must be rejected: a one-input block graph given two inputs."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((4, 8))
    g.customized([a, b], copy_block(a))
    return g


def copy_block(x):
    tb = mugraph.new_threadblock_graph((1,))
    tb.new_output(tb.new_input(x, (-1, -1, -1), -1), (-1, -1, -1))
    return tb
