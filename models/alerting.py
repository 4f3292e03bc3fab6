"""Alert episodes, false alarms, per-failure recall and lead time, and the budget threshold.

Definitions (used for every predictor alike, so the numbers compare):

- A row *alerts* when its score is at or above the threshold.
- An **alert episode** is a node's alerting rows until the alert *clears*: it clears once
  ``clear_ms`` (default :data:`ALERT_CLEAR_MS`, 30 min) passes with no alerting row, or when the
  node's scored rows break (rows more than 1.5 cadences apart: the node was down or drained).
  A score that dips under the threshold for a few minutes and comes back is one alert, not two,
  as it is for the operator and the mitigator, which keep watching a node until it has stayed
  calm (``foreshock.mitigator.policy``). The 30 min were chosen on validation (llama3, 14 days, 5-min rows):
  at the 1 per 1,000 node-days budget, failures caught were 58 with no clearing time, 65 with
  15 min, 66 with 30 min and 66 with 60 min.
- An episode is a **true alert** when at least one of its alerting rows is labelled 1, i.e. the
  node failed within H after that row; otherwise it is a **false alarm** (the quiet time after
  its last alerting row never makes it true). ``precision_at_budget`` is true episodes / all
  episodes.
- **False alarms per 1,000 node-days** divides by the scored node-time: rows x cadence.
  ``false_alarms_after_return`` counts those that start within :data:`AFTER_RETURN_MS` after the
  node came back from repair (``since_return_ms`` from :mod:`foreshock.models.labels`): alarms that echo the
  burst before the failure, which a feature set without
  :attr:`~foreshock.features.spec.FeatureSet.reset_on_return` still holds in its windows.
- A **failure** is evaluated when at least one scored row lies in ``[f - H, f)`` (its positive
  rows). It is **caught** when one of those rows alerts, and its **lead time** is ``f`` minus the
  first such alerting row's ``ts`` (so 0 < lead <= H). ``recall_at_budget`` is caught / evaluated.
  ``median_lead_minutes_ci95`` is a bootstrap interval of the median lead over caught failures.
  ``caught_15_minutes_ahead`` counts the detectable failures caught at least
  :data:`WARNING_MINUTES` ahead. Unlike the median lead it never falls when a predictor also
  catches failures that show only in the last minutes, so it is the figure for "warns earlier".
- The **budget threshold** (:func:`budget_threshold`) is the lowest threshold at
  and above which the false alarms on the given rows keep an upper confidence bound within the
  budget: Garwood's exact one-sided bound (:func:`poisson_upper_bound`, at ``confidence``,
  default :data:`BUDGET_CONFIDENCE`) on the Poisson mean of false-alarm *episodes* over the rows'
  node-days. A threshold is judged by the most false alarms of any threshold at or above it, so a
  dip (an alarm that merges into a true one at a lower threshold) never lets the rule step into a
  pocket. When the rows are too few to bound the rate within budget even with no false alarm,
  the threshold is the lowest with none, and the choice says it is not ``certified``.
- **Recall at equal false-alarm rates** (``recall_at_rates``) sets each predictor's threshold on
  the evaluated rows themselves for each of a few rates, so predictors whose validation
  thresholds spend different budgets on new data can still be compared like for like.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["EvalRows", "EVAL_COLUMNS", "after_return", "DAY_MS", "ALERT_CLEAR_MS", "EQUAL_RATES",
           "AFTER_RETURN_MS", "WARNING_MINUTES", "BUDGET_CONFIDENCE", "BudgetChoice", "budget_threshold",
           "Parts", "ThresholdCounts", "candidates_of", "candidates_of_sorted", "operating_point",
           "rates_caught", "sweep", "episode_starts", "median_interval", "most_within", "poisson_upper_bound",
           "sorted_by_node_ts"]

DAY_MS = 86_400_000
ALERT_CLEAR_MS = 30 * 60_000
EQUAL_RATES = (1.0, 2.0, 5.0, 10.0)  # false alarms per 1,000 node-days for ``recall_at_rates``
AFTER_RETURN_MS = 60 * 60_000  # ``false_alarms_after_return``: the longest error-counter window
EPISODE_BLOCK_ROWS = 1 << 22  # EvalRows finds a threshold's episodes this many rows at a time
WARNING_MINUTES = 15  # ``caught_15_minutes_ahead``: time to checkpoint, drain and migrate ranks
# one-sided confidence of the false-alarm bound the budget threshold keeps within budget
BUDGET_CONFIDENCE = 0.9
# what EvalRows reads of a labelled frame, and ``since_return_ms`` or its :func:`after_return` flags
# when there; scores come beside them
EVAL_COLUMNS = ("node", "ts", "label", "failure_ts", "cause", "detectable")


def episode_starts(stretch: np.ndarray, ts: np.ndarray, clear_ms: int, cadence_ms: int) -> np.ndarray:
    """For alerting rows sorted by ``(stretch, ts)``, True where a row opens a new alert episode.

    A *stretch* labels one node's unbroken run of scored rows (a new node, or the node coming back
    from down time, is a new stretch). A row opens an episode when it is the first alerting row of
    its stretch or comes more than ``clear_ms`` after the previous one; rows one cadence apart
    never split an episode, whatever ``clear_ms`` (0 ends an episode at the first dip).
    """
    gap = max(clear_ms, int(1.5 * cadence_ms))
    start = np.ones(ts.size, dtype=bool)
    start[1:] = (stretch[1:] != stretch[:-1]) | (np.diff(ts) > gap)
    return start


def poisson_upper_bound(count: int, confidence: float) -> float:
    """Garwood's exact one-sided upper confidence bound on a Poisson mean from ``count`` events:
    the mean ``mu`` at which seeing ``count`` or fewer has probability ``1 - confidence``.

    Zero events still bound the mean by ``-ln(1 - confidence)`` (2.30 at 90 %): a rate over a
    thousand node-days with no false alarm is not known to be under one per thousand.

    >>> round(poisson_upper_bound(0, 0.9), 3), round(poisson_upper_bound(2, 0.95), 3)
    (2.303, 6.296)
    """
    if count < 0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"need count >= 0 and 0 < confidence < 1 (got {count}, {confidence})")
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, count + 1)))])
    i = np.arange(count + 1)

    def at_most(mu: float) -> float:  # P(Poisson(mu) <= count), summed in log space
        logs = -mu + i * math.log(mu) - log_factorial
        top = logs.max()
        return float(math.exp(top) * np.exp(logs - top).sum())

    lo, hi = 0.0, count + 20.0 * math.sqrt(count + 1.0) + 20.0
    for _ in range(100):  # bisection: at_most falls as mu grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at_most(mid) > 1.0 - confidence else (lo, mid)
    return hi


def most_within(limit: float, confidence: float) -> int:
    """The most events whose :func:`poisson_upper_bound` stays at or under ``limit``; -1 when even
    none does."""
    lo, hi = -1, max(0, math.floor(limit))  # the bound exceeds the count itself
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if poisson_upper_bound(mid, confidence) <= limit else (lo, mid - 1)
    return lo


@dataclass(frozen=True)
class BudgetChoice:
    """A budget threshold and the evidence behind it (:func:`budget_threshold`).

    ``false_alarms`` is the most false-alarm episodes of any candidate threshold at or above
    ``threshold`` on ``node_days`` of rows; ``upper_per_1000_node_days`` the bound on their rate
    at ``confidence``; ``certified`` whether that bound is within the budget."""

    threshold: float
    budget_per_1000_node_days: float
    confidence: float
    node_days: float
    false_alarms: int
    upper_per_1000_node_days: float
    certified: bool

    def to_json(self) -> dict[str, float | int | bool]:
        return {
            "threshold": self.threshold,
            "budget_false_alarms_per_1000_node_days": self.budget_per_1000_node_days,
            "confidence": self.confidence,
            "node_days": self.node_days,
            "false_alarms": self.false_alarms,
            "false_alarms_upper_bound_per_1000_node_days": self.upper_per_1000_node_days,
            "certified": self.certified,
        }


def sorted_by_node_ts(frame: pd.DataFrame) -> bool:
    """Whether ``frame`` is in (node, ts) order (a category column orders by its categories)."""
    node = frame["node"]
    if isinstance(node.dtype, pd.CategoricalDtype):
        order = node.cat.codes.to_numpy()
        if not node.cat.categories.is_monotonic_increasing:
            return False
    else:
        order = node.to_numpy(dtype=object)
    ts = frame["ts"].to_numpy()
    after, same = order[1:] > order[:-1], order[1:] == order[:-1]
    return bool(np.all(after | (same & (ts[1:] >= ts[:-1]))))


def after_return(rows: pd.DataFrame) -> np.ndarray:
    """Whether each row lies within :data:`AFTER_RETURN_MS` after its node came back from repair
    (its ``since_return_ms``; False without one). A frame of every row of a fleet's month holds
    this flag (a byte) in place of ``since_return_ms`` (four)."""
    if "since_return_ms" not in rows:
        return np.zeros(len(rows), dtype=bool)
    return rows["since_return_ms"].to_numpy(dtype=np.int64) <= AFTER_RETURN_MS


def _stretches(node: np.ndarray, ts: np.ndarray, gap: float, block: int = 1 << 24) -> np.ndarray:
    """Each row's stretch (int32, from 1): a new one at each row whose node differs from the row
    before or that comes more than ``gap`` after it. A block of rows at a time: a fleet's month
    is 85 M rows, and the differences of all of them at once would take 8 bytes a row. A block's
    differences are larger than glibc keeps on its heap, so they go back to the system."""
    stretch = np.empty(ts.size, dtype=np.int32)
    last = 0
    for lo in range(0, ts.size, block):
        hi, at = min(lo + block, ts.size), max(lo, 1)  # the very first row starts a stretch
        new = np.ones(hi - lo, dtype=bool)
        new[at - lo :] = (node[at:hi] != node[at - 1 : hi - 1]) | (np.diff(ts[at - 1 : hi]) > gap)
        np.cumsum(new, dtype=np.int32, out=stretch[lo:hi])
        stretch[lo:hi] += last
        last = int(stretch[hi - 1])
    return stretch


def _stretch_bounds(stretch: np.ndarray, block: int) -> np.ndarray:
    """Row bounds, from 0 to the last row, about ``block`` rows apart, each at the first row of a
    stretch: the episodes of a threshold are found a block of rows at a time (at a low threshold
    nearly every row alerts, and their places, stretches and times took 20 bytes a row)."""
    cuts = np.searchsorted(stretch, stretch[np.arange(block, stretch.size, block) - 1] + 1, side="left")
    return np.unique(np.r_[0, cuts, stretch.size])


@dataclass
class EvalRows:
    """Labelled rows sorted by (node, ts), prepared once for many thresholds and predictors.

    ``frame`` is the sorted labelled frame; scores passed to the methods must follow its order.
    ``clear_ms`` is the quiet time that ends an alert episode (0: every dip ends it).
    """

    frame: pd.DataFrame
    cadence_ms: int
    clear_ms: int = ALERT_CLEAR_MS

    def __post_init__(self) -> None:
        if not sorted_by_node_ts(self.frame):  # a sort copies every row: a fleet's month is 85 M
            self.frame = self.frame.sort_values(["node", "ts"], kind="stable")
        if not self.frame.index.equals(pd.RangeIndex(len(self.frame))):
            self.frame = self.frame.reset_index(drop=True)
        f = self.frame
        codes = f["node"].cat.codes if isinstance(f["node"].dtype, pd.CategoricalDtype) else None
        node = codes.to_numpy() if codes is not None else pd.factorize(f["node"])[0]
        del codes
        self._ts = f["ts"].to_numpy(dtype=np.int64)
        self.label = f["label"].to_numpy(dtype=np.int8)
        self._stretch = _stretches(node, self._ts, 1.5 * self.cadence_ms)
        self._blocks = _stretch_bounds(self._stretch, EPISODE_BLOCK_ROWS)
        del node
        pos = f.loc[self.label == 1, ["node", "failure_ts", "cause", "detectable"]]
        self.failures = pos.drop_duplicates(["node", "failure_ts"]).reset_index(drop=True)
        key = pd.MultiIndex.from_frame(self.failures[["node", "failure_ts"]])
        self._failure_of_pos = key.get_indexer(pd.MultiIndex.from_frame(pos[["node", "failure_ts"]]))
        self._pos_rows = np.flatnonzero(self.label == 1)

    def _after_return(self, rows: np.ndarray) -> np.ndarray:
        """Whether each of ``rows`` (places in :attr:`frame`) lies within :data:`AFTER_RETURN_MS`
        after its node came back from repair (:func:`after_return`)."""
        if "after_return" in self.frame:
            return self.frame["after_return"].to_numpy(dtype=bool)[rows]
        return after_return(self.frame.iloc[rows])

    def counting_only(self) -> EvalRows:
        """These rows with :attr:`frame` emptied of its columns (its length kept), returned: what
        :meth:`episodes`, :meth:`caught` and :attr:`node_days` read is prepared already, and the
        threshold folds of a fleet's month hold 60 M rows, 12 bytes a row in node, failure and
        cause columns nothing reads again. :meth:`at_threshold` needs those columns."""
        self.frame = pd.DataFrame(index=self.frame.index)
        return self

    @property
    def node_days(self) -> float:
        """Scored node-time in days."""
        return len(self.frame) * self.cadence_ms / DAY_MS

    def episodes(self, alert: np.ndarray) -> tuple[int, int]:
        """(episodes, false alarms) for a boolean alert vector."""
        first, true = self._episodes(alert)
        return int(first.size), int(np.count_nonzero(~true))

    def _episodes(self, alert: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each episode's first row (an index into :attr:`frame`) and whether it is a true alert."""
        firsts, trues = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=bool)]
        for lo, hi in zip(self._blocks[:-1], self._blocks[1:], strict=True):  # no episode spans two
            idx = lo + np.flatnonzero(alert[lo:hi])
            if idx.size == 0:
                continue
            start = episode_starts(self._stretch[idx], self._ts[idx], self.clear_ms, self.cadence_ms)
            starts = np.flatnonzero(start)
            firsts.append(idx[starts])
            trues.append(np.maximum.reduceat(self.label[idx], starts) > 0)
        return np.concatenate(firsts), np.concatenate(trues)

    def threshold_for_budget(
        self, score: np.ndarray, budget_per_1000_node_days: float, confidence: float = BUDGET_CONFIDENCE
    ) -> BudgetChoice:
        """:func:`budget_threshold` on these rows alone."""
        return budget_threshold(lambda: [(self, score)], candidates_of(score), self.node_days,
                                budget_per_1000_node_days, confidence)

    def recall_at_rates(self, score: np.ndarray, rates: tuple[float, ...] = EQUAL_RATES) -> dict[str, dict]:
        """:func:`rates_caught` on these rows alone."""
        points = sweep(lambda: [(self, score)], candidates_of(score), max(rates), self.node_days)
        return rates_caught(points, len(self.failures), rates)

    def caught(self, alert: np.ndarray) -> np.ndarray:
        """Per failure in :attr:`failures`: whether one of its positive rows alerts."""
        caught = np.zeros(len(self.failures), dtype=bool)
        caught[self._failure_of_pos[alert[self._pos_rows]]] = True
        return caught

    def at_threshold(self, score: np.ndarray, threshold: float) -> dict:
        """Operating-point metrics (see the module docstring) for one threshold."""
        return operating_point([self.threshold_counts(score, threshold)], threshold, self.cadence_ms)

    def threshold_counts(self, score: np.ndarray, threshold: float) -> ThresholdCounts:
        """What these rows give at ``threshold``, to be added up with other rows'
        (:func:`operating_point`)."""
        alert = score >= threshold
        first, true = self._episodes(alert)
        pos_alert = alert[self._pos_rows]
        first_alert = np.full(len(self.failures), np.iinfo(np.int64).max, dtype=np.int64)
        hit = self._failure_of_pos[pos_alert]
        np.minimum.at(first_alert, hit, self._ts[self._pos_rows][pos_alert])
        failures = self.failures
        return ThresholdCounts(
            rows=len(self.frame),
            positive_rows=int(self.label.sum()),
            alert_rows=int(alert.sum()),
            true_alert_rows=int((alert & (self.label == 1)).sum()),
            episodes=int(first.size),
            false_alarms=int(np.count_nonzero(~true)),
            false_alarms_after_return=int(np.count_nonzero(self._after_return(first[~true]))),
            node=failures["node"].to_numpy(),
            failure_ts=failures["failure_ts"].to_numpy(dtype=np.int64),
            cause=failures["cause"].astype("object").fillna("unknown").to_numpy(),
            detectable=failures["detectable"].to_numpy(),
            caught=self.caught(alert),
            first_alert=first_alert,
        )


