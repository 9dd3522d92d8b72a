"""The search checkpoint: an append-only journal of finished work items, crash-safe.

A search with ``checkpoint=PATH`` appends one record per finished work item as it arrives, so a
search stopped in any way (Ctrl-C, SIGKILL, a crash, the machine going down) resumes from
everything recorded before it stopped.

Format (text, one JSON document per line, each followed by a space and its checksum)::

    mugraph-search-journal 1 {"key": ...} <checksum>
    {"unit": ..., "region": [...], ...} <checksum>
    ...

The checksum is BLAKE2b (8 bytes, hex) of the line's JSON text. A line whose checksum does not
match, or that does not parse, is never trusted: a torn last line (the process died while
writing it) is dropped silently; a bad line before the end is reported, and it and what follows
are dropped. Opening rewrites the valid prefix atomically (temporary file, fsync, rename), then
appends. Records are flushed to the operating system at once (a killed process loses nothing)
and fsynced at most once a second and on close (a machine crash loses at most that second).
One search at a time may use a journal: ``PATH.lock`` is locked while it is open.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
from pathlib import Path

from mugraph.errors import MugraphError

MAGIC = "mugraph-search-journal 1"
FSYNC_EVERY_S = 1.0


class CheckpointError(MugraphError):
    """A checkpoint path that cannot be used (someone else's file, in use, unwritable)."""


def _checksum(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def _line(text: str) -> str:
    return f"{text} {_checksum(text)}\n"


def _checked(line: str) -> str:
    """The text of a journal line whose checksum matches, or raise ValueError."""
    text, _, check = line.rstrip("\n").rpartition(" ")
    if not text or _checksum(text) != check:
        raise ValueError("checksum mismatch")
    return text


class Journal:
    """An open checkpoint journal (see the module docstring)."""

    def __init__(self, path: Path, file, records: list[dict]) -> None:
        self.path = path
        self._file = file
        self.records = records
        self._synced = time.monotonic()
        self._lock = None

    @classmethod
    def open(cls, path: str | os.PathLike, key: str) -> Journal:
        """Open (or create) the journal at ``path`` for a search whose checkpoint key is
        ``key``; ``records`` holds what an earlier search with the same key recorded."""
        path = Path(path)
        lock = _lock(path)
        try:
            records = _read(path, key)
        except BaseException:
            lock.close()
            raise
        header = _line(MAGIC + " " + json.dumps({"key": key}, sort_keys=True))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                out.write(header)
                for record in records:
                    out.write(_line(json.dumps(record, separators=(",", ":"))))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
            file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        except OSError as error:
            lock.close()
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise CheckpointError(f"checkpoint {path}: cannot write it ({error})") from None
        journal = cls(path, file, records)
        journal._lock = lock
        return journal

    def append(self, record: dict) -> None:
        self._file.write(_line(json.dumps(record, separators=(",", ":"))))
        self._file.flush()
        now = time.monotonic()
        if now - self._synced > FSYNC_EVERY_S:
            os.fsync(self._file.fileno())
            self._synced = now

    def close(self) -> None:
        if self._file.closed:
            return
        with contextlib.suppress(OSError):
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()
        self._lock.close()


def _lock(path: Path):
    """Hold ``PATH.lock`` (a file never replaced, unlike the journal) for this search."""
    try:
        file = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 - kept open
    except OSError as error:
        raise CheckpointError(f"checkpoint {path}: cannot create its lock ({error})") from None
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return file
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.close()
        raise CheckpointError(
            f"checkpoint {path} is in use by another search (one search per checkpoint)"
        ) from None
    return file


def _read(path: Path, key: str) -> list[dict]:
    """The valid records of the journal at ``path`` for ``key`` (see the module docstring)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {path}: cannot read it ({error})") from None
    if not text:
        return []
    lines = text.splitlines(keepends=True)
    if not lines[0].startswith(MAGIC):
        if _old_format(text):
            warnings.warn(
                f"mugraph: checkpoint {path} is in an older format; starting the search afresh",
                stacklevel=4,
            )
            return []
        raise CheckpointError(
            f"checkpoint {path} is not a mugraph search checkpoint; refusing to overwrite it "
            "(choose another path)"
        )
    try:
        header = json.loads(_checked(lines[0])[len(MAGIC) + 1 :])
    except ValueError:
        warnings.warn(f"mugraph: checkpoint {path} has a damaged header; starting afresh",
                      stacklevel=4)  # fmt: skip
        return []
    if not isinstance(header, dict) or header.get("key") != key:
        warnings.warn(
            f"mugraph: checkpoint {path} belongs to another program or search space; "
            "starting afresh (it will be replaced)",
            stacklevel=4,
        )
        return []
    records = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            record = json.loads(_checked(line))
            if not isinstance(record, dict):
                raise ValueError("not a record")
        except ValueError:
            if number < len(lines):  # (a torn last line is what a crash mid-write leaves)
                warnings.warn(
                    f"mugraph: checkpoint {path}: line {number} is damaged; it and the "
                    f"{len(lines) - number} line(s) after it are ignored",
                    stacklevel=4,
                )
            break
        records.append(record)
    return records


def _old_format(text: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and "key" in data and "done" in data
