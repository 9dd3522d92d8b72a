"""What a user would otherwise run (GPU only): torch.compile of the row's PyTorch function,
capped in time, and ``scaled_dot_product_attention`` for attention rows, on every backend.

torch.compile is given static shapes (``dynamic=False``) and a fresh Dynamo cache per row, so
each row compiles once for its own shapes. A compile that runs past its cap is interrupted
(SIGALRM, main thread only) and the row reports the baseline as timed out.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.suite.rows import Row


class CompileTimeout(Exception):
    """torch.compile ran past its cap."""


def _on_alarm(signum, frame):  # pragma: no cover - needs a slow compile
    raise CompileTimeout()


def _caused_by_timeout(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, CompileTimeout):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def compile_baseline(fn: Callable, inputs: list, mode: str | None, timeout: float,
                     warmup: int = 3):
    """(callable, output, seconds spent compiling, note): ``fn`` compiled with ``mode`` and
    warmed up on ``inputs``; callable None and the note saying why when it failed or ran past
    ``timeout`` seconds."""
    torch._dynamo.reset()
    kwargs = {"dynamic": False}
    if mode:
        kwargs["mode"] = mode
    compiled = torch.compile(fn, **kwargs)
    use_alarm = timeout > 0 and hasattr(signal, "setitimer")
    previous = signal.signal(signal.SIGALRM, _on_alarm) if use_alarm else None
    started = time.monotonic()
    out, note = None, ""
    try:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        for _ in range(warmup):
            out = compiled(*inputs)
        if out is not None and out.is_cuda:
            torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - the baseline is reported missing, not fatal
        note = (f"compile timed out after {timeout:.0f} s" if _caused_by_timeout(error)
                else f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    spent = time.monotonic() - started
    if not note and use_alarm and spent >= timeout:
        note = f"compile timed out after {timeout:.0f} s"  # the alarm was swallowed somewhere
    if note:
        torch._dynamo.reset()
        return None, None, spent, note
    return (lambda c=compiled, x=inputs: c(*x)), out, spent, ""


# ---- scaled_dot_product_attention ---------------------------------------------------------------


def _backends():
    """(name, SDPBackend) of the backends this PyTorch knows."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # pragma: no cover - old PyTorch
        return []
    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    return [(n.lower(), getattr(SDPBackend, n)) for n in names if hasattr(SDPBackend, n)]


def _rms_last(x):
    return F.rms_norm(x, (x.shape[-1],), eps=0.0)


def sdpa_forms(row: Row, inputs: list) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    """The row's attention through SDPA (scale 1, as the program), in the layouts SDPA wants:
    K as [.., n, d] (a contiguous copy made here, outside any timing, where the row stores it
    transposed); ``folded``: the program's [h, rows, d] as one batch of h heads; ``gqa``:
    (batch, query heads, tokens, d) against (batch, kv heads, n, d) with ``enable_gqa``. For
    QK-norm rows the norms run in eager PyTorch before SDPA."""
    q, k, v = inputs
    s = row.sizes
    k_nd = k.transpose(-1, -2)
    if not k_nd.is_contiguous():
        k_nd = k_nd.contiguous()
    norm = row.family.name == "qknorm_attention"

    def folded():
        qq, kk = (_rms_last(q), _rms_last(k_nd)) if norm else (q, k_nd)
        return F.scaled_dot_product_attention(qq[None], kk[None], v[None], scale=1.0)[0]

    forms = [("folded", folded)]
    if s.get("group", 1) > 1 and "batch" in s and not norm:
        b, kv, group, tokens, d, n = (s[x] for x in ("batch", "kv_heads", "group", "tokens",
                                                       "d", "n"))
        q4, k4, v4 = q.view(b, kv * group, tokens, d), k_nd.view(b, kv, n, d), v.view(b, kv, n, d)

        def gqa():
            out = F.scaled_dot_product_attention(q4, k4, v4, scale=1.0, enable_gqa=True)
            return out.view(q.shape)

        forms.append(("gqa", gqa))
    return forms


def sdpa_candidates(row: Row, inputs: list) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    """Every (form, backend) pair as a callable labelled ``form/backend``."""
    from torch.nn.attention import sdpa_kernel

    out = []
    for form, fn in sdpa_forms(row, inputs):
        for name, backend in _backends():
            def call(f=fn, b=backend):
                with sdpa_kernel([b]):
                    return f()

            out.append((f"{form}/{name}", call))
    return out