@dataclass
class ThresholdCounts:
    """What one set of rows gives at a threshold: counts of rows and alert episodes, and per failure
    (in the rows' (node, ts) order) its node, time, cause, detectability, whether it was caught and
    its first alerting row's ``ts``. Sets of rows whose nodes are apart add up
    (:func:`operating_point`): a fleet's month is judged a node group at a time."""

    rows: int
    positive_rows: int
    alert_rows: int
    true_alert_rows: int
    episodes: int
    false_alarms: int
    false_alarms_after_return: int
    node: np.ndarray
    failure_ts: np.ndarray
    cause: np.ndarray
    detectable: np.ndarray
    caught: np.ndarray
    first_alert: np.ndarray


def operating_point(counts: Sequence[ThresholdCounts], threshold: float, cadence_ms: int) -> dict:
    """Operating-point metrics (see the module docstring) at ``threshold`` of the rows that gave
    ``counts``, their nodes apart, as if they were one (node, ts)-sorted set of rows: the failures
    in the order of their nodes (the bootstrap of the median lead draws by position)."""
    def total(name: str) -> int:
        return sum(getattr(c, name) for c in counts)

    columns = ("node", "failure_ts", "cause", "detectable", "caught", "first_alert")
    failures = pd.DataFrame({name: np.concatenate([getattr(c, name) for c in counts]) if counts else []
                             for name in columns})
    if len(counts) > 1:
        failures = failures.sort_values("node", key=lambda n: n.astype(str), kind="stable", ignore_index=True)
    n_ep, n_false = total("episodes"), total("false_alarms")
    node_days = total("rows") * cadence_ms / DAY_MS
    positive_rows, n_alert_rows = total("positive_rows"), total("alert_rows")
    tp_rows = total("true_alert_rows")
    nf = len(failures)
    caught = failures["caught"].to_numpy(dtype=bool)
    lead = (failures["failure_ts"].to_numpy()[caught] - failures["first_alert"].to_numpy()[caught]) / 60_000.0
    detectable = pd.Series(failures["detectable"].to_numpy()[caught], dtype="object").eq(True)
    detectable_leads = lead[detectable.to_numpy()]
    return {
        "threshold": float(threshold),
        "failures": nf,
        "caught": int(caught.sum()),
        "recall_at_budget": float(caught.mean()) if nf else None,
        "precision_at_budget": (n_ep - n_false) / n_ep if n_ep else None,
        "alert_episodes": n_ep,
        "false_alarms": n_false,
        "false_alarms_per_1000_node_days": n_false / node_days * 1000.0 if node_days else 0.0,
        "false_alarms_after_return": total("false_alarms_after_return"),
        "row_recall_at_budget": tp_rows / positive_rows if positive_rows else None,
        "row_precision_at_budget": tp_rows / n_alert_rows if n_alert_rows else None,
        "median_lead_minutes": float(np.median(lead)) if lead.size else None,
        "median_lead_minutes_ci95": median_interval(lead),
        "lead_minutes": sorted(float(x) for x in lead),
        "recall_by_cause": _recall_by(caught, pd.Series(failures["cause"].to_numpy(dtype=object))),
        "recall_by_detectability": _recall_by(
            caught,
            pd.Series(failures["detectable"].to_numpy(), dtype="object")
            .map({True: "detectable", False: "undetectable"})
            .fillna("unknown"),
        ),
        "median_lead_minutes_detectable": (
            float(np.median(detectable_leads)) if detectable_leads.size else None
        ),
        "caught_15_minutes_ahead": int(np.count_nonzero(detectable_leads >= WARNING_MINUTES)),
    }


