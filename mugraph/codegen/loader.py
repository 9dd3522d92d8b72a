"""Turning generated source into a callable Triton kernel.

Triton's JIT reads a kernel's source with ``inspect.getsource``, so the text is written to a
``.py`` file in a content-keyed cache directory and imported from there (importlib), never
``exec``'d. ``$MUGRAPH_CACHE_DIR`` overrides the directory (default ``~/.cache/mugraph``).
Whether the kernel runs under the interpreter is decided by ``TRITON_INTERPRET`` when the
module is imported, so the interpreter flag is part of the in-process cache key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

_MODULES: dict[tuple[str, bool], ModuleType] = {}


def interpreter_active() -> bool:
    """Whether Triton kernels defined now run on the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    root = os.environ.get("MUGRAPH_CACHE_DIR") or os.path.join(Path.home(), ".cache", "mugraph")
    path = Path(root) / "triton"
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_digest(source: str) -> str:
    return hashlib.blake2b(source.encode(), digest_size=12).hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def load_kernel(name: str, source: str) -> Any:
    """The ``@triton.jit`` function ``name`` defined by ``source`` (cached per process)."""
    digest = source_digest(source)
    key = (digest, interpreter_active())
    module = _MODULES.get(key)
    if module is None:
        path = cache_dir() / f"{name}_{digest}.py"
        _write_atomically(path, source)
        module_name = f"mugraph_generated_{name}_{digest}_{int(key[1])}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:  # pragma: no cover - importlib contract
            raise ImportError(f"cannot import generated kernel {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        _MODULES[key] = module
    return getattr(module, name)
