"""Membership-inference audit (`privacy=mia`): a shadow-model attack in the style of Shokri et al.
(S&P 2017) on the model an eavesdropper rebuilds from one client's upload.

Threat model. The eavesdropper sees a round's broadcast and one client's upload, and rebuilds what
it can from them (`Algorithm.eavesdropped_model`: FedAvg's full local model, WAFFLe's dictionary
without the client's factor selection b, heterogeneous FedHeNN's uploaded weights). It holds its own
data from the task's distribution (the pooled server test set, which no client trains on) and knows
the protocol, so its k shadow models are the algorithm's own client training, run from the same
broadcast on an "in" set drawn from its data, and rebuilt from their uploads exactly as the target
will be. As in Shokri et al., the shadows' data follows the target's training distribution: by
default (`shadow_data: target`) each target gets its own k shadows whose disjoint in / out sets have
the label histogram of that client's training set (under a non-iid split a client's model is far
more confident than one trained on the pool's label mix; shadows on the pool's mix put every target
feature outside the range the attack was fitted on, and a tree ensemble then scores them all alike).
`shadow_data: pool` draws one set of shadows from the pool's own mix for all targets. An attack
classifier learns in/out from the shadows' output vectors; its membership probability is the score
of each of m of the client's training samples (members) and m of its local test split (non-members).

Metrics (`fedexp.metrics.membership`), each the mean over the audited targets:
  `privacy/mia_acc`: accuracy of "member iff score > 0.5" on the balanced set (0.5 = chance).
  `privacy/mia_auc`: ROC AUC of the scores (0.5 = chance; ties count half).
  `privacy/mia_tpr@1%fpr`, `privacy/mia_tpr@0.1%fpr`: TPR at a low FPR (Carlini et al., S&P 2022),
  read off the ROC curve conservatively: the largest TPR among its points with FPR <= the target.
  With m non-members the curve's FPR moves in steps of 1/m, so below 1/m this is the TPR at FPR 0
  (members scored above every non-member): a lower bound the sample size cannot refine.

The target's upload is produced by running that client's local training once more from the
current global state (as in the next round). The audit trains inside
`fedexp.core.client_loop.no_trace`: the store entries of the audited clients (targets and
shadows) and torch's global RNG (CPU and the training device) are restored afterwards, so the
audit never changes the run it observes; only those entries are read, so a spilling store keeps
its memory budget.

Where a client starts its local training from more than the broadcast (heterogeneous FedHeNN:
its own architecture and weights), `Algorithm.prepare_shadow` gives each shadow its target's
starting point as the eavesdropper knows it (the target's last upload) before anything trains.

Where `eavesdropped_model` returns None (nothing to rebuild from an upload, e.g. FedHeNN
heterogeneous with upload=representations), the audit logs it and reports no metric.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from fedexp.core.client_loop import no_trace, run_client
from fedexp.core.seeding import client_generator, derive_seed
from fedexp.core.types import ConfigError, Message, RoundContext
from fedexp.metrics.membership import METRICS, membership_metrics

log = logging.getLogger(__name__)

MIA_STREAM = 17  # seed-derivation tag of the audit's own randomness
ATTACK_MODELS = ("gbdt", "logistic")
SHADOW_DATA = ("target", "pool")


@torch.no_grad()
def attack_features(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per sample: the softmax vector sorted in decreasing order, then log p(true label)."""
    model.eval()
    probs = torch.cat([torch.softmax(model(x[i : i + 4096]), 1) for i in range(0, len(y), 4096)])
    true = probs.gather(1, y[:, None]).clamp_min(1e-12).log()
    return torch.cat([probs.sort(1, descending=True).values, true], 1).double().cpu().numpy()


def fit_attack(members: np.ndarray, non_members: np.ndarray, kind: str, seed: int):
    """The attack classifier: features -> P(member)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    x = np.concatenate([members, non_members])
    y = np.concatenate([np.ones(len(members)), np.zeros(len(non_members))])
    if kind == "gbdt":
        clf = HistGradientBoostingClassifier(max_iter=100, max_depth=3, random_state=seed)
    else:
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    with threadpool_limits(1):  # a few thousand rows: OpenMP threads only add overhead (5-10x)
        return clf.fit(x, y)


def membership_scores(attack, features: np.ndarray) -> np.ndarray:
    """The attack's membership probability P(member | features), one per row."""
    return attack.predict_proba(features)[:, list(attack.classes_).index(1.0)]


