"""Fleet records: the generic CSV, validation errors that name the row and field, and the two
real sources (Titan GPU lives, the InfiniteHBD trace) read into the one table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from foreshock.models.fleet.records import COLUMNS, FleetRecordError, read_csv, unit_lifetimes, validate
from foreshock.models.fleet.sources import cray_location, load_infinitehbd, load_titan
from foreshock.models.fleet.titan import deaths, location_counts, read_service_nodes, read_study_summary
from foreshock.shipped import trace

DATA = Path(__file__).resolve().parents[1] / "data" / "fleet"


@pytest.fixture(scope="module")
def titan() -> pd.DataFrame:
    return load_titan(trace("titan"))


def test_generic_csv_reads_into_the_table_in_utc() -> None:
    records = read_csv(DATA / "tickets.csv")
    assert list(records.columns) == [*COLUMNS, "rack_row"]
    assert len(records) == 7
    assert str(records["install_time"].dtype) == "datetime64[ns, UTC]"
    node2 = records[records["unit"] == "gpu-node-002"].iloc[0]
    assert node2["end_time"] == pd.Timestamp("2025-04-02T09:00:00Z")  # +02:00 converted to UTC
    assert node2["kind"] == "NIC link down" and not node2["censored"]
    assert records["censored"].sum() == 4
    assert records.loc[records["censored"] & records["kind"].isna(), "repaired_time"].isna().all()
    assert set(records["rack_row"]) == {"A", "B"}


def test_bad_csv_names_every_bad_row_and_field() -> None:
    with pytest.raises(FleetRecordError) as caught:
        read_csv(DATA / "bad_tickets.csv")
    problems = caught.value.problems
    assert problems[0].startswith("line 3, field end_time: 'yesterday' is not a date and time")
    assert any(p.startswith("line 4, field unit: empty") for p in problems)
    assert any(p.startswith("line 5, field censored: 'maybe'") for p in problems)
    assert any(p.startswith("line 5, field end_time:") and "before install_time" in p for p in problems)
    assert any(p.startswith("line 6, field kind: empty for a failure") for p in problems)
    assert len(problems) == 5
    assert "bad_tickets.csv: 5 bad record(s)" in str(caught.value)


def test_missing_columns_and_overlapping_spells_are_refused(tmp_path: Path) -> None:
    no_censored = tmp_path / "a.csv"
    no_censored.write_text("unit,install_time,end_time\nn1,2025-01-01,2025-01-02\n")
    with pytest.raises(FleetRecordError, match=r"line 1 \(header\): missing column\(s\): censored"):
        read_csv(no_censored)
    frame = pd.DataFrame({
        "unit": ["n1", "n1"], "install_time": ["2025-01-01", "2025-01-05"],
        "end_time": ["2025-01-10", "2025-01-20"], "censored": [True, True],
    })
    overlap = r"row 1, field install_time: .* unit 'n1''s previous record \(row 0\)"
    with pytest.raises(FleetRecordError, match=overlap):
        validate(frame)
    back_before_failure = frame.assign(install_time=["2025-01-01", "2025-01-10"], censored=[False, True],
                                       kind=["PSU", None], repaired_time=["2025-01-09", None])
    with pytest.raises(FleetRecordError, match=r"row 0, field repaired_time: .* is before end_time"):
        validate(back_before_failure)


def test_unit_lifetimes_add_spells_and_count_a_failure_only_when_the_unit_left() -> None:
    records = read_csv(DATA / "tickets.csv")
    life = unit_lifetimes(records).set_index("unit")
    assert life.at["gpu-node-001", "spells"] == 3
    assert life.at["gpu-node-001", "duration_days"] == pytest.approx(
        180 - (11.5 + 37.75) / 24, rel=1e-9  # 180 days less two repairs of 11.5 h and 37.75 h
    )
    assert not life.at["gpu-node-001", "failed"]  # repaired and still in service at the end
    assert life.at["gpu-node-001", "kind"] == "GPU ECC DBE"
    assert not life.at["gpu-node-003", "failed"]  # left, but without a failure
    later = unit_lifetimes(records, observed_until=pd.Timestamp("2025-07-01", tz="UTC")).set_index("unit")
    assert later["failed"].to_dict() == {  # records that stop before the observation does: the unit left
        "gpu-node-001": True, "gpu-node-002": True, "gpu-node-003": False, "gpu-node-004": False}


def test_cray_cnames_split_into_levels() -> None:
    levels = cray_location(pd.Series(["c13-3c1s0n0", "c0-7c2s7n3"]))
    assert levels.to_dict("list") == {
        "col": [13, 0], "row": [3, 7], "cage": [1, 2], "slot": [0, 7], "node": [0, 3]}
    with pytest.raises(ValueError, match="not a Cray cname"):
        cray_location(pd.Series(["rack-1"]))


def test_titan_lives_reproduce_the_studys_own_per_gpu_table(titan: pd.DataFrame) -> None:
    """The SC20 study's gc_summary_loc.csv, recomputed from the raw lives by the loader."""
    study = pd.read_csv(trace("titan-summary"), dtype={"SN": str}).set_index("SN")
    assert len(titan) == 36_183  # 36,185 lives less the two a GPU is listed in while it is elsewhere
    assert titan["kind"].value_counts().to_dict() == {"DBE": 3829, "OTB": 1438}
    ours = unit_lifetimes(titan).set_index("unit").reindex(study.index)
    assert len(ours) == 30_207 and ours["duration_days"].notna().all()
    assert (ours["batch"] == study["batch"]).all()
    assert ((ours["duration_days"] - study["days"]).abs() < 1e-6).sum() == 30_207 - 2
    assert (ours[["col", "row", "cage", "slot", "node"]].to_numpy()
            == study[["col", "row", "cage", "slot", "node"]].to_numpy()).all()
    agree = (ours["failed"] == study["dead"]).sum()
    assert agree >= 30_207 - 8  # 8 GPUs' events are listed at a neighbouring node or after the life
    assert ours["failed"].sum() == pytest.approx(study["dead"].sum(), abs=8)


