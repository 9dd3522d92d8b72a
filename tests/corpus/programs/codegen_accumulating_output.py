"""Must be rejected by mugraph.compile: a split-K product whose blocks add their partial
products into one output (an accumulating output), which only the persistent kernel emits."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 64))
    w = g.new_input((64, 16))
    tb = mugraph.new_threadblock_graph((4,))
    tx = tb.new_input(x, (1, -1, -1), -1)
    tw = tb.new_input(w, (0, -1, -1), -1)
    tb.new_output(tb.matmul(tx, tw), (-1, -1, -1), accumulate=True)
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g