def _recall_by(caught: np.ndarray, groups: pd.Series) -> dict[str, dict[str, float | int]]:
    out: dict[str, dict[str, float | int]] = {}
    for name, idx in groups.groupby(groups.to_numpy()).groups.items():
        c = caught[np.asarray(groups.index.get_indexer(idx))]
        out[str(name)] = {"failures": int(c.size), "caught": int(c.sum()), "recall": float(c.mean())}
    return out


Parts = Callable[[], Iterable[tuple["EvalRows", np.ndarray]]]
"""Sets of rows with their scores, their nodes apart, handed out anew on each call (a fleet's
month is read back from disk a node group at a time)."""


def sweep(parts: Parts, candidates: np.ndarray, max_rate: float, node_days: float,
          window: int = 1) -> list[tuple[float, float, int]]:
    """``(threshold, false alarms per 1,000 node-days, failures caught)`` on the rows of ``parts``
    at each of ``candidates`` (from the top score down, :func:`candidates_of`), until the rate has
    stayed above ``max_rate`` for 25 candidates in a row (it only grows from there, bar small
    wobbles). ``window`` candidates are judged per pass over the parts: rows read back from disk
    are read once for that many thresholds, at the cost of judging up to ``window - 1`` past the
    stop."""
    out: list[tuple[float, float, int]] = []
    over = 0
    for lo in range(0, candidates.size, window):
        thresholds = [float(t) for t in candidates[lo : lo + window]]
        false_alarms = np.zeros(len(thresholds), dtype=np.int64)
        caught = np.zeros(len(thresholds), dtype=np.int64)
        for rows, score in parts():
            for j, thr in enumerate(thresholds):
                alert = score >= thr
                false_alarms[j] += rows.episodes(alert)[1]
                caught[j] += np.count_nonzero(rows.caught(alert))
        for thr, n_false, n_caught in zip(thresholds, false_alarms, caught, strict=True):
            rate = int(n_false) / node_days * 1000.0 if node_days else 0.0
            out.append((thr, rate, int(n_caught)))
            over = over + 1 if rate > max_rate else 0
            if over >= 25:
                return out
    return out


