"""The code generator emits its Triton source from the lowered IR (mugraph.codegen.lowered):
the source of every known graph, under every codegen variant the tests and the runtime use,
is byte-for-byte what the stored snapshot says (hashes: tests/golden/codegen_sources.json,
rewritten by ``python tests/codegen_snapshot.py --write`` when a change is meant)."""

from __future__ import annotations

import json

from codegen_snapshot import SNAPSHOT, all_sources


def test_generated_sources_match_the_snapshot():
    stored = json.loads(SNAPSHOT.read_text())
    now = all_sources()
    changed = sorted(k for k in stored.keys() | now.keys() if stored.get(k) != now.get(k))
    assert not changed, f"{len(changed)} of {len(now)} sources changed: {changed[:20]}"
