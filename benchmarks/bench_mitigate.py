"""Mitigation latency and loss with real torchrun, against the unwarned failure in the same run.

    .venv/bin/python benchmarks/bench_mitigate.py [--quick]

1. Fire drill (:mod:`foreshock.mitigator.drill`): the drill job under torchrun elastic (A and B train, C is
   the spare). Warned: a risk record crosses the threshold on B → the mitigator migrates → figures:
   alert → state in the buddy's memory, alert → training resumed on the spare, steps/seconds lost.
   Baseline: B dies unannounced in the same run (steps/seconds lost since the last snapshot it
   could restore, and failure → training resumed). ``--quick`` runs the warned scenario only.
2. Policy throughput: risk records/s through the mitigator's loop (decode → engine → executor →
   audit) on the in-memory bus, against decoding alone (the floor any consumer pays).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from foreshock.ingest.bus import InMemoryBus  # noqa: E402
from foreshock.ingest.contract import RiskScore, Topic  # noqa: E402
from foreshock.ingest.stream import RecordStream, publish  # noqa: E402
from foreshock.mitigator.audit import AuditLog  # noqa: E402
from foreshock.mitigator.drill import DrillSettings, run_scenario  # noqa: E402
from foreshock.mitigator.engine import MitigationEngine  # noqa: E402
from foreshock.mitigator.executor import Executor  # noqa: E402
from foreshock.mitigator.service import MitigationService  # noqa: E402


def risk_stream(nodes: int, rounds: int) -> list[RiskScore]:
    """Mostly healthy nodes, a few rising: the shape of a real risk.scores topic."""
    out = []
    for i in range(rounds):
        for n in range(nodes):
            p = min(0.99, 0.02 + (0.3 * i / rounds if n % 50 == 0 else 0.0))
            out.append(RiskScore(node=f"node{n:04d}", ts=1_760_000_000_000 + i * 60_000, probability=p,
                                 alert=p >= 0.8, threshold=0.8))
    return out


def policy_throughput(records: list[RiskScore], work: Path) -> tuple[float, float]:
    """(records/s through the mitigator loop, records/s decoding only)."""
    rates = []
    for full in (True, False):
        bus = InMemoryBus()
        publish(bus, records)
        t0 = time.perf_counter()
        if full:
            end = max(r.ts for r in records)  # all received at the end: none rejected for its time
            engine = MitigationEngine(fleet_size=len({r.node for r in records}), clock=lambda end=end: end,
                                      horizon_ms=end - min(r.ts for r in records) + 1)
            service = MitigationService(bus, engine, Executor(AuditLog(work / "bench-audit.sqlite", bus=bus)))
            while service.poll_once(0.0):
                pass
        else:
            stream = RecordStream(bus, bus.consumer("decode-only", [Topic.RISK]))
            while polled := stream.poll(0.0):
                stream.commit(polled)
        rates.append(len(records) / (time.perf_counter() - t0))
    return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="warned drill only, fewer records")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mitigate-") as tmp:
        work = Path(tmp)
        settings = DrillSettings()
        warned = run_scenario(work / "warned", "warned", settings)
        print("fire drill (torchrun elastic, gloo CPU, 3 agents on this host)")
        print(f"  alert -> state in peer memory    {warned.alert_to_snapshot_seconds:8.3f} s")
        print(f"  alert -> training resumed on C   {warned.alert_to_resumed_seconds:8.3f} s")
        print(f"  warned:   steps lost {warned.steps_lost:4d}   seconds lost {warned.seconds_lost:7.3f}")
        if not args.quick:
            unwarned = run_scenario(work / "unwarned", "unwarned", settings)
            u = unwarned
            print(f"  unwarned: steps lost {u.steps_lost:4d}   seconds lost {u.seconds_lost:7.3f}"
                  f"   failure -> resumed {u.downtime_seconds:.3f} s   (baseline)")
            print(f"  ratio lost steps warned/unwarned   {warned.steps_lost / max(u.steps_lost, 1):.3f}")
            print(f"  ratio time to resume warned (from alert) / unwarned (from failure) "
                  f"{warned.alert_to_resumed_seconds / unwarned.downtime_seconds:.3f}")
        records = risk_stream(200, 25 if args.quick else 100)
        full, floor = policy_throughput(records, work)
        print(f"policy loop: {full:,.0f} risk records/s   decode only: {floor:,.0f} records/s   "
              f"ratio {full / floor:.3f}")


if __name__ == "__main__":
    main()
