"""End-to-end fire drill with real torchrun elastic (CPU, gloo, three agents on this machine).

A and B train, C stands by. Warned: risk rises on B → the mitigator migrates → snapshot → B leaves
→ A and C resume from the snapshot → B is killed: no step lost. Unwarned (same test): B is killed
with no warning → A and C resume from the last periodic snapshot and lose the steps since.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

EVERY = 40


def test_warned_migration_loses_no_step_and_unwarned_loses_the_steps_since_the_checkpoint(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "foreshock",
            "drill",
            "--json",
            "--every",
            str(EVERY),
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    w, u = r["warned"], r["unwarned"]
    for name, x in (("warned", w), ("unwarned", u)):
        print(f"\n{name}: steps lost {x['steps_lost']}, seconds lost {x['seconds_lost']}, "
              f"downtime {x['downtime_seconds']} s")
    print(f"alert -> durable snapshot {r['alert_to_snapshot_seconds']} s")
    assert set(r) >= {
        "warned_steps_lost",
        "unwarned_steps_lost",
        "warned_seconds_lost",
        "unwarned_seconds_lost",
        "alert_to_snapshot_seconds",
    }
    assert w["resumed_nodes"] == u["resumed_nodes"] == ["A", "C"]  # the spare took B's place
    assert r["warned_steps_lost"] == 0 and r["warned_seconds_lost"] == 0
    assert w["resumed_from"] == w["last_step_before"] > EVERY  # resumed from the on-demand snapshot
    assert u["resumed_from"] % EVERY == 0  # from the last periodic snapshot ...
    assert r["unwarned_steps_lost"] == u["last_step_before"] - u["resumed_from"] > 0  # ... losing the rest
    assert r["unwarned_seconds_lost"] > 0
    assert 0 < r["alert_to_snapshot_seconds"] < 30
