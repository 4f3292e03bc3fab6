"""Alert episodes, false alarms, per-failure recall and lead time, and the budget threshold."""

from __future__ import annotations

import numpy as np
import pandas as pd

from foreshock.models.alerting import EvalRows

MIN = 60_000


def _frame():
    """Two nodes x 100 minutes. n0 fails at minute 100 (rows 40..99 positive); n1 never fails."""
    rows = []
    for node in ("n0", "n1"):
        for m in range(100):
            positive = node == "n0" and m >= 40
            rows.append(
                (
                    node,
                    m * MIN,
                    int(positive),
                    100 * MIN if positive else pd.NA,
                    "gpu" if positive else None,
                    True if positive else None,
                )
            )
    return pd.DataFrame(rows, columns=["node", "ts", "label", "failure_ts", "cause", "detectable"])


def _score(frame, alerting):
    """1.0 on the (node, minute) pairs given, 0 elsewhere."""
    keys = set(alerting)
    return np.array(
        [1.0 if (n, t // MIN) in keys else 0.0 for n, t in zip(frame["node"], frame["ts"], strict=True)]
    )


def test_episodes_false_alarms_and_lead_time():
    rows = EvalRows(_frame().sample(frac=1.0, random_state=0), MIN)  # input order does not matter
    alerting = [("n0", m) for m in range(10, 13)]  # false alarm: n0 does not fail within H of these
    alerting += [("n0", m) for m in range(70, 75)]  # true alarm, lead 30 min
    alerting += [("n1", m) for m in (5, 6, 50)]  # two false alarms on n1
    m = rows.at_threshold(_score(rows.frame, alerting), 0.5)
    assert (m["alert_episodes"], m["false_alarms"]) == (4, 3)
    assert m["failures"] == 1 and m["caught"] == 1 and m["recall_at_budget"] == 1.0
    assert m["lead_minutes"] == [30.0] and m["median_lead_minutes"] == 30.0
    assert m["precision_at_budget"] == 0.25
    assert np.isclose(m["false_alarms_per_1000_node_days"], 3 / (200 / 1440) * 1000)
    assert m["recall_by_cause"] == {"gpu": {"failures": 1, "caught": 1, "recall": 1.0}}
    assert m["recall_by_detectability"]["detectable"]["recall"] == 1.0
    assert m["row_recall_at_budget"] == 5 / 60


def test_an_episode_that_reaches_into_the_horizon_is_true_and_gaps_split_episodes():
    frame = _frame()
    frame = frame[~((frame["node"] == "n1") & (frame["ts"] == 51 * MIN))]  # a gap in n1's rows
    rows = EvalRows(frame, MIN)
    alerting = [("n0", m) for m in range(30, 45)]  # starts before the horizon, ends inside it
    alerting += [("n1", m) for m in range(49, 54)]  # split in two by the gap
    m = rows.at_threshold(_score(rows.frame, alerting), 0.5)
    assert (m["alert_episodes"], m["false_alarms"]) == (3, 2)
    assert m["lead_minutes"] == [60.0]  # first alerting row inside [f - H, f)


def test_caught_15_minutes_ahead_counts_detectable_failures_warned_at_least_15_minutes_before():
    frame = _frame()
    for first_alert, detectable, expected in ((85, True, 1), (86, True, 0), (85, False, 0)):
        frame["detectable"] = frame["label"].map({1: detectable, 0: None})
        rows = EvalRows(frame, MIN)
        m = rows.at_threshold(_score(rows.frame, [("n0", mm) for mm in range(first_alert, 100)]), 0.5)
        assert m["caught"] == 1 and m["caught_15_minutes_ahead"] == expected, (first_alert, detectable)


def test_missed_failure_and_no_alerts():
    rows = EvalRows(_frame(), MIN)
    m = rows.at_threshold(np.zeros(len(rows.frame)), 0.5)
    assert m["recall_at_budget"] == 0.0 and m["alert_episodes"] == 0 and m["precision_at_budget"] is None
    assert m["median_lead_minutes"] is None


def test_budget_threshold_is_the_lowest_within_budget():
    rows = EvalRows(_frame(), MIN)
    rng = np.random.default_rng(0)
    score = rng.uniform(0, 0.5, len(rows.frame))
    score[rows.label == 1] += 0.3  # failures rank higher, with overlap
    for budget in (0.0, 10.0, 50.0, 200.0):
        thr = rows.threshold_for_budget(score, budget)
        assert rows.false_alarm_rate(score >= thr) <= budget
        lower = np.max(score[score < thr]) if (score < thr).any() else None
        if lower is not None and budget < 200:
            assert rows.false_alarm_rate(score >= lower) > budget or thr == np.min(score)
    assert rows.threshold_for_budget(score, 0.0) >= rows.threshold_for_budget(score, 200.0)


def test_recall_at_equal_false_alarm_rates_sets_the_threshold_on_the_rows_themselves():
    rows = EvalRows(_frame(), MIN)
    one = 1 / rows.node_days * 1000  # one false alarm per 1,000 node-days on these 200 minutes
    score = _score(rows.frame, [("n1", 5)]) * 0.9 + _score(rows.frame, [("n0", 70)]) * 0.8
    at = rows.recall_at_rates(score, rates=(0.0, one, 2 * one))
    assert at["0"] == {"caught": 0, "failures": 1, "recall": 0.0, "false_alarms_per_1000_node_days": 0.0,
                       "threshold": None}  # every threshold that alerts at all pays n1's false alarm
    assert at[f"{one:g}"]["caught"] == 1 and at[f"{one:g}"]["threshold"] == 0.8  # the highest that catches
    assert at[f"{2 * one:g}"]["caught"] == 1


def test_false_alarms_soon_after_a_return_from_repair_are_counted_apart():
    frame = _frame()
    back = (frame["node"] == "n1") & (frame["ts"] >= 40 * MIN)
    frame["returned_ts"] = pd.array(np.where(back, 40 * MIN, 0), dtype="Int64")
    frame.loc[~back, "returned_ts"] = pd.NA  # n1 came back at minute 40; nothing before
    rows = EvalRows(frame, MIN)
    m = rows.at_threshold(_score(rows.frame, [("n1", 5), ("n1", 45)]), 0.5)  # 40 min apart: two alarms
    assert (m["false_alarms"], m["false_alarms_after_return"]) == (2, 1)
    assert EvalRows(_frame(), MIN).at_threshold(np.ones(200), 0.5)["false_alarms_after_return"] == 0


def test_a_dip_shorter_than_the_clearing_time_does_not_open_a_new_alarm():
    alerting = [("n1", m) for m in (10, 11, 30, 31, 70)]  # dips of 18 min, then 38 min
    for clear_ms, episodes in ((30 * MIN, 2), (0, 3)):
        rows = EvalRows(_frame(), MIN, clear_ms)
        m = rows.at_threshold(_score(rows.frame, alerting), 0.5)
        assert (m["alert_episodes"], m["false_alarms"]) == (episodes, episodes)


def test_an_alarm_is_true_only_through_an_alerting_row_in_the_horizon():
    rows = EvalRows(_frame(), MIN, 30 * MIN)
    m = rows.at_threshold(_score(rows.frame, [("n0", 20), ("n0", 45)]), 0.5)  # merged: one alarm
    assert (m["alert_episodes"], m["false_alarms"], m["lead_minutes"]) == (1, 0, [55.0])
    m = rows.at_threshold(_score(rows.frame, [("n0", 20), ("n0", 35)]), 0.5)  # held past minute 40
    assert (m["alert_episodes"], m["false_alarms"], m["caught"]) == (1, 1, 0)


def test_median_interval_brackets_the_median_and_narrows_with_more_catches():
    from foreshock.models.alerting import median_interval

    rng = np.random.default_rng(1)
    few, many = rng.uniform(0, 60, 12), rng.uniform(0, 60, 1_200)
    for leads in (few, many):
        low, high = median_interval(leads)
        assert low <= np.median(leads) <= high
    assert np.diff(median_interval(many))[0] < np.diff(median_interval(few))[0] / 3
    assert median_interval(few) == median_interval(few)  # seeded: a report is reproducible
    assert median_interval(np.array([7.0])) is None


def test_consecutive_rows_stay_one_episode_even_with_no_clearing_time():
    from foreshock.models.alerting import episode_starts

    ts = np.array([0, 1, 2, 5, 6]) * MIN  # a node alerting at minutes 0-2, then 5-6
    assert episode_starts(np.zeros(5), ts, 0, MIN).tolist() == [True, False, False, True, False]
    assert episode_starts(np.zeros(5), ts, 30 * MIN, MIN).tolist() == [True, False, False, False, False]
    assert episode_starts(np.array([0, 0, 0, 1, 1]), ts, 30 * MIN, MIN).tolist()[3]  # node back from down
