"""Operator calls flattened into kernel launches (:mod:`mugraph.integration.flat_calls`).

The compiled programs' fast plans exist on a GPU only, so these tests give ``flatten`` the
log a call would have made — fake plans whose launchers record their arguments — on CPU
tensors (pointers are pointers): the recorded call, replayed on other inputs, must launch with
the pointers the full path would have used, and every guard must send a changed call back to
the full path. ``tests/gpu/test_flat_calls_gpu.py`` runs the real thing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mugraph.integration import flat_calls
from mugraph.integration.flat_calls import CallSite, NotFlat, flatten, recorded


class Launches:
    """Launchers that record (kernel name, arguments)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list]] = []

    def launcher(self, name: str):
        return lambda stream, args: self.seen.append((name, list(args)))


def plan(launches: list, fresh: list[torch.Tensor], open_: bool = True, direct: bool = True):
    """A fast plan as ``flatten`` reads it: (launch, args, fills) with fills
    (position, 0: fresh k / 1: input k)."""
    return SimpleNamespace(
        open=open_,
        fresh_specs=[(tuple(t.shape), tuple(t.stride()), t.dtype) for t in fresh],
        launches=[(launch, args, fills, direct) for launch, args, fills in launches],
    )


class TwoMembers:
    """A chain of two programs on inputs (x, mask): the first reads x[1:] (a view at an
    offset) and a kept weight and writes ``a``; the second reads ``a`` viewed as [2, 4] and
    the mask and writes ``b``. Outputs: a, and b viewed as [8]."""

    def __init__(self) -> None:
        self.weight = torch.randn(8)
        self.kernels = Launches()

    def full(self, inputs: list[torch.Tensor]) -> tuple[list, list]:
        """The full path: what it launches (into self.kernels) and logs, and its outputs."""
        x, mask = inputs
        a, b = torch.empty(8), torch.empty(2, 4)
        first = plan([(self.kernels.launcher("k1"), (None, None, None, 8),
                       ((0, 1, 0), (1, 1, 1), (2, 0, 0)))], [a])
        second = plan([(self.kernels.launcher("k2"), (None, None, None),
                        ((0, 1, 0), (1, 1, 1), (2, 0, 0)))], [b])
        view = x[1:]
        for p, fresh, ins in ((first, [a], [view, self.weight]),
                              (second, [b], [a.view(2, 4), mask])):
            for launch, args, fills, _ in p.launches:
                args = list(args)
                for pos, kind, k in fills:
                    args[pos] = (fresh[k] if kind == 0 else ins[k]).data_ptr()
                launch(0, args)
        log = [("plan", first, [a], [view, self.weight]),
               ("plan", second, [b], [a.view(2, 4), mask])]
        return log, [a, b.view(8)]

    def stable(self, storage: int) -> bool:
        return storage == self.weight.untyped_storage().data_ptr()


def inputs():
    return [torch.randn(9), torch.randn(2, 4)]


def test_replayed_launches_use_the_new_pointers():
    chain = TwoMembers()
    given = inputs()
    log, outs = chain.full(given)
    flat = flatten(log, given, outs, 2, chain.stable, [])
    new = inputs()
    assert flat.matches(new)
    chain.kernels.seen.clear()
    got = flat.run(new)
    (name1, args1), (name2, args2) = chain.kernels.seen
    a, b = got[0], got[1]
    assert (name1, name2) == ("k1", "k2")
    assert args1 == [new[0].data_ptr() + 4, chain.weight.data_ptr(), a.data_ptr(), 8]
    assert args2 == [a.data_ptr(), new[1].data_ptr(), b.untyped_storage().data_ptr()]
    assert a.shape == (8,) and b.shape == (8,) and a.data_ptr() != b.data_ptr()
    assert flat.keep == [chain.weight]


def test_guards_send_changed_calls_to_the_full_path():
    chain = TwoMembers()
    first = inputs()
    log, outs = chain.full(first)
    flat = flatten(log, first, outs, 2, chain.stable, [1])
    assert not flat.matches([torch.randn(10), torch.randn(2, 4)])  # shape
    assert not flat.matches([torch.randn(9).half(), torch.randn(2, 4)])  # dtype
    assert not flat.matches([torch.randn(18)[::2], torch.randn(2, 4)])  # strides
    assert not flat.matches([torch.randn(10)[1:], torch.randn(2, 4)])  # alignment
    first[1].add_(1)  # a weight-like input changed in place
    assert not flat.matches(first)
    torch.ops.mugraph.concat([torch.ones(2)], 10**6)  # the memo prepared something
    assert not flat.matches(inputs())


def test_inputs_sharing_memory_keep_their_distance():
    chain = TwoMembers()
    base = torch.randn(32)
    shared = [base[:9], base[16:24].view(2, 4)]
    log, outs = chain.full(shared)
    flat = flatten(log, shared, outs, 2, chain.stable, [])
    again = torch.randn(32)
    assert flat.matches([again[:9], again[16:24].view(2, 4)])
    assert flat.ties and not flat.matches([again[:9], torch.randn(2, 4)])


@pytest.mark.parametrize("case", ["other path", "jit", "held pointers", "temporary",
                                  "copied output", "count"])
def test_calls_that_cannot_be_flattened(case):
    chain = TwoMembers()
    given = inputs()
    log, outs = chain.full(given)
    programs = 2
    if case == "other path":
        log[1] = ("other",)
    elif case == "jit":
        log[0] = ("plan", plan([(None, (), ())], [], direct=False), [], [])
    elif case == "held pointers":
        log[0][1].open = False
    elif case == "temporary":
        log[1][3][1] = torch.randn(2, 4)  # the mask as a copy made during the call
    elif case == "copied output":
        outs[1] = outs[1].clone()
    else:
        programs = 3
    with pytest.raises(NotFlat):
        flatten(log, given, outs, programs, chain.stable, [])


def test_recorded_returns_the_outputs_and_the_flat_call_or_why_not():
    """``recorded`` runs the call with program calls logged: its outputs and their FlatCall,
    or the NotFlat saying why (here: one program more than the call ran)."""
    from mugraph.runtime import compiled

    chain = TwoMembers()
    given = inputs()

    def call():
        log, outs = chain.full(given)
        compiled._CALL_LOG.extend(log)  # what the programs' fast plans log
        return outs

    outs, flat = recorded(call, given, 2, chain.stable, [])
    assert len(outs) == 2 and len(flat.launches) == 2 and flat.matches(inputs())
    outs, why = recorded(call, given, 3, chain.stable, [])
    assert len(outs) == 2 and isinstance(why, NotFlat)


def test_call_site_records_on_cuda_only_and_can_be_turned_off():
    site = CallSite("chain 0", 2, lambda storage: False, [])
    calls = []

    def full(given):
        calls.append(given)
        return given

    for _ in range(3):
        site.call(inputs(), full, lambda: True)
    assert (site.fast, site.full, site.flat) == (0, 3, None)  # CPU tensors: never recorded
    assert site.note == "not recorded yet"
    flat_calls.enabled = False
    try:
        site.call(inputs(), full, lambda: True)
    finally:
        flat_calls.enabled = True
    assert site.full == 4 and len(calls) == 4