def test_titan_times_are_eastern_local_time_kept_in_utc(titan: pd.DataFrame) -> None:
    first = titan[titan["unit"] == "0320117100060"].iloc[0]
    assert first["install_time"] == pd.Timestamp("2017-04-10 01:36:19", tz="UTC")  # 21:36:19 EDT
    assert (first["end_time"] - first["install_time"]).total_seconds() == 72_916_274  # the file's duration


def test_infinitehbd_spells_cover_every_server_and_every_fault() -> None:
    records = load_infinitehbd(trace("infinitehbd"))
    events = json.loads(trace("infinitehbd").read_text())
    starts = sum(e["event_type"] == "fault_start" for e in events)
    failures = records[~records["censored"]]
    assert records["unit"].nunique() == 400
    assert len(failures) == starts - 2  # two faults begin while their server is already down
    assert failures["repaired_time"].notna().all()
    assert (failures["repaired_time"] >= failures["end_time"]).all()
    assert failures["kind"].value_counts().index[0] == "Unknown Error"
    assert set(failures["cause"]) >= {"unknown", "gpu_ecc", "ib_link_down"}
    per_unit = records.groupby("unit")
    span = (per_unit["end_time"].max() - per_unit["install_time"].min()).dt.total_seconds() / 86_400
    assert span.round(6).eq(349).all()
    # each spell after a repair starts when the repair ended
    nxt = records.groupby("unit")["install_time"].shift(-1)
    repaired = failures.index
    assert (nxt[repaired] == records.loc[repaired, "repaired_time"]).all()


def test_titan_positions_per_level_are_the_layout_less_the_service_nodes(titan: pd.DataFrame) -> None:
    study = read_study_summary(trace("titan-summary"))
    service = read_service_nodes(trace("titan-service"))
    assert len(service) == 512
    counts = location_counts(unit_lifetimes(titan), study, service, titan).set_index(["level", "value"])
    assert counts.loc["cage", "positions_layout"].tolist() == [6400 - 192, 6400 - 160, 6400 - 160]
    assert counts["positions"].sum() == 3 * 18_687  # one position of cage 1 never held a GPU
    assert (counts["gpus"] == counts["study_gpus"]).all()
    assert counts.loc["cage", "study_failed"].tolist() == [1109, 1762, 2218]
    died = deaths(study)
    assert (~died["censored"]).sum() == 5089 and len(died) == 30_207
