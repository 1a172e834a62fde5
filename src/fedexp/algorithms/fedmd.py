"""FedMD (Li & Wang, NeurIPS 2019 Workshop on Federated Learning, "FedMD: Heterogenous Federated
Learning via Model Distillation"): clients with models of their own exchange class scores on
public data, never weights.

Algorithm 1 of the paper, each round:

1. Communicate: each party computes class scores f_k(x_i^0) on a public subset and sends them;
2. Aggregate: the server computes the consensus f~(x_i^0) = (1/m) sum_k f_k(x_i^0);
3. Distribute: each party downloads the consensus;
4. Digest: each party trains f_k to approach the consensus on the public subset;
5. Revisit: each party trains f_k on its own private data for a few epochs.

The public data is the server pool (`partition.server_pool`, inputs no client holds; labels
unused): each round t draws its public subset P_t of `public_size` inputs from it, a function of
(seed, t) alone (the paper's "a subset of 5000 public samples" per round; the authors' code
re-draws its alignment data every round). Class scores are the model's logits (the authors'
code removes the softmax). In round t a client receives the consensus on P_t, digests it
(`digest_epochs` passes over P_t in batches of `digest_batch_size` with a fresh Adam at
`digest_lr`, the loss `digest_loss`: `l1`, the mean absolute error of the authors' code, or
`mse`), revisits (its local training: `client.local_epochs` of `client.*`, as every method of a
comparison), then uploads its scores on P_{t+1}; the server's mean of them is the consensus
that round t+1's clients digest. Round 1 has no consensus: the clients only revisit (the
paper's parties start from models already trained on their private data). With every client
in every round (the paper's setting) this is the paper's order exactly.

Each client owns its model (`fedexp.algorithms.local.Local`: one architecture for all, or each
client its own from a model family, `model=cnn_family`, `mlp_family`; `default_family` draws
one for a single-architecture model), kept in the client store; evaluation is personal. With
`digest_epochs: 0` nothing received changes a model: isolated local training (algorithm=local)
exactly. Both ways only scores travel: public_size x classes floats up per client, the same
down (the consensus; none in round 1).

The paper's transfer learning (each party first trains on the labelled public data) is
`pretrain_epochs` passes of each initial model over the pool's inputs and labels (cross-entropy,
Adam at `digest_lr`, batches of `digest_batch_size`), 0 by default: the pool is public,
unlabelled data for every method of a comparison here, and its labels would give FedMD
labelled data that no other method sees (the paper's public data is another task's: MNIST for
FEMNIST letters). Its other half, training on the private data, is round 1's revisit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from fedexp.algorithms.distillation import (
    LOGIT_LOSSES,
    check_pool,
    fit_targets,
    logit_loss,
    logits_of,
    pool_size,
    with_family,
)
from fedexp.algorithms.local import Local
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart, CohortTraining, resident
from fedexp.core.seeding import derive_seed, rng_devices
from fedexp.core.types import ClientResult, ConfigError, Message, RoundContext, ServerState
from fedexp.metrics.comm import FLOAT_BITS
from fedexp.models.running_stats import load_model_state, model_state, state_rows

PUBLIC_STREAM = 71  # derive_seed tag of round t's public subset P_t
DIGEST_STREAM = 73  # a client's digest shuffle in a round
PRETRAIN_STREAM = 77  # an initial model's pretraining on the labelled pool
LOWER = "algorithm.public_size"


@dataclass(frozen=True)
class Consensus(Message):
    """Round `round_idx`'s payload: the consensus scores [L, C] on that round's public subset,
    or None (round 1, or no client returned scores for it): nothing travels."""

    scores: torch.Tensor | None
    round_idx: int

    def num_bits(self) -> int:
        return 0 if self.scores is None else self.scores.numel() * FLOAT_BITS


@dataclass(frozen=True)
class ClassScores(Message):
    """A client's class scores (logits) [L, C] on the next round's public subset."""

    scores: torch.Tensor

    def num_bits(self) -> int:
        return self.scores.numel() * FLOAT_BITS


def _what(size: int) -> str:
    return f"FedMD draws each round's public subset (algorithm.public_size={size})"


def _check_config(cfg) -> None:
    """The server pool holds a public subset (before any data is loaded)."""
    size = OmegaConf.select(cfg, "algorithm.public_size")
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        pool = int(OmegaConf.select(cfg, "partition.server_pool", default=0))
        check_pool(pool, size, _what(size), LOWER)


def _pool_need(cfg) -> int:
    """`partition.server_pool: auto`: twice the public subset, so each round's is a fresh draw
    (FedHeNN's RAD rule)."""
    return 2 * int(OmegaConf.select(cfg, "algorithm.public_size", default=0))


class FedMD(Local):
    """Personal models (one architecture or a family); class scores on public data travel."""

    upload_type = ClassScores

    check_config = staticmethod(_check_config)
    server_pool_need = staticmethod(_pool_need)

    def __init__(
        self,
        ctx: BuildContext,
        public_size: int,
        digest_epochs: int,
        digest_batch_size: int,
        digest_lr: float,
        digest_loss: str,
        pretrain_epochs: int,
        default_family: str | None,
    ):
        super().__init__(with_family(ctx, default_family))
        for key, value, low in (
            ("public_size", public_size, 1),
            ("digest_epochs", digest_epochs, 0),
            ("digest_batch_size", digest_batch_size, 1),
            ("pretrain_epochs", pretrain_epochs, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"algorithm.{key}: must be an int >= {low}, got {value!r}")
        if isinstance(digest_lr, bool) or not isinstance(digest_lr, (int, float)) or digest_lr <= 0:
            raise ConfigError(f"algorithm.digest_lr: must be a number > 0, got {digest_lr!r}")
        if digest_loss not in LOGIT_LOSSES:
            raise ConfigError(
                f"algorithm.digest_loss: must be one of {LOGIT_LOSSES}, got {digest_loss!r}"
            )
        check_pool(pool_size(self.ctx.data), public_size, _what(public_size), LOWER)
        self.public_size = public_size
        self.digest_epochs = digest_epochs
        self.digest_batch_size = digest_batch_size
        self.digest_lr = float(digest_lr)
        self.digest_loss = digest_loss
        self.pretrain_epochs = pretrain_epochs
        if pretrain_epochs and getattr(self.ctx.data, "server_y", None) is None:
            raise ConfigError(
                "algorithm.pretrain_epochs: the server pool holds no labels to pretrain on; "
                "set algorithm.pretrain_epochs=0"
            )
        self._pretrained: dict[int, torch.Tensor] = {}  # rebuilt from the seed when needed
        # the models a client digests in: apart from the resident modules, which `begin` leaves
        self.scratch = [self.build(a).to(self.device) for a in range(len(self.modules))]
        self._public: dict[int, torch.Tensor] = {}

    # ---- the public data -----------------------------------------------------------------------
    def public(self, round_idx: int) -> torch.Tensor:
        """P_t: `public_size` inputs drawn without replacement from the server pool, a function
        of (seed, t) alone (the last few kept)."""
        if round_idx not in self._public:
            pool = self.ctx.data.server_x
            generator = torch.Generator().manual_seed(
                derive_seed(self.ctx.seed, PUBLIC_STREAM, round_idx)
            )
            pick = torch.randperm(len(pool), generator=generator)[: self.public_size]
            self._public[round_idx] = pool[pick.to(pool.device)]
            for old in sorted(self._public)[:-3]:
                del self._public[old]
        return self._public[round_idx]

    # ---- the initial models, pretrained where asked ------------------------------------------
    def initial_row(self, client_id: int) -> torch.Tensor:
        """The client's initial model; with `pretrain_epochs`, trained first on the labelled
        pool (the paper's transfer learning), once per initial model: one for every client of
        a single architecture, each client's own with a family."""
        row = super().initial_row(client_id)
        if not self.pretrain_epochs:
            return row
        key = client_id if self.num_archs else 0
        if key not in self._pretrained:
            model = self.scratch[self.arch_of(client_id)]
            load_model_state(model, row)
            keys = (self.ctx.seed, PRETRAIN_STREAM, key)
            with torch.random.fork_rng(devices=rng_devices(self.device)):
                torch.manual_seed(derive_seed(*keys, 1))
                data = self.ctx.data
                fit_targets(
                    model,
                    data.server_x,
                    data.server_y,
                    self.pretrain_epochs,
                    self.digest_batch_size,
                    self.digest_lr,
                    F.cross_entropy,
                    torch.Generator().manual_seed(derive_seed(*keys)),
                )
            self._pretrained[key] = model_state(model).to(row.dtype)
        return self._pretrained[key]

    def client_rows(self, client_ids) -> torch.Tensor:
        if not self.pretrain_epochs:
            return super().client_rows(client_ids)
        rows = [self.store.get(c) for c in client_ids]
        return torch.stack(
            [self.initial_row(c) if r is None else r for r, c in zip(rows, client_ids)]
        )

    # ---- server --------------------------------------------------------------------------------
    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        """The consensus on P_t where the previous round's clients scored P_t."""
        scores = state.buffers.get("consensus")
        if state.buffers.get("consensus_round") != ctx.round:
            scores = None
        payload = Consensus(scores, ctx.round)
        return {cid: payload for cid in ctx.client_ids}

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        """The consensus on P_{t+1}: the plain mean of the round's scores (the paper's
        (1/m) sum_k). Logged: the clients' mean absolute deviation from it."""
        scores = results.upload_rows("scores")  # [K, L, C]
        consensus = scores.mean(0)
        buffers = {**state.buffers, "consensus": consensus, "consensus_round": ctx.round + 1}
        spread = float((scores - consensus).abs().mean())
        return ServerState(state.params, buffers), {"fedmd/score_spread": spread}

    def state_is_finite(self, state: ServerState) -> bool:
        consensus = state.buffers.get("consensus")
        return consensus is None or bool(torch.isfinite(consensus).all())

    # ---- client --------------------------------------------------------------------------------
    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """Each client's own model from the store, digested where a consensus came: the revisit
        (the executor's local training) starts from it."""
        rows = self.client_rows(client_ids)
        if self.digest_epochs > 0 and any(p.scores is not None for p in payloads):
            rows = torch.stack(
                [
                    row if p.scores is None else self.digest(c, row, p)
                    for c, row, p in zip(client_ids, rows, payloads)
                ]
            )
        own = state_rows(module.model, rows, prefix="model.")
        return CohortStart(resident(module, len(client_ids), own))

    def digest(self, client_id: int, row: torch.Tensor, payload: Consensus) -> torch.Tensor:
        """Client `client_id`'s model `row` (`model_state`) trained towards the consensus on
        P_t; its shuffles (and any dropout) from its own stream of (seed, round, client), so
        the run's random streams are left as they were."""
        model = self.scratch[self.arch_of(client_id)]
        load_model_state(model, row)
        keys = (self.ctx.seed, DIGEST_STREAM, payload.round_idx, client_id)
        generator = torch.Generator().manual_seed(derive_seed(*keys))
        with torch.random.fork_rng(devices=rng_devices(self.device)):
            torch.manual_seed(derive_seed(*keys, 1))
            fit_targets(
                model,
                self.public(payload.round_idx),
                payload.scores,
                self.digest_epochs,
                self.digest_batch_size,
                self.digest_lr,
                partial(logit_loss, self.digest_loss),
                generator,
            )
        return model_state(model).to(row.dtype)

    def end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        """Store each client's trained model; upload its scores on P_{t+1} (eval mode)."""
        ids = training.client_ids
        rows = self.keep(module, ids, params)
        scores = []
        for cid, row, payload in zip(ids, rows, payloads):
            model = self.model_of(cid, row)
            x = self.public(payload.round_idx + 1)
            scores.append(logits_of(model, x, self.digest_batch_size))
        return ClassScores(torch.stack(scores))

    # ---- reporting -----------------------------------------------------------------------------
    def describe(self) -> dict[str, float]:
        out = super().describe()
        out["params/uploaded_per_client"] = 0  # scores, not parameters, travel
        out["fedmd/public_size"] = self.public_size
        return out

    def run_warnings(self, rounds: int) -> list[str]:
        out = []
        if self.pretrain_epochs:
            out.append(
                f"algorithm.pretrain_epochs={self.pretrain_epochs}: FedMD's initial models train "
                "on the server pool's labels, which no other method of a comparison reads"
            )
        if self.digest_epochs == 0:
            out.append(
                "algorithm.digest_epochs=0: no client digests the consensus, so FedMD is "
                "isolated local training (algorithm=local)"
            )
        elif rounds == 1:
            out.append("rounds=1: round 1 has no consensus, so no client digests one")
        return out
