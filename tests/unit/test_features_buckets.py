"""Counter increases when some counters are never reported (a GPU that lacks them)."""

import numpy as np

from foreshock.features.buckets import _increases, _Runs


def test_unreported_counters_add_nothing_and_keep_their_carry():
    node = np.array([0, 0, 1, 1, 0])
    member = np.array([0, 0, 0, 0, 1])
    reported = np.array([5.0, 7.0, 1.0, 0.5, 3.0])  # node 1 resets (1 -> 0.5)
    vals = np.stack([reported, np.full(5, np.nan), reported * 2])
    carry = np.full((2, 2, 3), np.nan)
    carry[0, 0] = [4.0, 9.0, 8.0]
    got = _increases(vals, _Runs.of(node, member), carry)

    alone = np.full((2, 2, 2), np.nan)
    alone[0, 0] = [4.0, 8.0]
    want = _increases(vals[[0, 2]], _Runs.of(node, member), alone)
    np.testing.assert_array_equal(got[[0, 2]], want)
    np.testing.assert_array_equal(got[1], np.zeros(5))
    np.testing.assert_array_equal(carry[:, :, [0, 2]], alone)  # the reported ones moved on
    assert carry[0, 0, 1] == 9.0 and np.isnan(carry[1, 0, 1])  # the unreported one did not
    np.testing.assert_array_equal(got[0], [1.0, 2.0, 0.0, 0.5, 0.0])
