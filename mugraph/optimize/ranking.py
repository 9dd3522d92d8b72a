"""Ranking verified μGraphs by measuring them on the GPU (the paper's μGraph optimizer, §6).

The search ranks its verified candidates by the cost model. On a machine with a CUDA device,
:func:`rank_graphs` then measures the most promising of them and picks the fastest:

1. **Selection** (:func:`select_for_timing`): the ``top_k`` best by estimate, then the best
   estimated candidate of every kernel structure not yet among them (:func:`kernel_structure`:
   the kernel graph with tile sizes abstracted), up to ``max_timed`` in all.
2. **Compilation**: every selected candidate is compiled and run once, in parallel worker
   processes (Triton's disk cache keeps the kernels for the timing worker).
3. **Check and time**: in one worker process, each candidate runs on fresh random inputs, its
   outputs are compared with the reference semantics of the program (float64, the dtype's
   tolerances of :mod:`mugraph.codegen.check`), and it is timed as the benchmarks time
   (:func:`mugraph.optimize.profile.profile_callable`: warm-up, median of CUDA-event times,
   L2 flushed before each run). The program itself is timed the same way.
4. **Launch tuning**: the ``tune_top`` fastest get their launch settings tuned
   (:func:`mugraph.optimize.tune.launch_variants`, one kernel after the other, each variant
   checked again), and the chosen settings are timed once more.

The measured fastest wins (the program itself too may win: then nothing beats it). Every
step that runs a new kernel runs in a child process (:mod:`mugraph.optimize.isolate`): a
candidate that fails to compile, faults the GPU, hangs or disagrees with the reference is
excluded with the reason, and the others go on. Each timed candidate leaves a
:class:`CandidateRecord` (graph hash, structure, estimate, measured medians, launch
settings), kept on the :class:`RankingResult` and appended as a JSON line to
``options.record_path`` (or ``$MUGRAPH_RANKING_LOG``) when set.

Without a CUDA device the cost model's order stands, and the result says so
(:func:`cost_model_ranking`). For tests, ``timer`` replaces the GPU timer and kernels run
under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mugraph.errors import UnsupportedError
from mugraph.ir.graph import BlockGraph
from mugraph.ir.ops import OpKind
from mugraph.optimize.isolate import IsolatedWorkers, Outcome

MODES = ("auto", "gpu", "cost")
RECORD_LOG_ENV = "MUGRAPH_RANKING_LOG"
PROGRAM_LABEL = "program"
_SIZE_ATTRS = frozenset({"dims"})  # attributes holding tile sizes (reshape targets)


# ---- options -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankingOptions:
    """How ``superoptimize`` ranks its verified candidates.

    mode: "auto" (measure on the GPU when a CUDA device is present, else the cost model),
    "gpu" (measure; an error without a device, unless ``timer`` is given and Triton's
    interpreter is on) or "cost" (the cost model only).
    top_k: candidates timed in order of estimate; then one per further kernel structure, up
    to ``max_timed`` in all. tune_top: how many of the fastest get their launch settings
    tuned. warmup / reps: runs before and during timing. seed: of the random inputs (None:
    fresh). isolate: run new kernels in child processes (False: in this process — a GPU
    fault then ends it). jobs: parallel compile workers (None: CPUs - 1, at most 16).
    task_timeout: seconds one compile or measurement may take. timer: replaces the GPU timer,
    ``timer(run, subject) -> seconds`` (picklable; ``subject`` is a :class:`TimingSubject`).
    record_path: a file to append one JSON line per candidate timed.
    keep_program: the program itself competes (if it is fastest, it is returned).
    gemv_forms: code forms of matrix-vector accumulators timed besides the default one, for
    candidates that have such an accumulator (``CodegenOptions.gemv_form``; the fastest is
    kept in the candidate's launch settings).
    """

    mode: str = "auto"
    top_k: int = 4
    max_timed: int = 16
    tune_top: int = 2
    warmup: int = 10
    reps: int = 100
    seed: int | None = None
    isolate: bool = True
    jobs: int | None = None
    task_timeout: float = 300.0
    timer: Callable | None = None
    record_path: str | None = None
    keep_program: bool = True
    gemv_forms: tuple[str, ...] = ("defer", "dot")

    def __post_init__(self) -> None:
        from mugraph.codegen.triton_gen import GEMV_FORMS

        unknown = [f for f in self.gemv_forms if f not in GEMV_FORMS]
        if unknown:
            raise UnsupportedError(f"superoptimize: ranking gemv_forms {unknown} are not among "
                                   f"{', '.join(GEMV_FORMS)}")
        if self.mode not in MODES:
            raise UnsupportedError(
                f"superoptimize: ranking mode {self.mode!r} is not one of {', '.join(MODES)}"
            )
        for name in ("top_k", "max_timed", "reps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UnsupportedError(f"superoptimize: ranking {name} must be an int >= 1, "
                                       f"got {value!r}")
        for name in ("tune_top", "warmup"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise UnsupportedError(f"superoptimize: ranking {name} must be an int >= 0, "
                                       f"got {value!r}")


def ranking_options(value: Any = None) -> RankingOptions:
    """RankingOptions from None (defaults), a mode name, a dict of fields, or options."""
    if value is None:
        return RankingOptions()
    if isinstance(value, RankingOptions):
        return value
    if isinstance(value, str):
        return RankingOptions(mode=value)
    if isinstance(value, dict):
        known = set(RankingOptions.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise UnsupportedError(f"superoptimize: unknown ranking option(s) {unknown}; "
                                   f"known: {sorted(known)}")
        return RankingOptions(**value)
    raise UnsupportedError(
        "superoptimize: ranking must be None, 'auto', 'gpu', 'cost', a dict or RankingOptions, "
        f"got {value!r}"
    )


def cuda_present() -> bool:
    """Whether kernels run on a CUDA device here (not under Triton's interpreter)."""
    from mugraph.codegen.loader import interpreter_active

    if interpreter_active():
        return False
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


# ---- kernel structures and the selection -------------------------------------------------------


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _abstract_attr(value: Any) -> Any:
    from mugraph.ir.serialize import encode_value

    if isinstance(value, BlockGraph):
        return _block_structure(value)
    if isinstance(value, tuple):
        return [_abstract_attr(v) for v in value]
    return encode_value(value)


def _ops_structure(ops) -> list:
    return [
        {
            "kind": op.kind.value,
            "in": [[r.op, r.index] for r in op.inputs],
            "attrs": {k: _abstract_attr(v) for k, v in op.attrs if k not in _SIZE_ATTRS},
            "dtypes": [t.dtype.value for t in op.outputs],
        }
        for op in ops
    ]


def _block_structure(block: BlockGraph) -> dict:
    """A block graph without its sizes: which grid axes exist, whether it loops, its ops
    (kinds, wiring, maps, accumulators) without tile dims."""
    return {
        "grid_axes": [g > 1 for g in block.grid_dim],
        "loops": block.forloop_range > 1,
        "ops": _ops_structure(block.ops),
    }


def kernel_structure(graph) -> str:
    """A short hash of ``graph``'s kernel structure: its kernel graph, and each custom
    kernel's block graph, with tile sizes abstracted away (grid sizes, for-loop length,
    block size, tensor dims): μGraphs differing only in tile sizes share a structure; a
    different operator, wiring, imap / omap / forloop_dim or accumulator is another one."""
    return _digest({"ops": _ops_structure(graph.ops),
                    "outputs": [[r.op, r.index] for r in graph.outputs]})


@dataclass(frozen=True)
class Entry:
    """A verified candidate offered for ranking: ``estimate`` in seconds."""

    label: str
    graph: Any
    estimate: float
    hash: str = ""
    structure: str = ""

    def __post_init__(self) -> None:
        if not self.hash:
            object.__setattr__(self, "hash", self.graph.structural_hash())
        if not self.structure:
            object.__setattr__(self, "structure", kernel_structure(self.graph))


def entries_from_candidates(candidates: Sequence[Any]) -> list[Entry]:
    """Entries (``#i`` in the search's order of estimate) from search Candidates."""
    return [Entry(f"#{i}", c.graph, c.cost, c.hash) for i, c in enumerate(candidates)]


def select_for_timing(entries: Sequence[Entry], top_k: int, max_timed: int) -> tuple[list[int],
                                                                                      int]:
    """Positions (into ``entries``, sorted by estimate) of the candidates to time: the
    ``top_k`` best estimates, then the best of each kernel structure not yet chosen, up to
    ``max_timed``; and how many structures were left without a timed candidate."""
    order = sorted(range(len(entries)), key=lambda i: (entries[i].estimate, entries[i].label))
    chosen = order[:top_k]
    seen = {entries[i].structure for i in chosen}
    left_out = set()
    for i in order[top_k:]:
        s = entries[i].structure
        if s in seen:
            continue
        if len(chosen) < max_timed:
            chosen.append(i)
            seen.add(s)
        else:
            left_out.add(s)
    return chosen, len(left_out)


# ---- records and the result --------------------------------------------------------------------


@dataclass
class CandidateRecord:
    """Estimate against measurement for one candidate (times in microseconds).

    status: "timed", "excluded" (``reason`` says why) or "not timed" (the cost model's
    ranking). measured_us is the figure candidates are compared by: the tuned launch
    settings' time when tuned, else the default launch's."""

    label: str
    graph_hash: str
    structure: str
    estimate_us: float
    status: str = "not timed"
    reason: str = ""
    default_us: float | None = None
    tuned_us: float | None = None
    measured_us: float | None = None
    launch: dict[str, list[int]] = field(default_factory=dict)
    error_ratio: float | None = None
    program: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CandidateRecord:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} us"


@dataclass
class RankingResult:
    """How the returned μGraph was chosen: by measurement ("gpu") or by the cost model."""

    method: str
    note: str = ""
    device: str = ""
    records: list[CandidateRecord] = field(default_factory=list)
    chosen: str | None = None  # label of the chosen candidate (PROGRAM_LABEL: the program)
    estimate_pick: str | None = None  # label of the best estimate
    program_us: float | None = None
    candidates_total: int = 0
    structures_untimed: int = 0
    seed: int | None = None
    reps: int = 0
    timer: str = "gpu"  # "gpu": profile_callable; else the injected timer's name
    elapsed_s: float = 0.0
    parts: list[RankingResult] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.method == "gpu"

    def record(self, label: str | None) -> CandidateRecord | None:
        return next((r for r in self.records if r.label == label), None)

    @property
    def chosen_record(self) -> CandidateRecord | None:
        return self.record(self.chosen)

    @property
    def launch(self) -> dict[str, list[int]]:
        """The chosen candidate's launch settings ({op index: [num_warps, num_stages]})."""
        chosen = self.chosen_record
        return dict(chosen.launch) if chosen is not None else {}

    @property
    def excluded(self) -> list[CandidateRecord]:
        return [r for r in self.records if r.status == "excluded"]

    def summary(self) -> str:
        if self.parts:
            return "\n".join(f"part {i}: {p.summary()}" for i, p in enumerate(self.parts))
        if not self.measured:
            pick = self.record(self.chosen)
            est = f" at {_us(pick.estimate_us)} estimated" if pick else ""
            return (f"ranked by the cost model ({self.note or 'no measurement'}): "
                    f"{self.candidates_total} verified candidate(s); chose {self.chosen}{est}; "
                    "nothing was measured")
        timed = [r for r in self.records if r.status == "timed"]
        method = (f"median of {self.reps} runs, L2 flushed" if self.timer == "gpu"
                  else "times from the given timer")
        lines = [
            f"ranked on the GPU ({self.device}; {method}): "
            f"{len(self.records)} of {self.candidates_total} verified candidates compiled and "
            f"checked, {len(timed)} timed, {len(self.excluded)} excluded"
            + (f"; {self.structures_untimed} kernel structure(s) not timed (max_timed)"
               if self.structures_untimed else "")
        ]
        lines.append(self._verdict())
        lines += [f"excluded {r.label}: {r.reason}" for r in self.excluded]
        return "\n  ".join(lines)

    def _verdict(self) -> str:
        chosen = self.chosen_record
        if self.chosen == PROGRAM_LABEL:
            best = min((r.measured_us for r in self.records if r.measured_us), default=None)
            return (f"the program itself was fastest ({_us(self.program_us)}; best candidate "
                    f"{_us(best)}): it is returned unchanged")
        if chosen is None:
            return "no candidate ran correctly: the program is returned unchanged"
        parts = [f"chose {chosen.label} at {_us(chosen.measured_us)} measured "
                 f"(est. {_us(chosen.estimate_us)}"
                 + (f", launch {_launch_text(chosen.launch)}" if chosen.tuned_us else "") + ")"]
        pick = self.record(self.estimate_pick)
        if pick is not None and pick is not chosen:
            if pick.measured_us:
                parts.append(f"{pick.measured_us / chosen.measured_us:.2f}x faster than the "
                             f"estimate's pick {pick.label} ({_us(pick.measured_us)})")
            else:
                parts.append(f"the estimate's pick {pick.label} was excluded")
        elif pick is chosen:
            parts.append("the estimate's pick")
        if self.program_us:
            parts.append(f"{self.program_us / chosen.measured_us:.2f}x faster than the program "
                         f"({_us(self.program_us)})")
        return "; ".join(parts)

    def table(self) -> str:
        """One line per candidate: estimate, default and tuned times, status."""
        head = f"{'cand':>6} {'structure':>16} {'est us':>9} {'default':>9} {'tuned':>9}  status"
        rows = [head]
        for r in self.records:
            status = r.status + (f": {r.reason}" if r.reason else "")
            mark = "*" if r.label == self.chosen else " "
            rows.append(f"{mark}{r.label:>5} {r.structure:>16} {r.estimate_us:9.2f} "
                        f"{_num(r.default_us):>9} {_num(r.tuned_us):>9}  {status[:90]}")
        if self.program_us is not None:
            rows.append(f"{'prog':>6} {'':>16} {'':>9} {_num(self.program_us):>9}")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        data = {
            "method": self.method,
            "note": self.note,
            "device": self.device,
            "chosen": self.chosen,
            "estimate_pick": self.estimate_pick,
            "program_us": self.program_us,
            "launch": self.launch,
            "candidates_total": self.candidates_total,
            "structures_untimed": self.structures_untimed,
            "seed": self.seed,
            "reps": self.reps,
            "timer": self.timer,
            "elapsed_s": round(self.elapsed_s, 3),
            "records": [r.to_dict() for r in self.records],
        }
        if self.parts:
            data["parts"] = [p.to_dict() for p in self.parts]
        return data

    @classmethod
    def combine(cls, parts: Sequence[RankingResult]) -> RankingResult:
        """One result for a program optimized in parts (each part ranked on its own)."""
        methods = {p.method for p in parts}
        method = methods.pop() if len(methods) == 1 else "mixed"
        return cls(method=method, note=f"{len(parts)} parts ranked separately",
                   device=next((p.device for p in parts if p.device), ""),
                   records=[r for p in parts for r in p.records],
                   candidates_total=sum(p.candidates_total for p in parts), parts=list(parts))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _launch_text(launch: dict[str, list]) -> str:
    return ", ".join(f"%{i}: {v[0]} warps, {v[1]} stages" + (f", gemv {v[2]}" if v[2:] else "")
                     for i, v in sorted(launch.items()))


# ---- tasks run in worker processes -------------------------------------------------------------


@dataclass(frozen=True)
class TimingSubject:
    """What a timer is asked to time: a candidate (by label and graph hash) with launch
    settings ((op index, num_warps, num_stages[, gemv_form]), empty for the defaults)."""

    label: str
    graph_hash: str
    launch: tuple[tuple[int, int, int], ...] = ()
    warmup: int = 10
    reps: int = 100


@dataclass(frozen=True)
class MeasureTask:
    """Compile ``graph`` (JSON) with ``launch``, check it against ``program``'s reference
    semantics on random inputs (``seed``), time it (``timer``, else the GPU timer)."""

    label: str
    graph: str
    program: str
    graph_hash: str = ""
    launch: tuple[tuple[int, int, int], ...] = ()
    seed: int = 0
    warmup: int = 10
    reps: int = 100
    timer: Callable | None = None
    time_it: bool = True


def profile_timer(run: Callable[[], Any], subject: TimingSubject) -> float:
    """The GPU timer: median seconds of ``run`` (:func:`profile_callable`)."""
    from mugraph.optimize.profile import profile_callable

    m = profile_callable(run, warmup=subject.warmup, reps=subject.reps)
    if not m.ok:
        raise RuntimeError(f"timing failed: {m.error}")
    return m.seconds


_WORKER_CACHE: dict[str, Any] = {}


def _graph(text: str):
    from mugraph.ir.serialize import from_json

    key = "graph:" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    if key not in _WORKER_CACHE:
        _WORKER_CACHE[key] = from_json(text)
    return _WORKER_CACHE[key]


def _device():
    import torch

    from mugraph.codegen.loader import interpreter_active

    if torch.cuda.is_available() and not interpreter_active():
        return torch.device("cuda")
    if interpreter_active():
        return torch.device("cpu")
    raise UnsupportedError("measuring a candidate needs a CUDA device (or Triton's interpreter, "
                           "TRITON_INTERPRET=1, with CPU tensors)")


def _reference(program_text: str, seed: int, device) -> tuple[list, list, float]:
    """(inputs on ``device``, float64 reference outputs, input scale) for the program: the
    first scale of :data:`mugraph.codegen.check.AUTO_SCALES` at which no operator of the
    program exceeds its dtype's range (the program's own overflow is not a kernel's fault)."""
    import numpy as np

    from mugraph.codegen.check import AUTO_SCALES, DTYPE_MAX, random_inputs
    from mugraph.ir.tensor import TensorRef
    from mugraph.semantics.reference import evaluate_ops

    key = f"ref:{hashlib.blake2b(program_text.encode(), digest_size=16).hexdigest()}:{seed}:" \
          f"{device}"
    if key in _WORKER_CACHE:
        return _WORKER_CACHE[key]
    program = _graph(program_text)
    refs = [TensorRef(i, j) for i, op in enumerate(program.ops) for j in range(len(op.outputs))]
    for scale in AUTO_SCALES:
        inputs = random_inputs(program, "cpu", seed, scale)
        arrays = [x.double().numpy() for x in inputs]
        values = evaluate_ops(program.ops, refs, arrays)
        with np.errstate(invalid="ignore"):
            overflow = any(
                np.any(np.abs(v) > DTYPE_MAX[program.ops[r.op].outputs[r.index].dtype])
                for v, r in zip(values, refs, strict=True)
                if program.ops[r.op].kind is not OpKind.INPUT
            )
        if not overflow:
            break
    outputs = [values[refs.index(r)] for r in program.outputs]
    result = ([x.to(device) for x in inputs], outputs, scale)
    _WORKER_CACHE.clear() if len(_WORKER_CACHE) > 64 else None
    _WORKER_CACHE[key] = result
    return result


def _compiled(task: MeasureTask):
    from mugraph.runtime.compiled import LaunchConfig, compile_graph

    graph = _graph(task.graph)
    launch = {i: LaunchConfig.from_list(rest) for i, *rest in task.launch} or None
    return graph, compile_graph(graph, check=False, launch=launch)


def prepare_task(task: MeasureTask) -> str:
    """Compile a candidate and run it once on random inputs (its kernels then sit in
    Triton's disk cache); the device it ran on."""
    import torch

    from mugraph.codegen.check import random_inputs

    device = _device()
    graph, program = _compiled(task)
    program(inputs=random_inputs(graph, device, task.seed))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return str(device)


def measure_task(task: MeasureTask) -> dict:
    """Check a candidate against the reference semantics and time it; a dict with
    ``status`` ("ok" or "mismatch"), ``seconds``, ``error_ratio``, ``launch`` (the settings
    it ran with) and ``device``."""
    import torch

    from mugraph.codegen.check import TOLERANCES, compare

    device = _device()
    inputs, refs, scale = _reference(task.program, task.seed, device)
    graph, program = _compiled(task)
    outs = program(inputs=inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    worst = 0.0
    for k, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        rtol, atol = TOLERANCES[graph.output_types[k].dtype]
        cmp = compare(out.detach().double().cpu().numpy(), ref, rtol, atol)
        worst = max(worst, cmp.max_rel_error)
        if not cmp.ok:
            return {"status": "mismatch", "error_ratio": cmp.max_rel_error,
                    "reason": f"output {k} disagrees with the reference semantics: "
                              f"{cmp.max_rel_error:.3g}x the tolerance at {cmp.worst_index}, "
                              f"{cmp.nonfinite_mismatch} non-finite mismatches "
                              f"(inputs of scale {scale:g})"}
    launch = [[i, *s.launch_config.to_list()] for i, s in program.steps.items()]
    result = {"status": "ok", "error_ratio": worst, "launch": launch, "scale": scale,
              "device": _device_name(device), "seconds": None}
    if task.time_it:
        subject = TimingSubject(task.label, task.graph_hash, task.launch, task.warmup, task.reps)
        timer = task.timer or profile_timer
        result["seconds"] = float(timer(lambda: program(inputs=inputs), subject))
    return result


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "CPU (Triton interpreter)"


# ---- the ranking -------------------------------------------------------------------------------


def _record_for(entry: Entry, program_hash: str) -> CandidateRecord:
    return CandidateRecord(entry.label, entry.hash, entry.structure, entry.estimate * 1e6,
                           program=program_hash)


def cost_model_ranking(entries: Sequence[Entry], note: str, top: int = 4) -> RankingResult:
    """The cost model's order, unmeasured: the best estimate is chosen."""
    ordered = sorted(entries, key=lambda e: (e.estimate, e.label))
    program = ""
    records = [_record_for(e, program) for e in ordered[:top]]
    pick = ordered[0].label if ordered else None
    return RankingResult("cost model", note=note, records=records, chosen=pick,
                         estimate_pick=pick, candidates_total=len(entries))


@dataclass
class Pools:
    """The worker processes of a ranking: ``compile`` (several, compiling in parallel) and
    ``timing`` (one: every measurement runs in it, one after the other). Several rankings
    may share them (the benchmark does); close them when done."""

    compile: IsolatedWorkers
    timing: IsolatedWorkers

    @classmethod
    def for_options(cls, options: RankingOptions, cuda: bool | None = None) -> Pools:
        cuda = cuda_present() if cuda is None else cuda
        jobs = options.jobs if options.jobs is not None else _default_jobs()
        isolated = 1 if options.isolate else 0
        return cls(IsolatedWorkers(jobs if cuda and options.isolate else 0,
                                   task_timeout=options.task_timeout),
                   IsolatedWorkers(isolated, task_timeout=options.task_timeout))

    def close(self) -> None:
        self.compile.close()
        self.timing.close()


class _Ranker:
    """One ranking: the selected entries, the worker pools, the records."""

    def __init__(self, program, entries: Sequence[Entry], options: RankingOptions,
                 progress: Callable[[str], None] | None, pools: Pools | None) -> None:
        self.program = program
        self.program_text = program.to_json()
        self.program_hash = program.structural_hash()
        self.entries = list(entries)
        self.options = options
        self.progress = progress
        self.seed = options.seed if options.seed is not None else int.from_bytes(
            os.urandom(4), "little")
        self.cuda = cuda_present()
        self.own_pools = pools is None
        self.pools = pools or Pools.for_options(options, self.cuda)
        self.device = ""
        self.prepared = False

    def say(self, line: str) -> None:
        if self.progress:
            self.progress(f"ranking: {line}")

    def task(self, entry_label: str, graph_text: str, graph_hash: str, launch=(),
             time_it: bool = True) -> MeasureTask:
        o = self.options
        return MeasureTask(entry_label, graph_text, self.program_text, graph_hash,
                           tuple(launch), self.seed, o.warmup, o.reps, o.timer, time_it)

    # the steps ---------------------------------------------------------------------------

    def prepare(self, tasks: list[MeasureTask]) -> list[Outcome | None]:
        """Compile and run once, in parallel (CUDA only: the interpreter compiles nothing)."""
        if not self.cuda or len(tasks) <= 1 or self.pools.compile.size <= 1:
            return [None] * len(tasks)
        return self.pools.compile.run(prepare_task, tasks)

    def measure(self, tasks: list[MeasureTask]) -> list[Outcome]:
        """Check and time, one after the other in the timing worker."""
        return self.pools.timing.run(measure_task, tasks)

    def run(self) -> RankingResult:
        started = time.monotonic()
        o = self.options
        chosen, untimed = select_for_timing(self.entries, o.top_k, o.max_timed)
        selected = [self.entries[i] for i in chosen]
        records = [_record_for(e, self.program_hash) for e in selected]
        texts = [e.graph.to_json() for e in selected]
        self.say(f"compiling {len(selected)} of {len(self.entries)} verified candidates")
        tasks = [self.task(e.label, t, e.hash) for e, t in zip(selected, texts, strict=True)]
        prepared = [None] * len(tasks) if self.prepared else self.prepare(tasks)
        for rec, outcome in zip(records, prepared, strict=True):
            if outcome is not None and not outcome.ok and outcome.kind != "error":
                self._exclude(rec, outcome, "when first run")
        live = [(rec, task) for rec, task in zip(records, tasks, strict=True)
                if rec.status != "excluded"]
        forms = [(rec, task) for rec, task in live for task in self.form_tasks(task)]
        prepared = [None] * len(forms) if self.prepared else self.prepare([t for _, t in forms])
        forms = [f for f, p in zip(forms, prepared, strict=True)
                 if p is None or p.ok or p.kind == "error"]
        program_task = self.task(PROGRAM_LABEL, self.program_text, self.program_hash)
        measured = self.measure([t for _, t in live] + [t for _, t in forms]
                                + ([program_task] if o.keep_program else []))
        for (rec, _), outcome in zip(live, measured, strict=False):
            self._take_default(rec, outcome)
        for (rec, task), outcome in zip(forms, measured[len(live):], strict=False):
            self._take_form(rec, task, outcome)
        program_us = None
        if o.keep_program and measured:
            outcome = measured[-1]
            if outcome.ok and outcome.value.get("status") == "ok":
                program_us = outcome.value["seconds"] * 1e6
            else:
                self.say(f"the program itself could not be timed: {_reason(outcome)}")
        self._tune(records, texts, selected)
        result = RankingResult(
            "gpu", note="measured", device=self.device, records=records,
            estimate_pick=min(self.entries, key=lambda e: (e.estimate, e.label)).label,
            program_us=program_us, candidates_total=len(self.entries),
            structures_untimed=untimed, seed=self.seed, reps=o.reps,
            timer="gpu" if o.timer is None else getattr(o.timer, "__name__",
                                                         type(o.timer).__name__),
        )
        result.chosen = _fastest(records, program_us if o.keep_program else None)
        result.elapsed_s = time.monotonic() - started
        return result

    def form_tasks(self, task: MeasureTask) -> list[MeasureTask]:
        """The candidate of ``task`` in each other GEMV form (``gemv_forms``), at its kernels'
        default launch settings; none when no kernel has a matrix-vector accumulator."""
        from mugraph.codegen.triton_gen import gemv_accumulators
        from mugraph.runtime.compiled import default_launch

        graph = _graph(task.graph)
        kernels = {i: op.attr("graph") for i, op in enumerate(graph.ops)
                   if op.kind is OpKind.CUSTOMIZED}
        if not any(gemv_accumulators(block) for block in kernels.values()):
            return []
        out = []
        for form in self.options.gemv_forms:
            launch = {i: replace(default_launch(block), gemv_form=form)
                      for i, block in kernels.items()}
            out.append(self.task(task.label, task.graph, task.graph_hash, _launch_tuple(launch)))
        return out

    def _take_form(self, rec: CandidateRecord, task: MeasureTask, outcome: Outcome) -> None:
        """A GEMV form's time: it replaces the candidate's default when faster."""
        us = _ok_us(outcome)
        form = task.launch[0][3]
        if us is None:
            rec.notes.append(f"gemv form {form}: {_reason(outcome)}")
            return
        rec.notes.append(f"gemv form {form}: {us:.1f} us")
        if rec.status == "timed" and us < rec.default_us:
            rec.default_us = rec.measured_us = us
            rec.launch = {str(i): rest for i, *rest in task.launch}
            self.say(f"{rec.label}: {us:.1f} us with the gemv form {form}")

    def _exclude(self, rec: CandidateRecord, outcome: Outcome, when: str = "") -> None:
        rec.status = "excluded"
        rec.reason = _reason(outcome) + (f" ({when})" if when and outcome.kind != "error" else "")
        self.say(f"{rec.label} excluded: {rec.reason}")

    def _take_default(self, rec: CandidateRecord, outcome: Outcome) -> None:
        if not outcome.ok:
            self._exclude(rec, outcome)
            return
        value = outcome.value
        rec.error_ratio = value.get("error_ratio")
        if value["status"] != "ok":
            rec.status, rec.reason = "excluded", value["reason"]
            self.say(f"{rec.label} excluded: {rec.reason}")
            return
        self.device = self.device or value.get("device", "")
        rec.status = "timed"
        rec.default_us = rec.measured_us = value["seconds"] * 1e6
        rec.launch = {str(i): rest for i, *rest in value["launch"]}
        self.say(f"{rec.label}: {rec.default_us:.1f} us (est. {rec.estimate_us:.1f} us)")

    def _tune(self, records, texts, selected) -> None:
        """Launch settings of the ``tune_top`` fastest, one kernel after the other."""
        timed = sorted((i for i, r in enumerate(records) if r.status == "timed"),
                       key=lambda i: records[i].default_us)
        for i in timed[: self.options.tune_top]:
            try:
                self._tune_one(records[i], texts[i], selected[i])
            except Exception as error:  # noqa: BLE001 - the default launch's time stands
                records[i].notes.append(f"tuning failed: {type(error).__name__}: {error}")

    def _tune_one(self, rec: CandidateRecord, text: str, entry: Entry) -> None:
        from mugraph.optimize.tune import launch_variants
        from mugraph.runtime.compiled import LaunchConfig

        best = {int(i): LaunchConfig.from_list(v) for i, v in rec.launch.items()}
        best_us = rec.default_us
        tried = 0
        for op_index in sorted(best):
            block = entry.graph.ops[op_index].attr("graph")
            variants = launch_variants(block, best[op_index])
            launches = [_launch_tuple({**best, op_index: v}) for v in variants]
            tasks = [self.task(rec.label, text, rec.graph_hash, launch) for launch in launches]
            prepared = self.prepare(tasks)
            keep = [k for k, p in enumerate(prepared) if p is None or p.ok or p.kind == "error"]
            outcomes = self.measure([tasks[k] for k in keep])
            tried += len(tasks)
            for k, outcome in zip(keep, outcomes, strict=True):
                us = _ok_us(outcome)
                if us is None:
                    rec.notes.append(f"launch {variants[k]} of %{op_index}: {_reason(outcome)}")
                elif us < best_us:
                    best, best_us = {**best, op_index: variants[k]}, us
        if _launch_tuple(best) == _launch_tuple(
                {int(i): LaunchConfig.from_list(v) for i, v in rec.launch.items()}):
            rec.notes.append(f"tuned: the default launch stayed best of {tried + 1}")
            return
        # the chosen settings timed once more (the minimum of many noisy times is biased)
        again = self.measure([self.task(rec.label, text, rec.graph_hash, _launch_tuple(best))])
        final = _ok_us(again[0])
        if final is None:
            rec.notes.append(f"tuned launch failed when re-timed: {_reason(again[0])}")
            return
        rec.tuned_us = final
        rec.measured_us = min(rec.default_us, final)
        if final < rec.default_us:
            rec.launch = {str(i): c.to_list() for i, c in best.items()}
        rec.notes.append(f"tuned over {tried + 1} launch settings")
        self.say(f"{rec.label} tuned: {final:.1f} us ({_launch_text(rec.launch)})")

    def close(self) -> None:
        if self.own_pools:
            self.pools.close()


def _launch_tuple(configs: dict) -> tuple[tuple[int, int, int], ...]:
    return tuple((int(i), *c.to_list()) for i, c in sorted(configs.items()))


def _ok_us(outcome: Outcome) -> float | None:
    if outcome.ok and outcome.value.get("status") == "ok" and outcome.value.get("seconds"):
        return outcome.value["seconds"] * 1e6
    return None


def _reason(outcome: Outcome) -> str:
    if outcome.ok:
        return outcome.value.get("reason", "") if isinstance(outcome.value, dict) else ""
    if outcome.kind == "error":
        return f"failed to compile or run: {outcome.error}"
    return outcome.describe()


def _fastest(records: Sequence[CandidateRecord], program_us: float | None) -> str | None:
    timed = [r for r in records if r.status == "timed" and r.measured_us is not None]
    if not timed:
        return None
    best = min(timed, key=lambda r: (r.measured_us, r.label))
    if program_us is not None and program_us < best.measured_us:
        return PROGRAM_LABEL
    return best.label


def _default_jobs() -> int:
    from mugraph.optimize.precompile import default_jobs

    return default_jobs()


def rank_graphs(
    program,
    entries: Sequence[Entry],
    options: RankingOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    pools: Pools | None = None,
    prepared: bool = False,
) -> RankingResult:
    """Rank ``entries`` (verified μGraphs of ``program``) as ``options`` say: on the GPU
    when there is one (or when ``mode="gpu"``), else by the cost model. See the module text.

    pools: worker processes to use (and leave open) instead of new ones. prepared: the
    entries were compiled and run once already (the parallel compile step is skipped)."""
    options = options or RankingOptions()
    if not entries:
        return RankingResult("cost model", note="no candidates")
    if options.mode == "cost":
        return cost_model_ranking(entries, "ranking='cost' was asked for")
    if not cuda_present():
        from mugraph.codegen.loader import interpreter_active

        if options.mode == "auto":
            return cost_model_ranking(entries, "no CUDA device")
        if options.timer is None or not interpreter_active():
            raise UnsupportedError(
                "superoptimize: ranking='gpu' needs a CUDA device (or, for tests, a timer and "
                "Triton's interpreter: TRITON_INTERPRET=1)"
            )
    ranker = _Ranker(program, entries, options, progress, pools)
    ranker.prepared = prepared
    try:
        result = ranker.run()
    finally:
        ranker.close()
    write_records(result, options.record_path)
    return result


def write_records(result: RankingResult, path: str | os.PathLike | None = None) -> None:
    """Append one JSON line per candidate timed to ``path`` (else ``$MUGRAPH_RANKING_LOG``;
    nothing when neither is set)."""
    path = path or os.environ.get(RECORD_LOG_ENV)
    if not path:
        return
    lines = []
    for rec in result.records:
        data = rec.to_dict()
        data.update(device=result.device, seed=result.seed, program_us=result.program_us,
                    chosen=rec.label == result.chosen)
        lines.append(json.dumps(data, sort_keys=True))
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))


def launch_settings(result: RankingResult | None) -> dict[int, Any]:
    """The chosen candidate's launch settings as {op index: LaunchConfig} (empty when the
    cost model ranked or nothing was tuned)."""
    from mugraph.runtime.compiled import LaunchConfig

    if result is None:
        return {}
    return {int(i): LaunchConfig.from_list(v) for i, v in result.launch.items()}


__all__ = [
    "CandidateRecord",
    "Pools",
    "Entry",
    "RankingOptions",
    "RankingResult",
    "TimingSubject",
    "cost_model_ranking",
    "entries_from_candidates",
    "kernel_structure",
    "launch_settings",
    "rank_graphs",
    "ranking_options",
    "select_for_timing",
]
