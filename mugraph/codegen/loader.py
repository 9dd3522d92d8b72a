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
import warnings
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
    """Write ``text`` to ``path`` unless it holds exactly that already. The file is named by
    the digest of its text, so any other content is a damaged file: it is reported and
    replaced. Writes go through a temporary file and os.replace, so concurrent writers of one
    kernel leave one whole file."""
    if path.exists():
        try:
            if path.read_text(encoding="utf-8") == text:
                return
            problem = "its content does not match its name's digest"
        except (OSError, UnicodeDecodeError) as error:
            problem = f"it cannot be read ({error})"
        warnings.warn(f"mugraph: the cached kernel source {path} is damaged ({problem}); "
                      "writing it again", stacklevel=3)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
