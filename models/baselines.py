"""The baselines the model must beat on the same rows: health-checker rules and logistic regression.

**Rules**, in the style of today's node-health checkers (NVSentinel, DCGM health checks): a
node is bad when, within the last ``window_ms``, it logged a critical Xid (NVSentinel severity
FATAL in the project's Xid catalogue) or its uncorrectable-ECC counters rose; it is suspect in
proportion to its single-bit ECC rate. Their score is 1.0 for "bad" and ``0.99 * r / (1 + r)``
for an SBE rate of ``r`` per minute otherwise, so one threshold on the score is the rule set with
an SBE-rate threshold, and the budget threshold tunes that rate like the model's threshold.
The rules read raw telemetry (not the model's features), the way the checkers do.

**Logistic regression** on the model's own features (median imputation, standardisation,
balanced class weights), stored as plain numbers so it travels in JSON beside the model.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from threadpoolctl import ThreadpoolController

from foreshock.features.buckets import counter_increases
from foreshock.features.table import FeatureTable
from foreshock.ingest.dataset import part_paths, row_groups
from foreshock.models.labels import node_codes

__all__ = ["CRITICAL_XIDS", "RULE_COLUMNS", "RuleEvidence", "rule_inputs", "rule_scores", "LogisticBaseline",
           "one_blas_thread"]

# NVSentinel severity FATAL in reference/xid_catalog.csv (NVIDIA/NVSentinel xiderrorsmapping.csv).
CRITICAL_XIDS = frozenset(
    {
        46,
        48,
        61,
        62,
        64,
        74,
        79,
        95,
        109,
        110,
        119,
        120,
        136,
        140,
        143,
        144,
        145,
        146,
        147,
        148,
        149,
        150,
        155,
        156,
        158,
    }
)
UNCORRECTABLE_COUNTERS = ("ecc_dbe_vol_total", "uncorrectable_remapped_rows", "retired_dbe")
SBE_COUNTER = "ecc_sbe_vol_total"
RULE_COLUMNS = ("rule_critical", "rule_sbe_per_min")
# what the evidence a feature table keeps was read by: evidence of other rules is read afresh
_EVIDENCE_KEY = hashlib.sha256(
    repr((sorted(CRITICAL_XIDS), UNCORRECTABLE_COUNTERS, SBE_COUNTER)).encode()
).hexdigest()[:12]
SBE_REFERENCE_PER_MIN = 1.0
# rows standardised at once by LogisticBaseline: 6.5 MB of float64 for 101 features, so that its
# passes over a block stay in the processor's cache; a multiple of 8, so that BLAS rounds every
# row as it would in one block
_BLOCK_ROWS = 1 << 13
_FRAME_BLOCK_ROWS = 1 << 16  # rows of a frame taken to a matrix at once: 53 MB of float64


def one_blas_thread() -> AbstractContextManager[object]:
    """BLAS on one thread inside the ``with`` block. A product split among threads sums in
    another order, and its last bit changes with the machine's cores; the logistic fit (lbfgs
    stopped at its iteration budget) carries that into its coefficients, and the trees boosted
    from its log-odds and the alert threshold chosen on them follow: a 2-core machine trained
    another threshold than the same command pinned to one core. On one thread the same data
    gives the same model on any number of cores. The limit holds for the whole process while the
    block runs (BLAS keeps one setting), so other threads' products run on one thread meanwhile."""
    return _blas_controller().limit(limits=1, user_api="blas")


@cache
def _blas_controller() -> ThreadpoolController:
    """The process's BLAS libraries, found once: finding them walks every loaded library, and a
    training run limits BLAS a few hundred times (once per scored block). scikit-learn's solvers
    are imported first, so that the BLAS of SciPy is loaded and found beside NumPy's."""
    import sklearn.linear_model  # noqa: F401

    return ThreadpoolController()


