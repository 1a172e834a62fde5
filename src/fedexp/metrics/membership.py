"""Membership-inference metrics: how well membership scores separate members from non-members.

Pure measurements over scores; the audit that produces the scores is `fedexp.audit.mia`.

  `privacy/mia_acc`: accuracy of "member iff score > 0.5" on a balanced set (0.5 = chance).
  `privacy/mia_auc`: ROC AUC of the scores (0.5 = chance; ties count half).
  `privacy/mia_tpr@1%fpr`, `privacy/mia_tpr@0.1%fpr`: TPR at a low FPR (Carlini et al., S&P 2022),
  read off the ROC curve conservatively: the largest TPR among its points with FPR <= the target.
"""

from __future__ import annotations

import numpy as np

LOW_FPRS = {"privacy/mia_tpr@1%fpr": 0.01, "privacy/mia_tpr@0.1%fpr": 0.001}
METRICS = ("privacy/mia_acc", "privacy/mia_auc", *LOW_FPRS)


def tpr_at_fpr(labels: np.ndarray, scores: np.ndarray, max_fpr: float) -> float:
    """The largest TPR among the ROC curve's points with FPR <= `max_fpr` (no interpolation up:
    a target below the curve's first FPR step gives the TPR at FPR 0)."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return float(tpr[fpr <= max_fpr].max())  # (0, 0) is always on the curve


def membership_metrics(members: np.ndarray, non_members: np.ndarray) -> dict[str, float]:
    """Accuracy (threshold 0.5), ROC AUC and TPR at 1% / 0.1% FPR of membership scores.

    Args:
        members: scores of samples the model was trained on.
        non_members: scores of samples it was not; the same count as `members` for the accuracy
            to read as balanced (0.5 = chance).
    """
    from sklearn.metrics import roc_auc_score

    if len(members) == 0 or len(non_members) == 0:
        raise ValueError("membership metrics need at least one member and one non-member")
    labels = np.r_[np.ones(len(members)), np.zeros(len(non_members))]
    scores = np.r_[members, non_members].astype(float)
    hits = (members > 0.5).sum() + (non_members <= 0.5).sum()
    out = {
        "privacy/mia_acc": float(hits / len(scores)),
        "privacy/mia_auc": float(roc_auc_score(labels, scores)),
    }
    out.update({key: tpr_at_fpr(labels, scores, fpr) for key, fpr in LOW_FPRS.items()})
    return out
