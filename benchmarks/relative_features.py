"""Whether the model keeps its false-alarm budget on a cluster that runs hotter, louder or busier
than the one it learned from, once it no longer reads absolute sensor levels.

A temperature of 80 °C, a power draw of 400 W or a minimum SM clock is a fact about a cluster's
cooling, GPU model and workload as much as about a failing part: a model that learned llama3's
levels reads an air-cooled fleet's ordinary afternoon as a foreshock. ``relative`` drops the
absolute levels (:data:`LEVELS`) and keeps how they move (slopes, spread, noise), how a node
compares with its peers at the same tick (``peer_z``, ``peer_rank``), limits set by the hardware
(GPUs above 85 °C, thermal violations, clock-event reasons) and every error count. Both variants
are trained alike on one dataset and judged alike on pools of datasets neither saw
(:func:`history_features.compare`), the judge profiles included.

    .venv/bin/python benchmarks/relative_features.py --train DIR --pool aircooled=DIR,DIR --out runs/relative
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from history_features import compare, variant_args  # benchmarks/, the script's own folder

from foreshock.features.default_set import DEFAULT_FEATURE_SET

LEVELS = (
    "gpu_temp__last__5m",
    "gpu_temp__max__30m",
    "gpu_temp__mean__30m",
    "memory_temp__max__30m",
    "power_usage__mean__30m",
    "power_usage__max__30m",
    "sm_clock__min__30m",
    "gpu_util__mean__30m",
)


@dataclass(frozen=True)
class Columns:
    """A subset of the shipped set's columns, named as a feature set is: the variant's model reads
    only these, from features computed with the whole set. Not ``FeatureSet.select``, which drops
    a peer score with its base feature: this variant keeps ``peer_z__gpu_temp__max__30m`` while it
    drops ``gpu_temp__max__30m``."""

    names: tuple[str, ...]

    @property
    def hash(self) -> str:
        return hashlib.sha256(f"{DEFAULT_FEATURE_SET.hash}:{','.join(self.names)}".encode()).hexdigest()


def relative() -> Columns:
    missing = set(LEVELS) - set(DEFAULT_FEATURE_SET.names)
    assert not missing, f"not in the shipped set: {sorted(missing)}"
    return Columns(tuple(n for n in DEFAULT_FEATURE_SET.names if n not in LEVELS))


def main() -> None:
    compare(variant_args(__doc__), {"relative": relative(), "base": DEFAULT_FEATURE_SET})


if __name__ == "__main__":
    main()
