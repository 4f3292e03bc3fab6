"""Goodput: what failures cost a training job, and what checkpointing and prediction buy back.

``traces`` builds failure traces (profile draws, simulated ground truth, the real InfiniteHBD
trace), ``simulate`` replays one against a checkpointed job, ``compare`` runs the strategies
side by side and sweeps cluster size and recall (``sweep`` is what notebooks call), ``plot``
draws ETTR against recall.
"""

from models.goodput.compare import JSON_KEYS, STRATEGIES, OperatingPoint, compare, run_strategies, sweep
from models.goodput.simulate import JobParams, SimResult, simulate
from models.goodput.traces import (
    FailureTrace,
    from_ground_truth,
    from_profile,
    load_infinitehbd,
    load_profile,
    resize,
)

__all__ = [
    "JSON_KEYS",
    "STRATEGIES",
    "FailureTrace",
    "JobParams",
    "OperatingPoint",
    "SimResult",
    "compare",
    "from_ground_truth",
    "from_profile",
    "load_infinitehbd",
    "load_profile",
    "resize",
    "run_strategies",
    "simulate",
    "sweep",
]
