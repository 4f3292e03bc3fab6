"""``foreshock serve`` allocates its arrays without numpy's huge-page advice, unless told otherwise.

The advice is visible in the kernel's view of the process: a mapping advised with
``MADV_HUGEPAGE`` carries ``hg`` in its ``VmFlags`` (``/proc/<pid>/smaps``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not (Path("/proc/self/smaps").exists() and Path("/sys/kernel/mm/transparent_hugepage").exists()),
    reason="Linux with transparent huge pages needed (the advice fails without them)",
)

_PROBE = """
import numpy as np
from foreshock.commands.serve import no_huge_page_advice
no_huge_page_advice()
a = np.ones(64 << 17)  # 64 MiB: numpy advises arrays of 4 MiB and more
start = a.__array_interface__["data"][0] + a.nbytes // 2  # numpy advises the aligned middle
flags, inside = None, False
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and ":" not in head[0]:
        lo, hi = (int(x, 16) for x in head[0].split("-"))
        inside = lo <= start < hi
    elif inside and head[0] == "VmFlags:":
        flags = head[1:]
print("hg" in flags)
"""


def _advised(env: dict[str, str]) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return out.stdout.strip() == "True"


def test_serve_allocates_without_the_advice_and_numpys_variable_still_wins():
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    assert not _advised(env)
    assert _advised({**env, "NUMPY_MADVISE_HUGEPAGE": "1"})