def rates_caught(points: Sequence[tuple[float, float, int]], failures: int,
                 rates: tuple[float, ...] = EQUAL_RATES) -> dict[str, dict]:
    """Per false-alarm rate: the most failures caught by a threshold of :func:`sweep`'s ``points``
    that keeps false alarms per 1,000 node-days at or under it, the threshold set on *these* rows.

    Not an operating point (nobody can tune on data still to come), but the fair way to set
    predictors side by side on a dataset where their validation thresholds spend different
    budgets: equal false alarms, compare what they catch.
    """
    out: dict[str, dict] = {}
    for cap in rates:  # the most caught; among equals the highest threshold (fewest alerts)
        caught, thr, rate = max(((c, t, r) for t, r, c in points if r <= cap), default=(0, None, 0.0))
        out[f"{cap:g}"] = {"caught": caught, "failures": failures,
                           "recall": caught / failures if failures else None,
                           "false_alarms_per_1000_node_days": rate, "threshold": thr}
    return out


def budget_threshold(
    parts: Parts,
    candidates: np.ndarray,
    node_days: float,
    budget_per_1000_node_days: float,
    confidence: float = BUDGET_CONFIDENCE,
    window: int = 1,
) -> BudgetChoice:
    """The lowest threshold at and above which the false alarms on the rows of ``parts`` (each with
    its scores) keep their upper bound within the budget (the module docstring): ``candidates``
    (:func:`candidates_of_sorted` of every score of ``parts``, from the top down) in turn, then the
    scores between the last one within the budget and the first over it (:func:`_lowest_within`).
    Above every score (no alerts) when the top score is itself a false alarm the budget cannot
    afford.

    The parts are judged as one set of rows of ``node_days`` whose node-days add up; their nodes
    must be apart (no alert episode spans two parts), as the threshold folds' are and a spilled
    node group's are. Judging them part by part spares a copy of every row (the folds of a fleet's
    month hold 60 M). ``window`` thresholds are judged per pass over the parts, so rows read back
    from disk are read once for that many; the choice is the one of judging one at a time."""
    if budget_per_1000_node_days < 0 or node_days <= 0 or not candidates.size:
        raise ValueError("a budget threshold needs a budget >= 0 and scored rows")
    # the most false alarms whose bound is within budget (0 when none is: then not certified)
    allowed = max(0, most_within(budget_per_1000_node_days * node_days / 1000.0, confidence))
    chosen, kept, most = float(np.nextafter(candidates[0], np.inf)), 0, 0  # candidates[0]: the top score
    for lo in range(0, candidates.size, window):
        tried = candidates[lo : lo + window]
        for thr, alarms in zip(tried, _false_alarms(parts, tried), strict=True):
            most = max(most, int(alarms))
            if most > allowed:
                chosen, kept = _lowest_within(parts, float(thr), chosen, kept, allowed, window)
                return _budget_choice(chosen, kept, node_days, budget_per_1000_node_days, confidence)
            chosen, kept = float(thr), most
    return _budget_choice(chosen, kept, node_days, budget_per_1000_node_days, confidence)


