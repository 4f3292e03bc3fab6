"""The risk board ranks nodes by their latest score, whatever changed it since the last ranking."""

from foreshock.ingest.contract import RiskScore
from foreshock.predictor.scoring import RiskBoard


def score(node: str, ts: int, p: float) -> RiskScore:
    return RiskScore(node=node, ts=ts, probability=p, alert=p > 0.5, threshold=0.5, model_version="1")


def ranked(board: RiskBoard) -> list[str]:
    return [s.node for s in board.latest()]


def test_every_change_is_seen_by_the_next_ranking():
    board = RiskBoard(history=3)
    board.record([score("a", 1, 0.2), score("b", 1, 0.7), score("c", 1, 0.2)])
    assert ranked(board) == ["b", "a", "c"]  # ties by node id
    board.record([score("a", 2, 0.9), score("b", 2, 0.1)])
    assert ranked(board) == ["a", "c", "b"]
    board.record([score("c", 1, 0.99)])  # older than what is held: ignored
    assert ranked(board) == ["a", "c", "b"]
    saved = board.export(["a"])
    board.forget(["a"])
    assert ranked(board) == ["c", "b"]
    board.restore(saved)
    assert ranked(board) == ["a", "c", "b"]
    latest, past = board.node("a")
    assert latest.probability == 0.9 and [t for t, _, _ in past] == [1, 2]
