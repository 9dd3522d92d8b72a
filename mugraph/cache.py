"""A persistent cache of search results: the best μGraph found for a program, on disk.

Entries live in a user cache directory (``MUGRAPH_CACHE_DIR`` overrides the default
``~/.cache/mugraph/results``), one JSON file per key. The key covers everything the answer
depends on: the program's structural hash, its inputs (dims, strides, dtypes), the GPU
architecture the result is used on, the mugraph version and a hash of the search space.

Nothing read from disk is trusted blindly:

* a file that does not parse (truncated), whose checksum does not match its content
  (corrupted) or whose key fields differ from the expected key (stale) is ignored with a
  :func:`warnings.warn`;
* a loaded μGraph is re-verified against the program (:func:`mugraph.verify`, a few rounds)
  before it is returned.

Writes are atomic (a temporary file in the same directory, then :func:`os.replace`), so a
reader never sees half an entry and concurrent writers of one key leave one whole entry.

Beside the search results, :class:`MeasurementCache` (the ``measured`` subfolder) keeps the
choices the ``torch.compile`` backend made by timing on a GPU and the capture checks that
passed, keyed by what was measured and where (the GPU's name, the PyTorch, Triton and mugraph
versions): a later process takes them instead of timing again.

The search budget (``time_limit``) and the worker count are not part of the key: a search
that ran to completion gives the same answer under any budget. An entry whose search was cut
short by its budget is only reused by requests with the same or a smaller budget.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import json
import os
import tempfile
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from mugraph.codegen.triton_gen import CODEGEN_REVISION
from mugraph.ir.builder import expect_kernel_graph

ENTRY_FORMAT = 1
_SUFFIX = ".json"
_UNKEYED_FIELDS = ("time_limit", "workers", "extra")
# fields added after searches were stored: keyed only when set, so older keys stay valid
_KEYED_WHEN_SET = {"loop_required": False}
TEMP_FILE_GRACE_SECONDS = 600  # clear() leaves younger temporary files to their writers
MEASURED_FOLDER = "measured"  # the measured choices' subfolder of a result cache
MEASURED_FORMAT = 1


class CacheEntryError(Exception):
    """An entry on disk that must not be used (the message says why)."""


def default_cache_dir() -> Path:
    """``$MUGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/mugraph/results`` (``~/.cache/...``)."""
    override = os.environ.get("MUGRAPH_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "mugraph" / "results"


def current_arch(device: Any = None) -> str:
    """The architecture a result is used on: ``"sm_90"`` for a CUDA device, else ``"cpu"``.

    ``device`` is a torch device (or its name); None means the current CUDA device when one
    is available, else the CPU.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cpu"
    if device is not None and torch.device(device).type != "cuda":
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _version() -> str:
    import mugraph

    return mugraph.__version__


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def text_digest(text: str, size: int = 16) -> str:
    """A short stable hash of ``text`` (hex)."""
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


# ---- the search config: which of its fields make the key -------------------------------------


def resolve_config(program, config=None):
    """The SearchConfig a search of ``program`` would use.

    ``config`` is None (the defaults), a preset name, a SearchConfig, or a dict of overrides
    (which may name a ``"preset"``).
    """
    from mugraph.search.config import SearchConfig, default_config

    if isinstance(config, SearchConfig):
        return config
    if config is None or isinstance(config, str):
        return default_config(program, config)
    if isinstance(config, dict):
        options = dict(config)
        return default_config(program, options.pop("preset", None), **options)
    raise TypeError(f"config must be None, a preset name, a SearchConfig or a dict, got {config!r}")


