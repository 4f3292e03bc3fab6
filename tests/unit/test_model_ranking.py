"""The block-wise ranking figures equal scikit-learn's on rows with ties, weights and negatives
scored above every positive, whatever the block size."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from foreshock.models.ranking import Ranking


def _rows(n: int, ties: bool, weighted: bool, negatives_on_top: bool, seed: int):
    rng = np.random.default_rng(seed)
    label = (rng.random(n) < 0.05).astype(np.int8)
    score = rng.random(n) + 0.3 * label
    if ties:
        score = np.round(score, 2)
    if negatives_on_top:
        score[np.flatnonzero(label == 0)[:3]] = 5.0
    weight = rng.random(n) * 3 if weighted else None
    return label, score, weight


CASES = [(3_000, False, False, False), (5_000, True, False, False), (20_000, True, True, False),
         (3_000, False, True, True), (500, True, False, True)]


@pytest.mark.parametrize(("n", "ties", "weighted", "on_top"), CASES)
@pytest.mark.parametrize("block", [97, 1 << 20])
def test_pr_auc_and_roc_auc_equal_scikit_learn(n, ties, weighted, on_top, block):
    label, score, weight = _rows(n, ties, weighted, on_top, seed=n)
    ranking = Ranking.of(label, score, weight, block=block)
    assert ranking.average_precision() == pytest.approx(
        average_precision_score(label, score, sample_weight=weight), rel=1e-12)
    assert ranking.roc_auc() == pytest.approx(roc_auc_score(label, score, sample_weight=weight), rel=1e-12)


def _corners(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    """The points a step plot turns at: of each run of equal recall its first and last point,
    repeated points once."""
    same = lambda a, b: np.isclose(a, b, rtol=1e-12, atol=0)  # noqa: E731
    inside = np.zeros(recall.size, dtype=bool)
    inside[1:-1] = same(recall[1:-1], recall[:-2]) & same(recall[1:-1], recall[2:])
    p, r = precision[~inside], recall[~inside]
    repeat = np.r_[False, same(p[1:], p[:-1]) & same(r[1:], r[:-1])]
    return np.c_[p[~repeat], r[~repeat]]


@pytest.mark.parametrize(("n", "ties", "weighted", "on_top"), CASES)
def test_the_curve_has_every_corner_of_scikit_learns_curve(n, ties, weighted, on_top):
    label, score, weight = _rows(n, ties, weighted, on_top, seed=n + 1)
    precision, recall, _ = precision_recall_curve(label, score, sample_weight=weight)
    ours = Ranking.of(label, score, weight, block=101).precision_recall()
    if not ties:  # corners only, not a point per distinct score
        assert ours[0].size < precision.size / 5
    np.testing.assert_allclose(_corners(*ours), _corners(precision, recall), rtol=1e-12)


def test_rows_without_a_positive_have_no_ranking():
    with pytest.raises(ValueError, match="no positive row"):
        Ranking.of(np.zeros(10, dtype=np.int8), np.linspace(0, 1, 10))
