"""Stopping the local broker waits until its processes are gone; `kafka-up` then finds the port free."""

from __future__ import annotations

import subprocess
import sys
import time

from foreshock.ingest.kafka_local import stop_process_group

_STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
             "time.sleep(60)")
_POLITE = "import time; print('up', flush=True); time.sleep(60)"


def _group(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_a_process_that_exits_on_sigterm_is_waited_for():
    proc = _group(_POLITE)
    assert stop_process_group(proc.pid, grace_s=10) == "exited on SIGTERM"
    assert proc.wait(1) is not None


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    proc = _group(_STUBBORN)
    started = time.monotonic()
    assert stop_process_group(proc.pid, grace_s=1.0) == "killed after 1 s"
    assert 1.0 <= time.monotonic() - started < 5
    assert proc.wait(1) == -9
    assert stop_process_group(proc.pid) == "was not running"