def _bucket(ts: np.ndarray, cadence_ms: int) -> np.ndarray:
    """First cadence tick at or after ``ts``: data stamped ``ts`` is visible to rows at that tick."""
    return -(-ts // cadence_ms) * cadence_ms


def _gpu_increments(data_dir: Path, cadence_ms: int) -> pd.DataFrame:
    """Per (node, bucket) with an increase: increases of the uncorrectable and SBE counters,
    summed over GPUs (buckets with none are left out: they are nearly all of a fleet's rows).

    Reads the GPU table a row group at a time (its rows in time order: a part's rows are sorted
    by time and its row groups follow each other); the increases follow the feature engines' rule
    (:func:`foreshock.features.buckets.counter_increases`), each GPU's last value carried from one
    row group to the next: the float64 working arrays of a whole part's million rows would
    outweigh everything else ``features`` holds on a small fleet."""
    counters = (*UNCORRECTABLE_COUNTERS, SBE_COUNTER)
    node_ids: dict[str, int] = {}
    rose_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    carry = np.empty((0, 0, len(counters)))
    for df, present in _gpu_counter_groups(data_dir, counters):
        codes, uniques = pd.factorize(df["node"])  # a category column: no string per row
        ids = np.array([node_ids.setdefault(str(u), len(node_ids)) for u in uniques], dtype=np.int64)
        node = ids[codes]
        vals = np.stack(
            [df[c].to_numpy(dtype="float64", na_value=np.nan) if c in present else np.full(len(df), np.nan)
             for c in counters]
        )
        inc, carry = counter_increases(vals, node, df["gpu"].to_numpy(dtype=np.int64), carry)
        uncorrectable, sbe = inc[: len(UNCORRECTABLE_COUNTERS)].sum(axis=0), inc[-1]
        # a window sum reads only the increases: the rows without one, nearly all, are left out
        rose = (uncorrectable != 0) | (sbe != 0)
        ts = _bucket(df["ts"].to_numpy(dtype=np.int64)[rose], cadence_ms)
        rose_rows.append((node[rose], ts, uncorrectable[rose], sbe[rose]))
    if not rose_rows:
        return pd.DataFrame({"node": pd.Series(dtype=str), "ts": [], "uncorrectable": [], "sbe": []})
    nid, ts, uncorrectable, sbe = (np.concatenate(column) for column in zip(*rose_rows, strict=True))
    agg = (
        pd.DataFrame({"nid": nid, "ts": ts, "uncorrectable": uncorrectable, "sbe": sbe})
        .groupby(["nid", "ts"], as_index=False)
        .sum()
        .query("uncorrectable != 0 or sbe != 0")  # increases that cancel (a negative count) are none
    )
    names = np.array(list(node_ids), dtype=object)
    return agg.assign(node=names[agg["nid"].to_numpy()]).drop(columns="nid").reset_index(drop=True)


def _gpu_counter_groups(
    data_dir: Path, counters: tuple[str, ...]
) -> Iterator[tuple[pd.DataFrame, list[str]]]:
    """The GPU table's row groups in time order (node, ts, gpu and the ``counters`` its part
    holds), with those counters' names; parts that hold none of them are skipped."""
    for group in row_groups(data_dir, "gpu", ["node", "ts", "gpu", *counters], dictionary=["node"],
                            any_of=counters):
        if not group.num_rows:
            continue
        present = [c for c in counters if c in group.column_names]
        df = group.to_pandas()
        ts = df["ts"].to_numpy(dtype=np.int64)
        if (ts[1:] < ts[:-1]).any():  # a part out of the layout's time order: this group put in it
            df = df.iloc[np.argsort(ts, kind="stable")]
        yield df, present


def _critical_xids(data_dir: Path, cadence_ms: int) -> pd.DataFrame:
    parts = [
        pq.read_table(p, columns=["node", "ts", "xid", "count"]).to_pandas()
        for p in part_paths(data_dir, "xid")
    ]
    xid = (
        pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["node", "ts", "xid", "count"])
    )
    xid = xid[xid["xid"].isin(CRITICAL_XIDS)]
    return (
        pd.DataFrame(
            {
                "node": xid["node"].astype(str),
                "ts": _bucket(xid["ts"].to_numpy(dtype=np.int64), cadence_ms),
                "critical": xid["count"].fillna(1).to_numpy(dtype="float64"),
            }
        )
        .groupby(["node", "ts"], as_index=False)
        .sum()
    )