def attack_accuracy(attack, members: np.ndarray, non_members: np.ndarray) -> float:
    """Accuracy of `attack` on a balanced member / non-member set (features)."""
    m = min(len(members), len(non_members))
    scores = [membership_scores(attack, f[:m]) for f in (members, non_members)]
    return membership_metrics(*scores)["privacy/mia_acc"]


def mimic_split(
    rng: np.random.Generator, pool_y: np.ndarray, like_y: np.ndarray, cap: int
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint in / out index sets into the pool with the label histogram of `like_y` (at most
    `cap` samples each, scaled down evenly where the pool holds too few of a label; labels the
    pool holds fewer than two of are left out)."""
    labels, counts = np.unique(like_y, return_counts=True)
    have = np.array([(pool_y == c).sum() for c in labels])
    keep = have >= 2
    labels, counts, have = labels[keep], counts[keep], have[keep]
    if not len(labels):
        return np.array([], dtype=int), np.array([], dtype=int)
    scale = min(1.0, cap / counts.sum(), float(np.min(have // 2 / counts)))
    ins, outs = [], []
    for c, n, h in zip(labels, counts, have):
        k = int(min(max(1, round(n * scale)), h // 2))
        idx = rng.permutation(np.flatnonzero(pool_y == c))
        ins.append(idx[:k])
        outs.append(idx[k : 2 * k])
    return np.concatenate(ins), np.concatenate(outs)


class MembershipInferenceAudit:
    """An evaluation callback reporting the `METRICS` of a shadow-model attack on the run's
    algorithm (see the module docstring)."""

    def __init__(
        self,
        ctx,
        num_shadows: int,
        num_targets: int,
        every: int,
        max_samples: int,
        attack_model: str,
        shadow_data: str,
    ):
        checks = [
            (num_shadows >= 1, "num_shadows", f"must be >= 1, got {num_shadows}"),
            (num_targets >= 1, "num_targets", f"must be >= 1, got {num_targets}"),
            (every >= 0, "every", f"must be >= 0 (0: final evaluation only), got {every}"),
            (max_samples >= 2, "max_samples", f"must be >= 2, got {max_samples}"),
            (attack_model in ATTACK_MODELS, "attack_model", f"must be one of {ATTACK_MODELS}"),
            (shadow_data in SHADOW_DATA, "shadow_data", f"must be one of {SHADOW_DATA}"),
        ]
        for ok, key, problem in checks:
            if not ok:
                raise ConfigError(f"privacy.{key}: {problem}")
        if len(ctx.data.test_y) < 4:
            raise ConfigError("privacy: the attacker's pool (the pooled test set) is too small")
        self.ctx = ctx
        self.num_shadows, self.num_targets = num_shadows, min(num_targets, ctx.data.num_clients)
        self.every, self.max_samples, self.attack_model = every, max_samples, attack_model
        self.shadow_data = shadow_data

    def due(self, round_idx: int, last_round: int) -> bool:
        return round_idx == last_round or (self.every > 0 and round_idx % self.every == 0)

    def shadow_ids(self, target_index: int) -> list[int]:
        """Client ids of a target's shadows: outside the federation, one set per target (a
        single set shared by all targets with `shadow_data: pool`)."""
        first = self.ctx.data.num_clients
        if self.shadow_data == "target":
            first += target_index * self.num_shadows
        return [first + k for k in range(self.num_shadows)]

    def on_evaluate(self, orchestrator, state, round_idx: int) -> dict[str, float]:
        if not self.due(round_idx, orchestrator.rounds):
            return {}
        algorithm = orchestrator.algorithm
        if not algorithm.can_be_eavesdropped:
            log.warning(
                "privacy=mia: %s says nothing about what an eavesdropper rebuilds; no audit",
                type(algorithm).__name__,
            )
            return {}
        rng = np.random.default_rng(derive_seed(self.ctx.seed, MIA_STREAM, round_idx))
        num_clients = self.ctx.data.num_clients
        targets = [int(c) for c in rng.permutation(num_clients)[: self.num_targets]]
        shadows = sorted({s for t in range(len(targets)) for s in self.shadow_ids(t)})
        # local training below must not leak into the run: only these clients train
        with no_trace(algorithm, (*targets, *shadows)):
            return self.audit(algorithm, state, round_idx, rng, targets, shadows)

    def audit(
        self, algorithm, state, round_idx: int, rng, targets: list[int], shadows: list[int]
    ) -> dict[str, float]:
        data = self.ctx.data
        ctx = RoundContext(round_idx + 1, (*targets, *shadows), self.ctx.seed)
        stats = algorithm.broadcast_stats(state)  # beside the payloads, as the round loop sends
        payloads = algorithm.configure_round(state, ctx)
        # each shadow starts where its target does (before the targets train below)
        mimics: dict[int, int] = {}
        for t, cid in enumerate(targets):
            for sid in self.shadow_ids(t):
                mimics.setdefault(sid, cid)  # shadow_data=pool: the first target's
        for sid, cid in mimics.items():
            algorithm.prepare_shadow(sid, cid)
        # targets first: a None rebuild ends the audit before any shadow trains
        target_features = []
        for t, cid in enumerate(targets):
            x, y = data.train(cid)
            model = self.rebuilt(algorithm, cid, payloads[cid], stats, x, y, round_idx)
            if model is None:
                log.info(
                    "privacy=mia: %s rebuilds no model from an upload; no audit",
                    type(algorithm).__name__,
                )
                return {}
            tx, ty = data.test(cid)
            m = min(len(y), len(ty), self.max_samples)
            if m == 0:
                continue
            pick = torch.as_tensor(rng.permutation(len(y))[:m], device=y.device)
            members = attack_features(model, x[pick], y[pick])
            target_features.append((t, y, members, attack_features(model, tx[:m], ty[:m])))
        if not target_features:
            return {}
        per_target, shared = [], None
        for t, y, members, non_members in target_features:
            if self.shadow_data == "target":
                attack = self.train_attack(algorithm, payloads, stats, rng, t, y, round_idx)
            else:
                if shared is None:
                    size = int(np.mean([data.num_train(c) for c in targets]))
                    shared = self.train_attack(
                        algorithm, payloads, stats, rng, t, None, round_idx, size
                    )
                attack = shared
            if attack is None:
                continue
            scores = [membership_scores(attack, f) for f in (members, non_members)]
            if np.ptp(np.concatenate(scores)) == 0:
                log.warning(
                    "privacy=mia: the attack scores all of a target's samples alike (its features "
                    "lie outside what the shadows showed): chance metrics by construction"
                )
            per_target.append(membership_metrics(*scores))
        if not per_target:
            return {}
        return {key: float(np.mean([r[key] for r in per_target])) for key in METRICS}

    def train_attack(
        self, algorithm, payloads, stats, rng, target_index: int, like_y, round_idx: int, size=0
    ):
        """Train the shadows of one target (in / out sets with the label histogram of `like_y`,
        or uniform draws of `size` from the pool where `like_y` is None) and fit the attack on
        their features; None where the pool cannot supply a shadow."""
        pool_x, pool_y = self.ctx.data.test_x, self.ctx.data.test_y
        labels = pool_y.cpu().numpy()
        ins, outs = [], []
        for sid in self.shadow_ids(target_index):
            if like_y is None:
                n = max(1, min(size, self.max_samples, len(labels) // 2))
                perm = rng.permutation(len(labels))
                i, o = perm[:n], perm[n : 2 * n]
            else:
                i, o = mimic_split(rng, labels, like_y.cpu().numpy(), self.max_samples)
            if len(i) == 0:
                log.warning("privacy=mia: the pool holds too few samples of the target's labels")
                return None
            i, o = (torch.as_tensor(v, device=pool_y.device) for v in (i, o))
            model = self.rebuilt(
                algorithm, sid, payloads[sid], stats, pool_x[i], pool_y[i], round_idx
            )
            ins.append(attack_features(model, pool_x[i], pool_y[i]))
            outs.append(attack_features(model, pool_x[o], pool_y[o]))
        ins, outs = np.concatenate(ins), np.concatenate(outs)
        return fit_attack(ins, outs, self.attack_model, self.ctx.seed)

    def rebuilt(
        self, algorithm, client_id: int, payload: Message, stats, x, y, round_idx: int
    ) -> nn.Module | None:
        """Run one client's local training on (x, y) and rebuild what an eavesdropper sees
        (None where it rebuilds nothing)."""
        global_seed = derive_seed(self.ctx.seed, MIA_STREAM, round_idx, client_id, 1)
        generator = client_generator(derive_seed(self.ctx.seed, MIA_STREAM), round_idx, client_id)
        transform = self.ctx.data.batch_transform
        result = run_client(
            algorithm, client_id, payload, stats, x, y, global_seed, generator, transform,
            round_idx=round_idx,
        )[0]  # fmt: skip
        model = algorithm.eavesdropped_model(payload, result.upload)
        if model is not None:  # the statistics travel beside the upload, where they travel
            algorithm.load_stats(model, result.stats)
        return model