def _budget_choice(threshold: float, false_alarms: int, node_days: float, budget: float,
                   confidence: float) -> BudgetChoice:
    bound = poisson_upper_bound(false_alarms, confidence) / node_days * 1000.0
    return BudgetChoice(threshold, float(budget), float(confidence), node_days, false_alarms, bound,
                        bound <= budget)


def _false_alarms(parts: Parts, thresholds: np.ndarray) -> np.ndarray:
    """False-alarm episodes on the rows of ``parts`` at each of ``thresholds``, in one pass."""
    out = np.zeros(len(thresholds), dtype=np.int64)
    for rows, score in parts():
        for j, thr in enumerate(thresholds):
            out[j] += rows.episodes(score >= thr)[1]
    return out


def _lowest_within(parts: Parts, over: float, within: float, kept: int, allowed: int,
                   window: int) -> tuple[float, int]:
    """The lowest score between two neighbouring candidates, ``over`` (its alarms break the budget)
    and ``within`` (they do not), that keeps the budget, with the most false alarms seen on the way:
    a bisection over the distinct scores between them. Deep in the scores the candidates are
    rank-spaced, and two false alarms that enter between neighbours would otherwise leave the
    threshold at the upper one, with fewer alarms than the budget affords and fewer catches. Like
    the candidates, the bisection judges a threshold by the alarms of those it tried above it.

    Each pass over the parts judges every score the next steps of the bisection may try, as many
    steps as ``window`` thresholds cover (one step for 1, five for 31), and the steps then follow
    those counts: the same scores tried as one step a pass would try."""
    between = np.unique(np.concatenate([np.empty(0), *(score[(score > over) & (score < within)]
                                                       for _, score in parts())]))
    depth = max(1, (window + 1).bit_length() - 1)
    lo, hi = -1, between.size  # between[lo] breaks the budget (lo = -1: over), between[hi] keeps it
    while hi - lo > 1:
        probes = _bisection_probes(lo, hi, depth)
        alarms = dict(zip(probes, _false_alarms(parts, between[probes]).tolist(), strict=True))
        for _ in range(depth):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            n = max(kept, alarms[mid])
            if n <= allowed:
                hi, kept = mid, n
            else:
                lo = mid
    return (float(between[hi]) if hi < between.size else within), kept


