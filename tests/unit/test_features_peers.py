"""Peer features: robust to one broken sensor, and compared within a node's partition.

The z kernel (median and MAD) is checked on numbers worked by hand; then, through the risk
service, a node whose temperature sensor reads an absurd (but contract-valid) value moves none of
its peers' scores. (Online and batch engines agree on peers: tests/unit/test_features_parity.py.)
"""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd
import pytest

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.features.kernels import MAD_SCALE, MEAN_AD_SCALE, robust_z
from foreshock.features.online import OnlineFeatureEngine
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import TELEMETRY_TOPICS, Topic, decode, encode, partition_of
from foreshock.ingest.simulator import stream
from tests.fixtures.predictor import simulator
from tests.unit.test_predictor_service import by_key, drain, make_service


def z_of(values: list[float]) -> list[float]:
    col = pd.Series(values, dtype=np.float64)
    keys = [pd.Series(np.zeros(len(values), dtype=np.int64))]
    return robust_z(col, col.groupby(keys).transform("median"), keys).tolist()


def test_the_z_score_is_median_and_mad_and_one_outlier_moves_no_other_value():
    # median 3, absolute deviations 2 1 0 1 5 -> MAD 1
    assert z_of([1, 2, 3, 4, 8]) == pytest.approx([-2 / MAD_SCALE, -1 / MAD_SCALE, 0, 1 / MAD_SCALE,
                                                   5 / MAD_SCALE])
    broken = z_of([1, 2, 3, 4, 190])
    assert broken[:4] == z_of([1, 2, 3, 4, 8])[:4]
    # most nodes at one value (a counter at 0): MAD 0, so the mean absolute deviation scales
    assert z_of([0, 0, 0, 4]) == pytest.approx([0, 0, 0, 4 / (MEAN_AD_SCALE * 1.0)])
    assert z_of([5, 5, 5]) == [0, 0, 0]
    assert np.isnan(z_of([1.0, float("nan"), 3.0])[1])


class BrokenSensorBus(InMemoryBus):
    """The in-memory bus, with one node's GPU temperature sensor stuck at ``reading``."""

    def __init__(self, node: str, reading: float):
        super().__init__(partitions=8)
        self.node, self.reading = node, reading

    def send(self, topic: str, key: str, value: bytes) -> None:
        if topic == Topic.GPU and key == self.node:
            value = encode([msgspec.structs.replace(r, gpu_temp=self.reading) for r in decode(topic, value)])
        super().send(topic, key, value)


def test_one_broken_sensor_moves_none_of_its_peers_scores(risk_model_dir, tmp_path):
    sim = simulator(minutes=40)
    broken = "node0000"
    group = partition_of(broken, 8)
    peers = [n for n in sim.node_names if n != broken and partition_of(n, 8) == group]
    assert len(peers) >= 2, "the broken node needs peers for the test to mean anything"
    runs, rows = {}, {}
    for reading in (120.0, 199.0):  # hotter than every other GPU either way; 199 °C is no real reading
        bus = BrokenSensorBus(broken, reading)
        stream(sim, bus)
        runs[reading] = by_key(drain(make_service(bus, risk_model_dir, tmp_path / str(reading))))
        engine = OnlineFeatureEngine(DEFAULT_FEATURE_SET)
        engine.update([r for t in TELEMETRY_TOPICS for m in bus.messages(t) for r in decode(t, m.value)])
        rows[reading] = engine.features_at(sim.end_ms).set_index("node").loc[[broken, *peers]]
    hot, absurd = runs[120.0], runs[199.0]
    assert set(hot) == set(absurd)
    others = {k for k in hot if k[0] != broken}
    assert {n for n, _ in others} >= set(peers)
    assert {k: hot[k] for k in others} == {k: absurd[k] for k in others}
    # the test can fail: a mean and a standard deviation over the same rows move with the reading
    base, z = "gpu_temp__max__30m", "peer_z__gpu_temp__max__30m"
    assert rows[120.0].loc[broken, base] == 120.0 and rows[199.0].loc[broken, base] == 199.0
    assert rows[120.0].loc[peers, z].tolist() == rows[199.0].loc[peers, z].tolist()
    plain = {k: (r[base] - r[base].mean()) / r[base].std(ddof=0) for k, r in rows.items()}
    assert not np.allclose(plain[120.0].loc[peers], plain[199.0].loc[peers])