_TS_BITS = 42  # a bucket's key: its node's code above its ts (epoch ms, under 2**42: year 2109)


@dataclass(frozen=True)
class _WindowSums:
    """A series of buckets (node, ts and counts) sorted by (node, ts) once, with each count's
    running sum: any rows' window sums are then a search into it, without coding every bucket's
    node again for each block of rows (a fleet's month: hundreds of thousands of buckets, thousands
    of blocks)."""

    names: pd.Index
    key: np.ndarray
    running: dict[str, np.ndarray]

    @classmethod
    def of(cls, series: pd.DataFrame, columns: tuple[str, ...]) -> _WindowSums:
        code, names = node_codes(series["node"])
        ts = series["ts"].to_numpy(np.int64)
        if ts.size and (ts.min() < 0 or ts.max() >= 1 << _TS_BITS):
            raise ValueError("rule evidence timestamps must be epoch milliseconds before 2109")
        key = (code << _TS_BITS) + ts
        order = np.argsort(key, kind="stable")
        running = {c: np.concatenate([[0.0], np.cumsum(series[c].to_numpy(dtype="float64")[order])])
                   for c in columns}
        return cls(names, key[order], running)

    def sums(self, node: np.ndarray, names: pd.Index, ts: np.ndarray, column: str,
             window_ms: int) -> np.ndarray:
        """For each row (``node``, a code into ``names``, at ``ts``): the sum of ``column`` over
        the node's buckets in ``(t - window_ms, t]``. The counts are whole numbers, so the running
        sums' differences are exact."""
        out = np.zeros(len(ts))
        code = self.names.get_indexer(names)[node] if len(names) else np.zeros(0, dtype=np.int64)
        has = np.flatnonzero(code >= 0)
        if not has.size:
            return out
        base = code[has].astype(np.int64) << _TS_BITS
        hi = np.searchsorted(self.key, base + ts[has], side="right")
        lo = np.searchsorted(self.key, base + ts[has] - window_ms, side="right")  # under 0: the node's first
        running = self.running[column]
        out[has] = running[hi] - running[lo]
        return out


@dataclass(frozen=True)
class RuleEvidence:
    """What the rules read of a dataset's raw telemetry, read once (:meth:`read`): the buckets
    with an increase of the uncorrectable or SBE counters, and the critical Xids. :meth:`of`
    gives any rows their evidence, so a frame's rows can be given it a day at a time."""

    gpu: pd.DataFrame  # node, ts (bucket), uncorrectable, sbe
    xid: pd.DataFrame  # node, ts (bucket), critical
    window_ms: int = 600_000

    @classmethod
    def read(cls, data_dir: str | Path, cadence_ms: int, window_ms: int = 600_000) -> RuleEvidence:
        data_dir = Path(data_dir)
        return cls(_gpu_increments(data_dir, cadence_ms), _critical_xids(data_dir, cadence_ms), window_ms)

    def attach_to(self, table: FeatureTable) -> None:
        """Keep this evidence with the feature table of the same dataset (read at the table's
        cadence): ``train`` and ``evaluate`` then read it back (:meth:`of_table`) instead of
        scanning the raw GPU table again."""
        table.attach(f"rules-{_EVIDENCE_KEY}-gpu", self.gpu)
        table.attach(f"rules-{_EVIDENCE_KEY}-xid", self.xid)

    @classmethod
    def of_table(cls, table: FeatureTable, data_dir: str | Path, window_ms: int = 600_000) -> RuleEvidence:
        """The evidence kept with ``table`` (:meth:`attach_to`), or read from the raw telemetry of
        ``data_dir``, the table's dataset, when it holds none of these rules' definition."""
        gpu, xid = (table.attached(f"rules-{_EVIDENCE_KEY}-{kind}") for kind in ("gpu", "xid"))
        if gpu is None or xid is None:
            return cls.read(data_dir, table.identity.cadence_ms, window_ms)
        return cls(gpu, xid, window_ms)

    @cached_property
    def _sums(self) -> tuple[_WindowSums, _WindowSums]:
        return _WindowSums.of(self.gpu, ("uncorrectable", "sbe")), _WindowSums.of(self.xid, ("critical",))

    def of(self, rows: pd.DataFrame) -> pd.DataFrame:
        """``rule_critical`` (critical Xids plus uncorrectable-ECC increases in the window) and
        ``rule_sbe_per_min`` (single-bit ECC increase per minute over the window) of each row of
        ``rows`` (node, ts), from raw telemetry at or before ts. Both are float32, half the bytes
        in a frame of a fleet's month: the count exact to 16 M, the rate to seven digits, which
        rounds each rate alike and so keeps the rules' ranking."""
        w = self.window_ms
        node, names = node_codes(rows["node"])
        ts = rows["ts"].to_numpy(np.int64)
        gpu, xid = self._sums
        critical = xid.sums(node, names, ts, "critical", w)
        critical = (critical + gpu.sums(node, names, ts, "uncorrectable", w)).astype(np.float32)
        sbe = (gpu.sums(node, names, ts, "sbe", w) / (w / 60_000)).astype(np.float32)
        return pd.DataFrame({"rule_critical": critical, "rule_sbe_per_min": sbe}, index=rows.index)


