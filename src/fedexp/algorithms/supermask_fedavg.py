"""FedAvg on FRL's supermask: the ablation that isolates FRL's rank vote.

The network is FRL's (`to_supermask` of the configured model, rebuilt from the run's seed: frozen
weights θ^w and initial scores θ^s), and clients train its scores exactly as FRL's clients do.
What differs is what travels and how the server combines it: each client uploads its score delta
(32 bits a score), and the server averages the scores (FedAvg's server step, one client one vote
by default) instead of voting on the clients' edge rankings. The global model keeps the top k of
each layer by |score|, as FRL's. Compared with `algorithm=frl` on the same preset, a difference is
the vote's (rankings vs scores); compared with `algorithm=fedavg`, it is the supermask's.
"""

from __future__ import annotations

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.seeding import INIT, derive_seed
from fedexp.models.supermask import num_kept, supermask_layers, to_supermask


class SupermaskFedAvg(FedAvg):
    """FedAvg over the scores of FRL's seeded supermask network."""

    def __init__(
        self,
        ctx: BuildContext,
        weighting: str,
        server_lr: float,
        server_momentum: float,
        k: float,
        weight_init: str,
        **server_schedule,
    ):
        self.k, self.weight_init = k, weight_init
        super().__init__(ctx, weighting, server_lr, server_momentum, **server_schedule)

    def build_model(self) -> nn.Module:
        """θ^w and the initial θ^s from the run's seed (FRL's), identical at every call: the
        frozen weights are buffers, so every copy must be built alike."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, INIT))
            model = to_supermask(self.ctx.model_factory(), self.k, self.weight_init)
        return model.to(self.device)

    def describe(self) -> dict[str, float]:
        layers = supermask_layers(self.eval_model)
        return {
            **super().describe(),
            "params/kept": sum(num_kept(m.weight.numel(), self.k) for m in layers),
        }
