"""What the backend did with each graph: the partitions mugraph took and what fell back."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PartitionReport:
    """One partition: its fx nodes, its mugraph operators, and how it runs."""

    name: str
    nodes: list[str]
    targets: list[str]
    ops: list[str]
    program_hash: str
    status: str = "pending"  # optimized | unimproved | error | not searched
    runs_on: str = "pytorch"  # mugraph | pytorch
    cache: str = "off"  # hit | miss | off
    search: dict = field(default_factory=dict)
    detail: str = ""
    shape_class: str = ""  # the class whose representative was searched ("" for none)
    tiling: dict = field(default_factory=dict)  # grid axes and for-loop of the tiled answer
    measured: dict = field(default_factory=dict)  # first-call GPU times, mugraph vs PyTorch
    # the choices above taken from an earlier process's measurements on this GPU (the result
    # cache's measured choices): "tiling", "answers_ms", "real_size_ms", "partition"
    stored: list = field(default_factory=list)

    def _kept(self) -> str:
        """The tiling kept, its launch setting when one was timed faster than the default, and
        how many faster tilings computed wrongly when compiled (skipped)."""
        t = self.tiling
        grid = " x ".join(f"{axis}/{parts}" for axis, parts in t.get("grid") or [])
        loop = f", loop {t['loop'][0]}/{t['loop'][1]}" if t.get("loop") else ""
        launch = (f", {t['launch'][0]} warps {t['launch'][1]} stages" if t.get("launch")
                  else "")
        wrong = f"; {t['wrong_kernels']} computed wrongly" if t.get("wrong_kernels") else ""
        return f" (kept: grid {grid or '1'}{loop}{launch}{wrong})"

    def line(self) -> str:
        stats = self.search
        found = ""
        if stats:
            found = (
                f", search {stats.get('elapsed', 0):.1f} s / {stats.get('states', 0)} states / "
                f"{stats.get('verified', 0)} verified"
            )
        detail = f" — {self.detail}" if self.detail else ""
        if self.tiling.get("timed_ms"):
            timed = ", ".join(f"{t:.4f}" for t in self.tiling["timed_ms"])
            detail += f" — tilings timed (ms): {timed}{self._kept()}"
        if self.tiling.get("answers_ms"):
            block, looped = self.tiling["answers_ms"]
            detail += (f" — answers timed (ms): reduction in one block {block:.4f}, "
                       f"looped {looped:.4f}")
        if self.tiling.get("real_size_ms"):
            tiled, real = self.tiling["real_size_ms"]
            detail += (f" — answers timed (ms): tiled class answer {tiled:.4f}, searched at "
                       f"the real sizes {real:.4f}")
        elif self.tiling.get("real_size"):
            detail += " — searched at the real sizes"
        if self.measured and self.runs_on == "mugraph":
            times = ", ".join(f"{k.removesuffix('_ms')} {v:.3f}" for k, v in self.measured.items())
            detail += f" — measured ms: {times}"
        if self.stored:
            detail += (" — measured by an earlier process: "
                       f"{', '.join(dict.fromkeys(self.stored))}")
        cls = f" [{self.shape_class}]" if self.shape_class else ""
        return (
            f"{self.name}{cls}: {len(self.nodes)} fx nodes -> {len(self.ops)} mugraph ops "
            f"[{', '.join(self.ops)}]; {self.status}, runs on {self.runs_on} "
            f"(cache {self.cache}{found}){detail}"
        )


@dataclass
class Fallback:
    """An fx node left to PyTorch, and why."""

    node: str
    target: str
    reason: str


@dataclass
class GraphReport:
    """One compiled (specialized) graph."""

    graph_id: int
    signature: str
    partitions: list[PartitionReport] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0  # time the backend spent on this graph (capture, search, tiling)
    rest: str = "eager"  # what runs the nodes outside the partitions (eager | inductor)

    @property
    def taken(self) -> list[PartitionReport]:
        return [p for p in self.partitions if p.runs_on == "mugraph"]

    def format(self) -> str:
        lines = [f"mugraph graph {self.graph_id} ({self.signature}), {self.seconds:.1f} s:"]
        if self.error:
            lines.append(f"  whole graph runs on PyTorch: {self.error}")
        for p in self.partitions:
            lines.append(f"  {p.line()}")
            lines.append(f"      nodes: {', '.join(self.short(p.nodes))}")
        if self.fallbacks:
            lines.append("  left to PyTorch:")
            for f in self.fallbacks:
                lines.append(f"    {f.node} ({f.target}): {f.reason}")
        return "\n".join(lines)

    @staticmethod
    def short(names: list[str], limit: int = 12) -> list[str]:
        return names if len(names) <= limit else [*names[:limit], f"... ({len(names)} in all)"]


_REPORTS: list[GraphReport] = []


def record(report: GraphReport) -> None:
    _REPORTS.append(report)


def reports() -> list[GraphReport]:
    """Every graph the backend compiled in this process, oldest first."""
    return list(_REPORTS)


def last_report() -> GraphReport | None:
    return _REPORTS[-1] if _REPORTS else None


def clear_reports() -> None:
    _REPORTS.clear()
