"""PyTorch operators the canonicalized graphs call (``torch.ops.mugraph.*``).

* :func:`rms_norm_f32` is RMSNorm as models write it (up-cast to float32, ``x *
  rsqrt(mean(x²) + eps)``, back to the input dtype), one fx node the lowering maps onto
  mugraph's ``rms_norm`` with its epsilon.
* ``mugraph::fold_weights(scale, weights)`` is ``cat([W * scale for W in weights])``: a norm's
  weight folded into the projections that follow it (``(n * s) @ W.T == n @ (W * s).T``),
  with sibling projections of one input stacked into one. ``mugraph::concat(tensors)`` stacks
  their biases. Both are computed once and kept while their inputs are the same tensors at the
  same version and address (an in-place update of a parameter, or new memory given to it with
  ``.data =``, computes them again), and both are custom operators, so Inductor treats them
  as opaque calls instead of recomputing them each step.
"""

from __future__ import annotations

import itertools
import threading

import torch


def rms_norm_f32(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x², last dim) + eps)`` computed in float32, in ``x``'s dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def tensor_version(t: torch.Tensor) -> int:
    """``t``'s version counter (-1 for inference tensors, which have none)."""
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter (and cannot change)
        return -1


class _Memo:
    """The last result per call site key, reused while the inputs are unchanged."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tuple, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.epoch = 0  # results stored so far: a kept result changes only when this moves

    def holds(self, storage: int) -> bool:
        """Whether a kept result lives in the storage at address ``storage``."""
        return any(value.untyped_storage().data_ptr() == storage
                   for _, value in list(self._entries.values()))

    def get(self, key: tuple, tensors: list[torch.Tensor], compute) -> torch.Tensor:
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return compute()  # differentiable: the operators record the graph, nothing kept
        hit = self._entries.get(key)  # (a dict read needs no lock)
        # the address too: ``param.data = other`` keeps the tensor and its version counter
        if hit is not None and len(hit[0]) == len(tensors) and all(
            a is t and v == tensor_version(t) and p == t.data_ptr()
            for (a, v, p), t in zip(hit[0], tensors, strict=True)
        ):
            return hit[1]
        stamp = tuple((t, tensor_version(t), t.data_ptr()) for t in tensors)
        value = compute()
        with self._lock:
            self._entries[key] = (stamp, value)
            self.epoch += 1
        return value


_MEMO = _Memo()


def memo_epoch() -> int:
    """How many results the memo of prepared weights has stored (see :class:`_Memo`)."""
    return _MEMO.epoch


def memo_holds(storage: int) -> bool:
    """Whether a prepared weight the memo keeps lives in the storage at ``storage``."""
    return _MEMO.holds(storage)


_SITES = itertools.count()


def new_site() -> int:
    """A key for one call site of the memoized operators (each keeps its latest result)."""
    return next(_SITES)


def fold_weights(scale: torch.Tensor, weights: list[torch.Tensor], site: int) -> torch.Tensor:
    """cat([W * scale (broadcast over rows) for W in weights], dim=0), memoized per site."""

    def compute() -> torch.Tensor:
        s = scale.float()
        folded = [(w.float() * s).to(w.dtype) for w in weights]
        return torch.cat(folded, 0) if len(folded) > 1 else folded[0]

    return _MEMO.get(("fold", site), [scale, *weights], compute)


def _fold_weights_fake(scale: torch.Tensor, weights: list[torch.Tensor], site: int
                       ) -> torch.Tensor:
    rows = sum(w.shape[0] for w in weights)
    return weights[0].new_empty((rows, *weights[0].shape[1:]))


def concat(tensors: list[torch.Tensor], site: int) -> torch.Tensor:
    """cat(tensors, dim=0), memoized per site (stacked weights or biases)."""
    return _MEMO.get(("cat", site), tensors, lambda: torch.cat(tensors, 0))


def _concat_fake(tensors: list[torch.Tensor], site: int) -> torch.Tensor:
    rows = sum(t.shape[0] for t in tensors)
    return tensors[0].new_empty((rows, *tensors[0].shape[1:]))


# Defined on a torch.library.Library rather than with torch.library.custom_op: these run on
# every step of a compiled model and custom_op's Python wrappers cost about 20 us a call more
# (see mugraph.integration.runtime); under autograd they compute without the memo, so the
# operators inside record the graph.
_LIBRARY = torch.library.Library("mugraph", "FRAGMENT")
_LIBRARY.define("fold_weights(Tensor scale, Tensor[] weights, int site) -> Tensor")
_LIBRARY.define("concat(Tensor[] tensors, int site) -> Tensor")
for _dispatch in ("CPU", "CUDA"):
    _LIBRARY.impl("fold_weights", fold_weights, _dispatch)
    _LIBRARY.impl("concat", concat, _dispatch)
torch.library.register_fake("mugraph::fold_weights")(_fold_weights_fake)
torch.library.register_fake("mugraph::concat")(_concat_fake)


fold_weights_op = torch.ops.mugraph.fold_weights.default
concat_op = torch.ops.mugraph.concat.default

# Operators that prepare weights: they stay in PyTorch (the report says so).
WEIGHT_PREPARATION = frozenset({fold_weights_op, concat_op})