def rule_inputs(
    data_dir: str | Path, rows: pd.DataFrame, cadence_ms: int, window_ms: int = 600_000
) -> pd.DataFrame:
    """The rules' evidence for each row of ``rows`` (node, ts): :meth:`RuleEvidence.of`."""
    return RuleEvidence.read(data_dir, cadence_ms, window_ms).of(rows)


def rule_scores(frame: pd.DataFrame) -> np.ndarray:
    """Rule score per row from :func:`rule_inputs` columns (see the module docstring)."""
    r = frame["rule_sbe_per_min"].to_numpy(dtype="float64") / SBE_REFERENCE_PER_MIN
    soft = 0.99 * r / (1.0 + r)
    return np.where(frame["rule_critical"].to_numpy(dtype="float64") > 0, 1.0, soft)


class LogisticBaseline:
    """Logistic regression on the model's features; fitted state is plain numbers (JSON-safe)."""

    def __init__(self, feature_names: list[str], max_rows: int = 100_000, seed: int = 0) -> None:
        self.feature_names = list(feature_names)
        self.max_rows = max_rows
        self.seed = seed

    def matrix(self, frame: pd.DataFrame) -> np.ndarray:
        """The frame's features in ``feature_names`` order; infinities become missing values.
        Column-major whatever the frame's own layout: the fit (lbfgs stops at ``max_iter`` before
        it has converged) and every product with the coefficients round by the layout, and the
        same rows must give the same model and scores however they were read (so
        :meth:`log_odds` makes any matrix column-major too)."""
        x = frame[self.feature_names].to_numpy(dtype=np.float64, na_value=np.nan)
        return np.asfortranarray(np.where(np.isfinite(x), x, np.nan))

    def rows_fitted(self, n: int) -> np.ndarray:
        """Which of ``n`` training rows :meth:`fit` fits on, in the order it takes them: a seeded
        draw of ``max_rows`` of them, or all. A caller that reads the rows' features only for the
        fit reads those of these rows alone: the features of every training row are gigabytes."""
        if n <= self.max_rows:
            return np.arange(n)
        return np.random.default_rng(self.seed).choice(n, self.max_rows, replace=False)

    def fit(self, frame: pd.DataFrame, y: np.ndarray) -> LogisticBaseline:
        """Fit on (a seeded subsample of at most ``max_rows`` of) the training rows
        (:meth:`rows_fitted`)."""
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        if len(frame) > self.max_rows:  # rows first: the float64 matrix of every row would be gigabytes
            keep = self.rows_fitted(len(frame))
            frame, y = frame.iloc[keep], np.asarray(y)[keep]
        x = self.matrix(frame)
        median = np.nanmedian(np.where(np.isnan(x).all(axis=0), 0.0, x), axis=0)
        x = np.where(np.isnan(x), median, x)
        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale[scale == 0] = 1.0
        clf = LogisticRegression(class_weight="balanced", max_iter=200, C=1.0)
        with warnings.catch_warnings(), one_blas_thread():
            # the fixed iteration budget is the recipe (see :meth:`matrix`): where lbfgs reaches
            # it unconverged (it does on a fleet's month) the fit is the one intended, not a fault
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit((x - mean) / scale, y)
        self.median_, self.mean_, self.scale_ = median, mean, scale
        self.coef_, self.intercept_ = clf.coef_[0], float(clf.intercept_[0])
        return self

    def _standardised(self, x: np.ndarray) -> np.ndarray:
        """``x`` standardised, missing and infinite values imputed with the median: one float64
        copy, column-major (see :meth:`matrix`), worked on in place; scoring a fleet's rows spends
        its time here, so a block is small enough (:data:`_BLOCK_ROWS`) for these passes over it to
        stay in the processor's cache."""
        z = np.array(x, dtype=np.float64, order="F")
        np.copyto(z, np.broadcast_to(self.median_, z.shape), where=~np.isfinite(z))
        z -= self.mean_
        z /= self.scale_
        return z

    def terms(self, x: np.ndarray) -> np.ndarray:
        """Each feature's share of the log-odds for a matrix in ``feature_names`` order: rows x
        features, summing with ``intercept_`` to :meth:`log_odds`. The standardised inputs average
        zero on the fitted rows, so these are the linear model's SHAP values and ``intercept_`` its
        expected log-odds there."""
        return self._standardised(x) * self.coef_

    def log_odds(self, x: np.ndarray) -> np.ndarray:
        """The fitted log-odds for a matrix in ``feature_names`` order (missing values imputed),
        a block of rows at a time: standardising makes copies, and a training matrix is gigabytes."""
        out = np.empty(len(x))
        with one_blas_thread():
            for i in range(0, len(x), _BLOCK_ROWS):
                out[i : i + _BLOCK_ROWS] = self._standardised(x[i : i + _BLOCK_ROWS]) @ self.coef_
        return out + self.intercept_

    def frame_log_odds(self, frame: pd.DataFrame) -> np.ndarray:
        """:meth:`log_odds` of a frame's rows, a block at a time (its float64 matrix is never whole)."""
        out = np.empty(len(frame))
        for i in range(0, len(frame), _FRAME_BLOCK_ROWS):
            block = frame.iloc[i : i + _FRAME_BLOCK_ROWS][self.feature_names]
            out[i : i + _FRAME_BLOCK_ROWS] = self.log_odds(block.to_numpy(dtype=np.float64, na_value=np.nan))
        return out

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """Probability-like score (not calibrated: class weights shift it; ranking is what counts)."""
        return self.probability(self.frame_log_odds(frame))

    @staticmethod
    def probability(log_odds: np.ndarray) -> np.ndarray:
        """:meth:`score` of rows whose :meth:`log_odds` are known."""
        return 1.0 / (1.0 + np.exp(-np.clip(log_odds, -500, 500)))

    def to_json(self) -> dict[str, Any]:
        return {
            "feature_names": self.feature_names,
            "median": self.median_.tolist(),
            "mean": self.mean_.tolist(),
            "scale": self.scale_.tolist(),
            "coef": self.coef_.tolist(),
            "intercept": self.intercept_,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LogisticBaseline:
        out = cls(data["feature_names"])
        out.median_, out.mean_, out.scale_ = (
            np.asarray(data[k], dtype=np.float64) for k in ("median", "mean", "scale")
        )
        out.coef_, out.intercept_ = np.asarray(data["coef"], dtype=np.float64), float(data["intercept"])
        return out
