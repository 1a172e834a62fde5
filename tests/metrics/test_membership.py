"""Membership metrics on hand-computable scores."""

from __future__ import annotations

import numpy as np
import pytest

from fedexp.metrics.membership import METRICS, membership_metrics, tpr_at_fpr


def test_perfectly_separated_scores_are_a_perfect_attack():
    got = membership_metrics(np.array([0.9, 0.8]), np.array([0.1, 0.2]))
    assert got == {key: 1.0 for key in METRICS}


def test_identical_scores_are_chance_and_find_no_member_at_low_fpr():
    got = membership_metrics(np.full(4, 0.7), np.full(4, 0.7))
    # all above 0.5: every member right, every non-member wrong
    assert got["privacy/mia_acc"] == 0.5
    assert got["privacy/mia_auc"] == 0.5
    # the ROC curve is (0, 0) -> (1, 1): no threshold has FPR below 1
    assert got["privacy/mia_tpr@1%fpr"] == 0.0 and got["privacy/mia_tpr@0.1%fpr"] == 0.0


def test_a_small_hand_example():
    members, non_members = np.array([0.9, 0.6, 0.4]), np.array([0.7, 0.3, 0.2])
    got = membership_metrics(members, non_members)
    # member > non-member in 3 + 2 + 2 of 9 pairs
    assert got["privacy/mia_auc"] == pytest.approx(7 / 9, abs=1e-12)
    # > 0.5: members 0.9, 0.6 right; <= 0.5: non-members 0.3, 0.2 right
    assert got["privacy/mia_acc"] == pytest.approx(4 / 6, abs=1e-12)
    # above 0.7 only the member 0.9 (FPR 0); the next threshold already costs FPR 1/3
    assert got["privacy/mia_tpr@1%fpr"] == pytest.approx(1 / 3, abs=1e-12)
    assert got["privacy/mia_tpr@0.1%fpr"] == pytest.approx(1 / 3, abs=1e-12)
    labels, scores = np.r_[1, 1, 1, 0, 0, 0], np.r_[members, non_members]
    # conservative: the largest TPR among the points with FPR <= the target, never interpolated
    # (descending: 0.9 m, 0.7 n, 0.6 m, 0.4 m, 0.3 n, 0.2 n; at 0.4 TPR 1, FPR 1/3)
    assert tpr_at_fpr(labels, scores, 0.33) == pytest.approx(1 / 3, abs=1e-12)
    assert tpr_at_fpr(labels, scores, 1 / 3) == 1.0
    assert tpr_at_fpr(labels, scores, 0.0) == pytest.approx(1 / 3, abs=1e-12)


def test_tied_scores_count_half_in_the_auc():
    got = membership_metrics(np.array([0.8, 0.5]), np.array([0.5, 0.1]))
    assert got["privacy/mia_auc"] == pytest.approx(3.5 / 4, abs=1e-12)
    assert got["privacy/mia_acc"] == pytest.approx(3 / 4, abs=1e-12)  # 0.5 is not > 0.5


def test_empty_sets_are_refused():
    with pytest.raises(ValueError, match="at least one member"):
        membership_metrics(np.array([]), np.array([0.3]))
