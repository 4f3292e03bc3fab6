"""PR-AUC, ROC-AUC and the precision-recall curve of a score, a block of rows at a time.

scikit-learn's ``average_precision_score``, ``roc_auc_score`` and ``precision_recall_curve`` sort
every row and keep several arrays of the row count (order, sorted scores, cumulative counts,
precision, recall, thresholds): about 70 bytes a row, 6 GB on a fleet's month of 88 M rows,
where the rows themselves hold about 50. Failures are rare, so the positive rows are few, and
every one of these figures is a function of counts at the *positive* rows' distinct scores: how
many rows score at or above each one, and how many strictly above. :class:`Ranking` gathers
those counts block by block with a binary search into the sorted positive scores, so memory
holds the positives and one block, and gives the same figures as scikit-learn (ties and sample
weights included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["Ranking", "average_precision"]

_BLOCK = 1 << 20


@dataclass(frozen=True)
class Ranking:
    """Weighted row counts at the distinct scores of the positive rows (``values``, ascending).

    ``positive[j]``: weight of the positive rows scoring ``values[j]``; ``at_or_above[j]`` and
    ``above[j]``: weight of all rows scoring ``>= values[j]`` and ``> values[j]``; ``rows``: of
    all rows;
    ``negative_pairs``: over negative rows, the weight of positives scoring above each one plus
    half of those tied with it (the Mann-Whitney statistic, weighted)."""

    values: np.ndarray
    positive: np.ndarray
    at_or_above: np.ndarray
    above: np.ndarray
    rows: float
    negatives: float
    negative_pairs: float

    @classmethod
    def of(cls, label: np.ndarray, score: np.ndarray, weight: np.ndarray | None = None,
           block: int = _BLOCK) -> Ranking:
        """Count ``score`` against ``label`` (1 = positive), a block of ``block`` rows at a time."""
        label, score = np.asarray(label), np.asarray(score)
        if label.shape != score.shape or (weight is not None and np.shape(weight) != score.shape):
            raise ValueError("label, score and weight need one value per row")
        is_pos = label == 1
        positive_weight = None if weight is None else np.asarray(weight)[is_pos]
        return cls.of_parts(score[is_pos], positive_weight, lambda: [(label, score, weight)], block)

    @classmethod
    def of_parts(cls, positive_score: np.ndarray, positive_weight: np.ndarray | None,
                 parts: Callable[[], Iterable[tuple[np.ndarray, np.ndarray, np.ndarray | None]]],
                 block: int = _BLOCK) -> Ranking:
        """Count the rows of ``parts`` (``(label, score, weight)`` arrays; weight None for
        unweighted rows), whose positive rows score ``positive_score`` (weighing ``positive_weight``):
        rows held a part at a time, a fleet's month read back from disk a node group at a time."""
        if not positive_score.size:
            raise ValueError("no positive row to rank")
        values, inverse = np.unique(positive_score, return_inverse=True)
        k = values.size
        positive = np.bincount(inverse, positive_weight, minlength=k)
        del inverse
        at_index = np.zeros(k + 1)  # all rows by how many positive values lie at or under their score
        tied = np.zeros(k)  # all rows by the positive value their score equals
        neg_at_index, neg_tied = np.zeros(k + 1), np.zeros(k)
        for label, score, weight in parts():
            for lo in range(0, score.size, block):
                s = score[lo : lo + block]
                w = None if weight is None else np.asarray(weight[lo : lo + block], dtype=np.float64)
                neg = label[lo : lo + block] != 1
                i = np.searchsorted(values, s, side="right")
                eq = i > 0
                eq[eq] = values[i[eq] - 1] == s[eq]
                at_index += np.bincount(i, w, minlength=k + 1)
                tied += np.bincount(i[eq] - 1, None if w is None else w[eq], minlength=k)
                neg_at_index += np.bincount(i[neg], None if w is None else w[neg], minlength=k + 1)
                neg_tied += np.bincount(i[eq & neg] - 1, None if w is None else w[eq & neg], minlength=k)
        at_or_above = np.cumsum(at_index[::-1])[::-1][1:]  # index i > j: score >= values[j]
        positive_from = np.r_[np.cumsum(positive[::-1])[::-1], 0.0]  # weight of positives >= values[i]
        pairs = float(neg_at_index @ positive_from + 0.5 * (neg_tied @ positive))
        return cls(values, positive, at_or_above, at_or_above - tied, float(at_index.sum()),
                   float(neg_at_index.sum()), pairs)

    @property
    def positives(self) -> float:
        return float(self.positive.sum())

    def _true_at_or_above(self) -> np.ndarray:
        return np.cumsum(self.positive[::-1])[::-1]

    def average_precision(self) -> float:
        """Precision at each positive score, weighted by the recall it adds (scikit-learn's
        ``average_precision_score``)."""
        return float(np.sum(self.positive / self.positives * self._true_at_or_above() / self.at_or_above))

    def roc_auc(self) -> float:
        """Area under the ROC curve: the chance a positive outscores a negative, ties counted half
        (scikit-learn's ``roc_auc_score``)."""
        return self.negative_pairs / (self.positives * self.negatives)

    def precision_recall(self) -> tuple[np.ndarray, np.ndarray]:
        """``(precision, recall)`` with thresholds ascending, then (1, 0), as scikit-learn's
        ``precision_recall_curve`` orders them, but only its corners: where recall stands still
        (thresholds between two positive scores, under the lowest, over the highest) its first and
        last point. A step plot of these draws the same line as one of every threshold."""
        true = self._true_at_or_above()
        recall = true / self.positives
        precision = true / self.at_or_above
        # just above values[j]: the recall of values[j + 1], precision over the rows above values[j]
        drop = true[1:] / self.above[:-1]
        order_p = np.empty(2 * self.values.size - 1)
        order_r = np.empty_like(order_p)
        order_p[0::2], order_r[0::2] = precision, recall
        order_p[1::2], order_r[1::2] = drop, recall[1:]
        # every row (recall 1), ..., and over the top positive score precision 0 as scikit-learn has it
        top = [0.0] if self.above[-1] > 0 else []
        return (np.r_[self.positives / self.rows, order_p, top, 1.0],
                np.r_[1.0, order_r, top, 0.0])


def average_precision(label: np.ndarray, score: np.ndarray, weight: np.ndarray | None = None) -> float:
    """PR-AUC of ``score`` (scikit-learn's ``average_precision_score``, in bounded memory)."""
    return Ranking.of(label, score, weight).average_precision()