def _encode_field(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (frozenset, set)):
        return sorted(str(_encode_field(v)) for v in value)
    if isinstance(value, (tuple, list)):
        return [_encode_field(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def config_hash(config) -> str:
    """A stable hash of the search space of a SearchConfig (not its budget or workers)."""
    data = {
        f.name: _encode_field(getattr(config, f.name))
        for f in fields(config)
        if f.name not in _UNKEYED_FIELDS
        and not (f.name in _KEYED_WHEN_SET and getattr(config, f.name) == _KEYED_WHEN_SET[f.name])
    }
    return text_digest(_canonical(data))


# ---- keys ------------------------------------------------------------------------------------


def input_signature(program) -> list:
    """The program's inputs as data: [dims, strides or None, dtype] each."""
    return [
        [list(t.dims), list(t.strides) if t.strides is not None else None, t.dtype.value]
        for t in program.input_types
    ]


def make_key(program, config=None, arch: str | None = None) -> dict:
    """The key fields of ``program`` searched under ``config`` and used on ``arch``."""
    cfg = resolve_config(program, config)
    return {
        "program": program.structural_hash(),
        "inputs": input_signature(program),
        "arch": arch or current_arch(),
        "version": _version(),
        "config": config_hash(cfg),
    }


def key_hash(key: dict) -> str:
    return text_digest(_canonical(key))


def _checksum(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


# ---- summaries stored with an entry ----------------------------------------------------------


def verification_summary(verification) -> dict | None:
    """The fields of a VerificationResult worth keeping (None when there is none)."""
    if verification is None:
        return None
    return {
        "passed": bool(verification.passed),
        "rounds": verification.rounds,
        "bound": verification.bound,
        "delta": verification.delta,
        "guarantee": verification.guarantee,
        "text": str(verification),
    }


def search_summary(result) -> dict:
    """Statistics of a SearchResult (empty for None)."""
    if result is None:
        return {}
    stats = result.stats
    return {
        "states": stats.states,
        "block_graphs": stats.block_graphs,
        "candidates": stats.candidates,
        "verified": len(result.candidates),
        "pruned": dict(stats.pruned),
        "elapsed": round(result.elapsed, 3),
        "units_done": result.units_done,
        "units_total": result.units_total,
        "timed_out": bool(result.timed_out),
        "time_limit": result.config.time_limit,
    }


def ranking_summary(ranking) -> dict | None:
    """How the stored μGraph was chosen (a RankingResult's ``to_dict()``: method, the chosen
    candidate and its launch settings, every candidate's estimate and measured times)."""
    return ranking.to_dict() if ranking is not None else None


# ---- the cache -------------------------------------------------------------------------------


class ResultCache:
    """Search results on disk, keyed by program, inputs, architecture, version and config.

    ``get(program, config)`` returns the cached best μGraph (re-verified), the program itself
    when the cached search found nothing better, or None on a miss. ``put(program, config,
    best, result)`` stores a search's answer. Each returned graph carries the entry's metadata
    as ``.cache_entry``.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, verify_rounds: int = 2) -> None:
        self.path = Path(path).expanduser() if path is not None else default_cache_dir()
        self.verify_rounds = verify_rounds
        self._verified: set[tuple] = set()  # entries this object re-verified already

    def __repr__(self) -> str:
        return f"ResultCache({str(self.path)!r})"

    @property
    def measurements(self) -> MeasurementCache:
        """The choices measured on GPUs, kept beside the search results (a subfolder)."""
        return MeasurementCache(self.path / MEASURED_FOLDER)

    # ---- lookup ------------------------------------------------------------------------------

    def entry_path(self, key: dict) -> Path:
        return self.path / f"{key_hash(key)}{_SUFFIX}"

    def get(self, program, config=None, *, arch: str | None = None):
        """The cached answer for ``program`` under ``config`` on ``arch``, or None."""
        expect_kernel_graph(program, "ResultCache.get (the program)")
        cfg = resolve_config(program, config)
        key = make_key(program, cfg, arch)
        path = self.entry_path(key)
        if not path.exists():
            return None
        try:
            entry = self._read(path, key)
            if _budget_too_small(entry, cfg):
                return None
            graph = self._graph_of(entry, program, path)
        except CacheEntryError as error:
            warnings.warn(
                f"mugraph cache: ignoring the entry {path}: {error}; it is treated as a miss "
                "(a new search result replaces it)",
                stacklevel=2,
            )
            return None
        graph.cache_entry = _metadata(entry, path)
        return graph

    def _read(self, path: Path, key: dict) -> dict:
        """Parse and check one entry file; raise CacheEntryError when it is not usable."""
        entry = _load_entry(path)
        if entry.get("key") != key:
            raise CacheEntryError(
                f"stale or foreign entry: its key {entry.get('key')} is not the key it is "
                f"stored under, {key}"
            )
        return entry

    def _graph_of(self, entry: dict, program, path: Path):
        """The entry's μGraph, re-verified against ``program`` (the program when unimproved)."""
        if not entry.get("improved"):
            return program
        from mugraph.ir.serialize import from_json
        from mugraph.search.verify import verify

        try:
            best = from_json(entry["best"])
            memo = (str(path), entry["checksum"], program.structural_hash())
            if memo in self._verified:
                return best
            check = verify(best, program, max_rounds=self.verify_rounds)
        except Exception as error:  # noqa: BLE001 - whatever fails, the entry is not trusted
            reason = f"{type(error).__name__}: {error}"
            raise CacheEntryError(f"the stored μGraph does not load or verify ({reason})") from None
        if not check.passed:
            raise CacheEntryError(f"the stored μGraph fails re-verification ({check})")
        best.verification = check
        self._verified.add(memo)
        return best

    # ---- storing -----------------------------------------------------------------------------

    def put(self, program, config=None, best=None, result=None, *, arch: str | None = None):
        """Store the answer of a search of ``program``; returns the entry's path.

        ``best`` is the μGraph found (None, or the program itself, when nothing better was
        found); ``result`` the SearchResult (statistics; an interrupted search is not stored).
        A search cut short by its budget does not replace a valid entry of a longer or a
        complete search (the same subprogram searched again with a smaller share of a
        budget, e.g. the attention part of a larger program): None is returned then — unless
        that entry was ranked on the GPU with kernels of an older code generator
        (``CODEGEN_REVISION``).
        """
        expect_kernel_graph(program, "ResultCache.put (the program)")
        if best is not None:
            expect_kernel_graph(best, "ResultCache.put (the best μGraph)")
        if result is not None and getattr(result, "interrupted", False):
            return None
        cfg = resolve_config(program, config)
        key = make_key(program, cfg, arch)
        improved = best is not None and best is not program and best != program
        search = search_summary(result)
        search.setdefault("time_limit", cfg.time_limit)
        if self._better_entry_kept(key, search):
            return None
        entry = {
            "format": ENTRY_FORMAT,
            "key": key,
            "program_hash": key["program"],
            "created": time.time(),
            "improved": improved,
            "best": best.to_json() if improved else None,
            "verification": verification_summary(getattr(best, "verification", None))
            if improved else None,
            "search": search,
            "ranking": ranking_summary(getattr(best, "ranking", None)),
            "codegen": CODEGEN_REVISION,
        }
        entry["checksum"] = _checksum(entry)
        path = self.entry_path(key)
        _atomic_write(path, json.dumps(entry, indent=1))
        return path

    def _better_entry_kept(self, key: dict, search: dict) -> bool:
        """Whether the entry stored under ``key`` came from a search that the new one (cut
        short by its budget) does not improve on: complete, or given a larger budget."""
        if not search.get("timed_out"):
            return False
        path = self.entry_path(key)
        if not path.exists():
            return False
        try:
            entry = self._read(path, key)
        except CacheEntryError:
            return False
        if entry.get("codegen") != CODEGEN_REVISION:
            return False  # ranked with kernels that are no longer emitted
        old = entry.get("search") or {}
        old_limit, new_limit = old.get("time_limit"), search.get("time_limit")
        if not old.get("timed_out"):
            return True
        return old_limit is not None and new_limit is not None and old_limit > new_limit

    # ---- housekeeping ------------------------------------------------------------------------

    def _check_folder(self) -> bool:
        """Whether the cache folder exists; raises NotADirectoryError when its path is
        something else (a regular file)."""
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(
                errno.ENOTDIR, "the result cache path is not a folder", str(self.path)
            )
        return self.path.is_dir()

    def entries(self) -> list[dict]:
        """One dict per entry file: key, path, size, created, program hash, validity."""
        if not self._check_folder():
            return []
        out = []
        for path in self._entry_files():
            info = _describe(path)
            if info is not None:  # None: removed meanwhile (another process's clear)
                out.append(info)
        return out

    def _entry_files(self) -> list[Path]:
        return _entry_files(self.path)

    def clear(self) -> int:
        """Remove every entry, the measured choices included (and temporary files left by
        writers that died; a younger one belongs to a write in progress); return how many
        entries went."""
        if not self._check_folder():
            return 0
        return _clear_folder(self.path, self._entry_files()) + self.measurements.clear()


def _entry_files(folder: Path) -> list[Path]:
    """The entry files of ``folder`` (temporary files of writers left out)."""
    return sorted(p for p in folder.glob(f"*{_SUFFIX}") if not p.name.startswith("."))


def _clear_folder(folder: Path, files: list[Path]) -> int:
    """Remove ``files`` and the stale temporary files of ``folder``; how many files went."""
    removed = 0
    for path in files:
        path.unlink(missing_ok=True)
        removed += 1
    stale = time.time() - TEMP_FILE_GRACE_SECONDS
    for path in folder.glob(".tmp-*"):
        try:
            if path.stat().st_mtime < stale:  # younger ones: a write in progress
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
    return removed


# field -> (types it may have, what it is): the schema of an entry of ENTRY_FORMAT
_SCHEMA: dict[str, tuple[tuple[type, ...], str]] = {
    "format": ((int,), "the entry format"),
    "key": ((dict,), "an object"),
    "program_hash": ((str,), "a string"),
    "created": ((int, float), "a number"),
    "improved": ((bool,), "true or false"),
    "best": ((str, type(None)), "a μGraph document (a string) or null"),
    "verification": ((dict, type(None)), "an object or null"),
    "search": ((dict,), "an object"),
    "checksum": ((str,), "a string"),
}
_SEARCH_SCHEMA: dict[str, tuple[tuple[type, ...], str]] = {
    "timed_out": ((bool,), "true or false"),
    "time_limit": ((int, float, type(None)), "a number or null"),
}


def _load_entry(path: Path) -> dict:
    """The entry in ``path``, checked for being whole (parses), ours (format), intact
    (checksum) and well-formed (schema); raises CacheEntryError saying which check failed."""
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CacheEntryError(f"unreadable or truncated ({error})") from None
    if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT:
        raise CacheEntryError(
            f"foreign file: not a mugraph cache entry of format {ENTRY_FORMAT}"
        )
    if entry.get("checksum") != _checksum(entry):
        raise CacheEntryError("checksum mismatch (the file is corrupted)")
    _check_schema(entry, _SCHEMA, "")
    _check_schema(entry["search"], _SEARCH_SCHEMA, "search.", required=False)
    if entry["improved"] != (entry["best"] is not None):
        raise CacheEntryError("schema: 'improved' and 'best' disagree")
    if entry["program_hash"] != entry["key"].get("program"):
        raise CacheEntryError("schema: 'program_hash' is not the key's program hash")
    return entry


def _check_schema(data: dict, schema: dict, prefix: str, required: bool = True) -> None:
    for name, (types, what) in schema.items():
        if name not in data:
            if required:
                raise CacheEntryError(f"schema: the field '{prefix}{name}' is missing")
            continue
        value = data[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise CacheEntryError(
                f"schema: the field '{prefix}{name}' must be {what}, got {value!r:.60}"
            )


def _budget_too_small(entry: dict, config) -> bool:
    """The stored search was cut short by a budget smaller than the one asked for now."""
    search = entry.get("search") or {}
    stored = search.get("time_limit")
    return bool(search.get("timed_out")) and stored is not None and config.time_limit > stored


def _metadata(entry: dict, path: Path) -> dict:
    return {
        "path": str(path),
        "key": entry["key"],
        "created": entry.get("created"),
        "improved": entry.get("improved"),
        "verification": entry.get("verification"),
        "search": entry.get("search"),
        "ranking": entry.get("ranking"),
    }


def _describe(path: Path) -> dict | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    info: dict[str, Any] = {
        "key": path.stem,
        "path": str(path),
        "size": size,
        "created": None,
        "program": None,
        "valid": False,
    }
    try:
        entry = _load_entry(path)
    except CacheEntryError as error:
        info["problem"] = str(error)
        return info
    key = entry["key"]
    if path.stem != key_hash(key):
        info["problem"] = "foreign entry: stored under the name of another key"
        return info
    info.update(
        created=entry.get("created"),
        program=entry.get("program_hash"),
        valid=True,
        improved=entry.get("improved"),
        arch=key.get("arch"),
        version=key.get("version"),
        inputs=key.get("inputs"),
    )
    return info


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- choices measured on a GPU ---------------------------------------------------------------


def measuring_environment() -> dict:
    """What a time measured on this machine depends on beyond the code measured: the GPU
    (its name), PyTorch, Triton, mugraph and its code generator's revision."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton comes with the GPU build of torch
        triton_version = None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"device": device, "arch": current_arch(), "torch": torch.__version__,
            "triton": triton_version, "version": _version(), "codegen": CODEGEN_REVISION}


class MeasurementCache:
    """Choices made by timing on a GPU, on disk, so that a later process makes them without
    timing again: which tiling of a program ran fastest there (and its launch setting),
    which of two answers, whether a partition runs faster on mugraph or on PyTorch.

    An entry is keyed by its ``kind``, by ``what`` was measured (hashes of the programs and
    layouts; the caller's dict) and by :func:`measuring_environment`: another GPU, another
    PyTorch, Triton or mugraph, or another code generator measures afresh. It holds the
    choice and the times behind it, never a kernel: what a choice names is verified and
    checked again by its reader before it runs. Entries are written atomically and checked
    like the result cache's (whole, ours, intact, under their own key); one that fails is
    ignored with a warning, and the choice is measured again and stored over it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()

    def __repr__(self) -> str:
        return f"MeasurementCache({str(self.path)!r})"

    def _key(self, kind: str, what: dict) -> dict:
        return {"kind": kind, "what": what, "where": measuring_environment()}

    def get(self, kind: str, what: dict) -> dict | None:
        """The value stored for ``what`` of ``kind`` measured here, or None."""
        key = self._key(kind, what)
        path = self.path / f"{key_hash(key)}{_SUFFIX}"
        if not path.exists():
            return None
        try:
            entry = _load_measured(path)
            if entry["key"] != key:
                raise CacheEntryError("stale or foreign entry: stored under another key")
        except CacheEntryError as error:
            warnings.warn(f"mugraph cache: ignoring the measured choice {path}: {error}; it "
                          "is measured again", stacklevel=2)
            return None
        return entry["value"]

    def put(self, kind: str, what: dict, value: dict) -> Path | None:
        """Store ``value`` (JSON data) for ``what`` of ``kind``; the path, or None when the
        folder cannot be written (a warning says why: the choice is then only this
        process's)."""
        key = self._key(kind, what)
        entry = {"format": MEASURED_FORMAT, "key": key, "created": time.time(), "value": value}
        entry["checksum"] = _checksum(entry)
        path = self.path / f"{key_hash(key)}{_SUFFIX}"
        try:
            _atomic_write(path, json.dumps(entry, indent=1))
        except OSError as error:
            warnings.warn(f"mugraph cache: could not store a measured choice in {self.path}: "
                          f"{error}", stacklevel=2)
            return None
        return path

    def _entry_files(self) -> list[Path]:
        return _entry_files(self.path)

    def count(self) -> int:
        """How many entries there are (valid or not)."""
        return len(self._entry_files()) if self.path.is_dir() else 0

    def clear(self) -> int:
        """Remove every entry; how many went."""
        if not self.path.is_dir():
            return 0
        return _clear_folder(self.path, self._entry_files())


def _load_measured(path: Path) -> dict:
    """The measured choice in ``path``, checked for being whole, ours and intact."""
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CacheEntryError(f"unreadable or truncated ({error})") from None
    if not isinstance(entry, dict) or entry.get("format") != MEASURED_FORMAT:
        raise CacheEntryError(f"foreign file: not a measured choice of format {MEASURED_FORMAT}")
    if entry.get("checksum") != _checksum(entry):
        raise CacheEntryError("checksum mismatch (the file is corrupted)")
    if not isinstance(entry.get("key"), dict) or not isinstance(entry.get("value"), dict):
        raise CacheEntryError("schema: 'key' and 'value' must be objects")
    return entry