def _bisection_probes(lo: int, hi: int, depth: int) -> list[int]:
    """The midpoints a bisection of ``(lo, hi)`` may try in its next ``depth`` steps."""
    if depth == 0 or hi - lo <= 1:
        return []
    mid = (lo + hi) // 2
    return [mid, *_bisection_probes(lo, mid, depth - 1), *_bisection_probes(mid, hi, depth - 1)]


def candidates_of(*scores: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """Thresholds to try over the rows of every array of ``scores``, from the top score down
    (:func:`candidates_of_sorted` of a sorted copy of them all)."""
    ordered = np.concatenate(scores)
    ordered.sort()
    return candidates_of_sorted(ordered, block)


def candidates_of_sorted(ordered: np.ndarray, block: int = 1 << 20) -> np.ndarray:
    """Thresholds to try over rows whose scores, sorted, are ``ordered``, from the top score down:
    every distinct score, or ~400 rank-spaced ones (one per rank at the top, where alerts are few).

    Holds a flag per row besides the scores, not every distinct score (a fleet's month has tens
    of millions): the ranks asked for are looked up a block of the sorted scores at a time."""
    new = np.empty(ordered.size, dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    distinct = int(np.count_nonzero(new))
    if distinct <= 400:
        return ordered[new][::-1]
    ranks = np.unique(np.geomspace(1, distinct, 400).astype(int))  # 1 = the top score
    wanted = distinct - ranks  # ascending positions among the distinct scores, from the top rank down
    out = np.empty(wanted.size)
    seen = 0
    for lo in range(0, ordered.size, block):
        firsts = lo + np.flatnonzero(new[lo : lo + block])  # where each distinct score first sits
        mine = (wanted >= seen) & (wanted < seen + firsts.size)
        out[mine] = ordered[firsts[wanted[mine] - seen]]
        seen += firsts.size
    return out


def median_interval(values: np.ndarray, draws: int = 2_000, seed: int = 0) -> list[float] | None:
    """95 % bootstrap interval of the median of ``values`` (None for fewer than two).

    With a few dozen caught failures the median lead moves by minutes from one dataset to the
    next; the interval says by how much. Seeded, so a report is reproducible.
    """
    if values.size < 2:
        return None
    draws_of = np.random.default_rng(seed).choice(values, size=(draws, values.size))
    return [float(x) for x in np.percentile(np.median(draws_of, axis=1), [2.5, 97.5])]
