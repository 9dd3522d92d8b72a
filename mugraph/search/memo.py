"""Continuations of kernel-graph prefixes, kept per worker process and shared by the workers
of one search that run on the same machine.

What can follow a kernel-graph prefix depends only on its tensors (types, index labels,
abstract expressions, uses) and the search space, not on how they were computed
(``Enumerator.kernel_dfs``), so the continuations found for one prefix are replayed for every
later prefix with the same key. Prefixes with equal keys come from most units (a split-KV
first kernel computes the same partial tensors whatever its grid), so workers that each keep
their own memo enumerate the same continuations again: a 16-worker search of gqa_b1 met 3.4x
the states of a 1-worker one (H100 machine, 2026-11-23). A :class:`SharedMemo` also writes
each continuation it computes to a directory of the search, and reads one another worker wrote
before computing it; a worker about to compute a key *claims* it, and another worker that needs
the same key meanwhile waits for it (for at most :data:`CLAIM_WAIT_S`, and never past a
claim its owner dropped), instead of computing it too.

Sharing cannot change the answer: an entry is written only once its enumeration completed
(a time-out or a hand-back inside a continuation raises before ``put``), and replaying an entry
visits exactly the graphs, in exactly the order, that computing it would. Each file holds the
key itself and is used only when the key it holds equals the one asked (a digest collision, a
truncated or foreign file is ignored and the continuation computed).

The same directory holds :class:`SharedArrays`: the products and sums that the workers'
candidates compute from a verification round they all inherited from the zygote.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# how long a worker waits for a continuation another worker claimed before computing it itself
CLAIM_WAIT_S = 30.0
_POLL_S = 0.005


def key_digest(scope: Any, key: Any) -> str:
    """A name for ``(scope, key)`` that is the same in every process: the keys hold tuples,
    strings, ints, tensor types and interned abstract expressions, whose ``repr`` (the
    expression's rendering) does not depend on the process's hash seed."""
    text = repr((scope, key)).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


class LocalMemo:
    """This process's continuations (no sharing): a dict with the memo's interface."""

    def __init__(self, table: dict) -> None:
        self.table = table

    def get(self, key: Any) -> list | None:
        return self.table.get(key)

    def claim(
        self, key: Any, deadline: float | None = None, busy: Callable[[], None] | None = None
    ) -> bool:
        """Whether this worker should compute ``key`` (always, when nothing is shared)."""
        return True

    def put(self, key: Any, value: list) -> None:
        self.table[key] = value

    def release(self, key: Any) -> None:
        """Drop this worker's claim on ``key`` (nothing to drop here)."""

    def counts(self) -> dict[str, int]:
        """What sharing did, as search statistics (nothing here)."""
        return {}


class SharedMemo(LocalMemo):
    """This process's continuations, backed by ``directory`` (one file per key, written
    atomically) that the other workers of the search on this machine read and write."""

    def __init__(self, table: dict, directory: str | os.PathLike, scope: Any) -> None:
        super().__init__(table)
        self.directory = Path(directory)
        self.scope = scope
        self.shared_hits = 0  # continuations read from another worker's file
        self.waits = 0  # times this worker waited for a claimed key
        self.waited_s = 0.0  # seconds spent waiting
        self.io_s = 0.0  # seconds spent reading and writing entries
        self.hand_backs = 0  # times the caller went on with other work instead of waiting
        self.claimed: set[str] = set()  # digests of the keys this worker holds claims on
        self._names: dict[Any, str] = {}  # key -> its digest (computed once per key)

    def _path(self, key: Any, suffix: str) -> Path:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = key_digest(self.scope, key)
        return self.directory / f"{name}{suffix}"

    def counts(self) -> dict[str, int]:
        return {"memo_shared": self.shared_hits, "memo_waits": self.waits,
                "memo_wait_ms": round(self.waited_s * 1e3),
                "memo_io_ms": round(self.io_s * 1e3),
                "memo_hand_backs": self.hand_backs}  # fmt: skip

    def _read(self, key: Any) -> list | None:
        started = time.perf_counter()
        try:
            return self._read_entry(key)
        finally:
            self.io_s += time.perf_counter() - started

    def _read_entry(self, key: Any) -> list | None:
        try:
            data = self._path(key, ".pkl").read_bytes()
            stored, value = pickle.loads(data)
        except FileNotFoundError:
            return None
        except Exception:  # truncated, foreign or unreadable: compute it instead
            return None
        if stored != key:
            return None
        self.table[key] = value
        self.shared_hits += 1
        return value

    def get(self, key: Any) -> list | None:
        known = self.table.get(key)
        return known if known is not None else self._read(key)

    def claim(
        self, key: Any, deadline: float | None = None, busy: Callable[[], None] | None = None
    ) -> bool:
        """Claim ``key`` (True: compute it), or wait while another worker holds the claim and
        return False if its entry appeared meanwhile (then ``get`` has it). Past ``deadline``
        (this process's monotonic clock) it stops waiting: the caller's own time check ends
        the search. Before waiting it calls ``busy``, which may raise to do something else
        (counted in ``hand_backs``). ``waits`` and ``waited_s`` count the waits and their
        seconds."""
        started, waits = time.monotonic(), self.waits
        try:
            return self._claim(key, deadline, busy)
        finally:
            if self.waits != waits:
                self.waited_s += time.monotonic() - started

    def _claim(self, key: Any, deadline: float | None, busy: Callable[[], None] | None) -> bool:
        claim = self._path(key, ".claim")
        waited_since = None
        while True:
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                self.claimed.add(claim.name)
                # the owner may have written its entry and dropped its claim since the
                # caller's ``get`` (or this loop's last look): computing it again would count
                # its states twice
                if self._read(key) is not None:
                    self.release(key)
                    return False
                return True
            except FileExistsError:
                pass
            except OSError:  # the directory is gone (the search ended): compute alone
                return True
            if self._read(key) is not None:
                return False
            now = time.monotonic()
            if waited_since is None:
                if busy is not None:
                    self.hand_backs += 1
                    busy()  # raises when the caller does something else instead
                    self.hand_backs -= 1
                waited_since = now
                self.waits += 1
            elif now - waited_since > CLAIM_WAIT_S or (deadline is not None and now > deadline):
                return True  # a claim held too long (a killed worker): compute it too
            time.sleep(_POLL_S)

    def put(self, key: Any, value: list) -> None:
        started = time.perf_counter()
        try:
            self._write(key, value)
        finally:
            self.io_s += time.perf_counter() - started

    def _write(self, key: Any, value: list) -> None:
        self.table[key] = value
        path = self._path(key, ".pkl")
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            data = pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - not shareable: this worker keeps it to itself
            return
        with contextlib.suppress(OSError):
            temporary.write_bytes(data)
            os.replace(temporary, path)

    def release(self, key: Any) -> None:
        claim = self._path(key, ".claim")
        if claim.name in self.claimed:
            self.claimed.discard(claim.name)
            with contextlib.suppress(OSError):
                claim.unlink()


class SharedArrays:
    """Arrays that the workers of one search on this machine compute from memory they all
    inherited from the zygote: the products and sums of a verification round's memory
    (:class:`~mugraph.semantics.field_arith.KeptProducts`). One file per key in
    ``directory``, written atomically: a header (the key, the array's dtype and shape), then
    the array's bytes, which a reader maps read-only instead of copying (the workers share
    one copy in the page cache).

    The law: a product or a sum is a function of its operands' values, and memory that every
    worker inherited from the zygote, never written after, holds the same values at the same
    address in each of them. So an array one worker computed from such memory, keyed by
    where the operands are, is the array another worker would compute. The caller keys only
    such arrays, with a scope that names the round (a token drawn when the round was made,
    which a process that made its own rounds does not share). A missing, truncated or
    foreign file, or one holding another key, is ignored and the array computed.
    """

    _ALIGN = 64  # the array's bytes start at a multiple of this in the file

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.hits = 0  # arrays read from another worker's file
        self.io_s = 0.0  # seconds spent reading and writing them

    def _path(self, key: Any) -> Path:
        return self.directory / f"{key_digest('kept', key)}.arr"

    def _data_offset(self, header: int) -> int:
        """Where the array's bytes start: after the header's length (8 bytes) and the
        header, aligned."""
        return -(-(8 + header) // self._ALIGN) * self._ALIGN

    def load(self, key: Any) -> np.ndarray | None:
        """The array stored under ``key`` (read-only, mapped from its file), or None."""
        started = time.perf_counter()
        try:
            value = self._map(self._path(key), key)
        finally:
            self.io_s += time.perf_counter() - started
        self.hits += value is not None
        return value

    def _map(self, path: Path, key: Any) -> np.ndarray | None:
        try:
            with open(path, "rb") as file:
                length = int.from_bytes(file.read(8), "little")
                stored, dtype, shape = pickle.loads(file.read(length))
                if stored != key:
                    return None
                offset = self._data_offset(length)
                count = math.prod(shape)
                if os.fstat(file.fileno()).st_size != offset + count * np.dtype(dtype).itemsize:
                    return None  # truncated
                if count == 0:
                    return np.zeros(shape, dtype=dtype)
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except Exception:  # noqa: BLE001 - missing, foreign or unreadable: compute it
            return None
        return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)

    def save(self, key: Any, value: np.ndarray) -> None:
        """Store ``value`` under ``key`` for the other workers (once: an existing file is
        kept; a directory that is gone writes nothing)."""
        started = time.perf_counter()
        try:
            path = self._path(key)
            if not path.exists():
                self._write(path, key, np.ascontiguousarray(value))
        finally:
            self.io_s += time.perf_counter() - started

    def _write(self, path: Path, key: Any, value: np.ndarray) -> None:
        header = pickle.dumps((key, value.dtype.str, value.shape),
                              protocol=pickle.HIGHEST_PROTOCOL)  # fmt: skip
        offset = self._data_offset(len(header))
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            with open(temporary, "wb") as file:
                file.write(len(header).to_bytes(8, "little") + header)
                file.write(b"\0" * (offset - 8 - len(header)))
                file.write(memoryview(value.reshape(-1)).cast("B"))
            os.replace(temporary, path)

    def counts(self) -> dict[str, int]:
        """What sharing did so far, as search statistics."""
        return {"kept_shared": self.hits, "kept_io_ms": round(self.io_s * 1e3)}
