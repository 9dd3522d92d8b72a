"""The cost model's features and estimate of every custom kernel of the known graphs are the
stored ones (tests/golden/cost_estimates.json; ``python tests/cost_snapshot.py --write``
rewrites them when a change is meant, ``--lowered`` compares with the lowered IR's
footprints)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_snapshot import SNAPSHOT, estimates  # noqa: E402


def test_cost_estimates_match_the_snapshot():
    stored = json.loads(SNAPSHOT.read_text())
    now = estimates()
    assert now.keys() == stored.keys()
    changed = {key: (stored[key], now[key]) for key in now if stored[key] != now[key]}
    assert not changed, f"{len(changed)} of {len(now)} estimates changed: {list(changed)[:10]}"
