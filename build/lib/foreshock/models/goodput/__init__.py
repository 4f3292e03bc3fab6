"""Goodput: what failures cost a training job, and what checkpointing and prediction buy back.

``traces`` builds failure traces (profile draws, simulated ground truth, the real InfiniteHBD
trace), ``simulate`` replays one against a checkpointed job, ``compare`` runs the strategies
side by side and sweeps cluster size and recall (``sweep`` is what notebooks call), ``plot``
draws ETTR against recall. ``tiers`` is the tiered in-memory checkpoint model (memory, peer and
durable tiers) and ``projection`` its costs at scale from a drill file and published figures.
"""

from foreshock.models.goodput.compare import (
    JSON_KEYS,
    STRATEGIES,
    TIERED_STRATEGIES,
    OperatingPoint,
    compare,
    run_strategies,
    sweep,
)
from foreshock.models.goodput.projection import SOURCES, DrillReport, TierProjection, project
from foreshock.models.goodput.simulate import JobParams, SimResult, simulate
from foreshock.models.goodput.tiers import TierParams, ettr_tiered, pair_loss_probability, tier_intervals
from foreshock.models.goodput.traces import (
    FailureTrace,
    from_ground_truth,
    from_profile,
    load_infinitehbd,
    load_profile,
    resize,
)

__all__ = [
    "JSON_KEYS",
    "SOURCES",
    "STRATEGIES",
    "TIERED_STRATEGIES",
    "DrillReport",
    "FailureTrace",
    "JobParams",
    "OperatingPoint",
    "SimResult",
    "TierParams",
    "TierProjection",
    "compare",
    "ettr_tiered",
    "from_ground_truth",
    "from_profile",
    "load_infinitehbd",
    "load_profile",
    "pair_loss_probability",
    "project",
    "resize",
    "run_strategies",
    "simulate",
    "sweep",
    "tier_intervals",
]
