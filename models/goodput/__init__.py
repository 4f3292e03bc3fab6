"""Goodput: what failures cost a training job, and what checkpointing and prediction buy back.

``traces`` builds failure traces (profile draws, simulated ground truth, the real InfiniteHBD
trace), ``simulate`` replays one against a checkpointed job, ``compare`` runs the strategies
side by side and sweeps cluster size and recall (``sweep`` is what notebooks call), ``plot``
draws ETTR against recall. ``tiers`` is the tiered in-memory checkpoint model (memory, peer and
durable tiers) and ``projection`` its costs at scale from a drill file and published figures.
``burnin`` is the failures a job still sees when repaired nodes go through a burn-in.
"""

from foreshock.models.goodput.burnin import BurnInReplay, apply_burn_in
from foreshock.models.goodput.compare import (
    BURN_IN_SUFFIX,
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
    "BURN_IN_SUFFIX",
    "JSON_KEYS",
    "SOURCES",
    "STRATEGIES",
    "TIERED_STRATEGIES",
    "BurnInReplay",
    "DrillReport",
    "FailureTrace",
    "JobParams",
    "OperatingPoint",
    "SimResult",
    "TierParams",
    "TierProjection",
    "apply_burn_in",
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
