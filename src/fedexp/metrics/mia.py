"""Membership-inference audit (`privacy=mia`): a shadow-model attack in the style of Shokri et al.
(S&P 2017) on the model an eavesdropper rebuilds from one client's upload.

Threat model. The eavesdropper sees a round's broadcast and one client's upload, and rebuilds what
it can from them (`Algorithm.eavesdropped_model`: FedAvg's full local model, WAFFLe's dictionary
without the client's factor selection b). It holds its own data from the task's distribution (the
pooled server test set, which no client trains on) and knows the protocol, so its k shadow models
are the algorithm's own client training, run from the same broadcast on a random half ("in") of a
random subset of its data, and rebuilt from their uploads exactly as the target will be. An attack
classifier learns in/out from the shadows' output vectors; it is then applied to the target's
rebuilt model on a balanced set: m of the client's training samples (members) and m of its local
test split (non-members, same distribution). `privacy/mia_acc` is its accuracy (0.5 = chance).

The target's upload is produced by running that client's local training once more from the
current global state (as in the next round). The store entries of the audited clients (targets
and shadows) and torch's global RNG (CPU and the training device) are restored afterwards, so the
audit never changes the run it observes; only those entries are read, so a spilling store keeps
its memory budget.

Where `eavesdropped_model` returns None (nothing to rebuild from an upload, e.g. FedHeNN
heterogeneous, whose clients upload representations), the audit logs it and reports no metric.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_map

from fedexp.core.algorithm import Algorithm
from fedexp.core.executors import train_local
from fedexp.core.seeding import client_generator, derive_seed, seed_global_rng
from fedexp.core.types import ConfigError, Message, RoundContext

log = logging.getLogger(__name__)

MIA_STREAM = 17  # seed-derivation tag of the audit's own randomness
ATTACK_MODELS = ("gbdt", "logistic")


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


def attack_accuracy(attack, members: np.ndarray, non_members: np.ndarray) -> float:
    """Accuracy of `attack` on a balanced member / non-member set."""
    m = min(len(members), len(non_members))
    hits = (attack.predict(members[:m]) == 1).sum() + (attack.predict(non_members[:m]) == 0).sum()
    return float(hits / (2 * m))


def snapshot(client_state):
    """A copy of a client's stored state (tensors cloned: training may write into them)."""
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, client_state)


def rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose RNG `seed_global_rng` reseeds when training on `device`."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


class MembershipInferenceAudit:
    """An evaluation callback reporting `privacy/mia_acc` for the run's algorithm."""

    def __init__(
        self,
        ctx,
        num_shadows: int = 3,
        num_targets: int = 2,
        every: int = 0,
        max_samples: int = 1000,
        attack_model: str = "gbdt",
    ):
        checks = [
            (num_shadows >= 1, "num_shadows", f"must be >= 1, got {num_shadows}"),
            (num_targets >= 1, "num_targets", f"must be >= 1, got {num_targets}"),
            (every >= 0, "every", f"must be >= 0 (0: final evaluation only), got {every}"),
            (max_samples >= 2, "max_samples", f"must be >= 2, got {max_samples}"),
            (attack_model in ATTACK_MODELS, "attack_model", f"must be one of {ATTACK_MODELS}"),
        ]
        for ok, key, problem in checks:
            if not ok:
                raise ConfigError(f"privacy.{key}: {problem}")
        if len(ctx.data.test_y) < 4:
            raise ConfigError("privacy: the attacker's pool (the pooled test set) is too small")
        self.ctx = ctx
        self.num_shadows, self.num_targets = num_shadows, min(num_targets, ctx.data.num_clients)
        self.every, self.max_samples, self.attack_model = every, max_samples, attack_model

    def due(self, round_idx: int, last_round: int) -> bool:
        return round_idx == last_round or (self.every > 0 and round_idx % self.every == 0)

    def on_evaluate(self, orchestrator, state, round_idx: int) -> dict[str, float]:
        if not self.due(round_idx, orchestrator.rounds):
            return {}
        algorithm = orchestrator.algorithm
        if type(algorithm).eavesdropped_model is Algorithm.eavesdropped_model:
            log.warning(
                "privacy=mia: %s says nothing about what an eavesdropper rebuilds; no audit",
                type(algorithm).__name__,
            )
            return {}
        rng = np.random.default_rng(derive_seed(self.ctx.seed, MIA_STREAM, round_idx))
        num_clients = self.ctx.data.num_clients
        targets = [int(c) for c in rng.permutation(num_clients)[: self.num_targets]]
        shadow_ids = [num_clients + k for k in range(self.num_shadows)]  # outside the federation
        store = algorithm.store
        # local training below must not leak into the run: keep the entries it may touch
        saved = {cid: snapshot(store.get(cid)) for cid in (*targets, *shadow_ids) if cid in store}
        try:
            with torch.random.fork_rng(devices=rng_devices(algorithm.device)):
                return self.audit(algorithm, state, round_idx, rng, targets, shadow_ids)
        finally:
            for cid in (*targets, *shadow_ids):
                if cid in saved:
                    store.put(cid, saved[cid])
                else:
                    store.delete(cid)

    def audit(
        self, algorithm, state, round_idx: int, rng, targets: list[int], shadow_ids: list[int]
    ) -> dict[str, float]:
        data, seed = self.ctx.data, self.ctx.seed
        ctx = RoundContext(round_idx + 1, (*targets, *shadow_ids), seed)
        payloads = algorithm.configure_round(state, ctx)
        # targets first: a None rebuild ends the audit before any shadow trains
        target_features = []
        for cid in targets:
            x, y = data.train(cid)
            model = self.rebuilt(algorithm, cid, payloads[cid], x, y, round_idx)
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
            target_features.append((members, attack_features(model, tx[:m], ty[:m])))
        if not target_features:
            return {}
        # shadows: the attacker's own data, split in / out at random
        pool_x, pool_y = data.test_x, data.test_y
        size = int(np.mean([data.num_train(c) for c in targets]))
        size = max(1, min(size, self.max_samples, len(pool_y) // 2))
        ins, outs = [], []
        for sid in shadow_ids:
            perm = torch.as_tensor(rng.permutation(len(pool_y)), device=pool_y.device)
            i, o = perm[:size], perm[size : 2 * size]
            model = self.rebuilt(algorithm, sid, payloads[sid], pool_x[i], pool_y[i], round_idx)
            ins.append(attack_features(model, pool_x[i], pool_y[i]))
            outs.append(attack_features(model, pool_x[o], pool_y[o]))
        attack = fit_attack(np.concatenate(ins), np.concatenate(outs), self.attack_model, seed)
        accs = [attack_accuracy(attack, members, non) for members, non in target_features]
        return {"privacy/mia_acc": float(np.mean(accs))}

    def rebuilt(
        self, algorithm, client_id: int, payload: Message, x, y, round_idx: int
    ) -> nn.Module | None:
        """Run one client's local training on (x, y) and rebuild what an eavesdropper sees
        (None where it rebuilds nothing)."""
        seed_global_rng(
            derive_seed(self.ctx.seed, MIA_STREAM, round_idx, client_id, 1), algorithm.device
        )
        module = algorithm.client_module(client_id)
        module.generator = client_generator(
            derive_seed(self.ctx.seed, MIA_STREAM), round_idx, client_id
        )
        algorithm.client_begin(module, client_id, payload)
        batch_size, transform = self.ctx.client_cfg.batch_size, self.ctx.data.batch_transform
        train_local(module, x, y, batch_size, module.generator, transform)
        upload = algorithm.client_end(module, client_id, payload)
        return algorithm.eavesdropped_model(payload, upload)
