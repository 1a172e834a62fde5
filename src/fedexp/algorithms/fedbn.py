"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021): federated learning on non-IID features via
local batch normalization.

Every BatchNorm layer stays on its client: its affine weight and bias and its running statistics
(mean, variance, batch count) never leave it and live in the client store; every other parameter
is averaged as in FedAvg (Algorithm 1 of the paper: the server aggregates all layers but the BN
layers, w_l <- sum_k p_k w_{k,l} for l not a BN layer). A client never sampled starts from the
initial BN state. With a model that has no BatchNorm layer FedBN is FedAvg exactly.

Evaluation is personal (the paper's: each client's model with its own BN layers); a model with BN
layers has no global model. Use a model with BN (`model=mlp_bn` or `model=cnn_bn`). The
vectorized executor cannot carry BN running statistics through `vmap`: it refuses such a model.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule
from fedexp.core.cohort import CohortStart
from fedexp.core.flat import load_flat, share_model_storage
from fedexp.core.types import Message, ServerState

_BN = nn.modules.batchnorm._BatchNorm


def bn_layers(model: nn.Module) -> list[nn.Module]:
    """The model's BatchNorm layers, in module order."""
    return [m for m in model.modules() if isinstance(m, _BN)]


class FedBN(FedAvg):
    """FedAvg over every parameter outside BatchNorm layers; BN layers are the client's."""

    has_personal_models = True

    def __init__(self, ctx: BuildContext, **fedavg_kwargs):
        super().__init__(ctx, **fedavg_kwargs)
        # without BN layers the averaged model is the whole model: FedAvg's global model
        self.has_global_model = not bn_layers(self.eval_model)

    # ---- what travels and what stays -----------------------------------------------------------
    def shared(self, model: nn.Module) -> list[nn.Parameter]:
        cache = self.__dict__.get("_shared_cache")
        if cache is None:
            cache = self.__dict__["_shared_cache"] = weakref.WeakKeyDictionary()
        if model not in cache:
            local = {id(p) for m in bn_layers(model) for p in m.parameters()}
            cache[model] = tuple(p for p in model.parameters() if id(p) not in local)
            share_model_storage(model, cache[model])
        return list(cache[model])

    def stat_buffers(self, model: nn.Module) -> list[torch.Tensor]:
        return []  # every BN layer's statistics stay on its client (affine or not)

    @staticmethod
    def local_state(model: nn.Module) -> list[torch.Tensor]:
        """Copies of the BN layers' parameters and buffers (running mean, variance, count)."""
        tensors = [t for m in bn_layers(model) for t in (*m.parameters(), *m.buffers())]
        return [t.detach().clone() for t in tensors]

    @staticmethod
    @torch.no_grad()
    def load_local(model: nn.Module, state: list[torch.Tensor]) -> None:
        tensors = [t for m in bn_layers(model) for t in (*m.parameters(), *m.buffers())]
        for t, value in zip(tensors, state, strict=True):
            t.copy_(value)

    # ---- server --------------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        state = super().init_state()
        # the BN state a never-sampled client starts from is server state (checkpointed)
        state.buffers["initial_bn"] = self.local_state(self.eval_model)
        self.on_resume(state)
        return state

    def on_resume(self, state: ServerState) -> None:
        self._initial_bn = state.buffers["initial_bn"]

    def _bn_of(self, client_id: int) -> list[torch.Tensor]:
        return self.store.get(client_id, self._initial_bn)

    # ---- client --------------------------------------------------------------------------------
    def _bn_names(self, module: ClientModule) -> list[str]:
        """The names of the BN layers' parameters and buffers, in `local_state`'s order."""
        names = {id(t): n for n, t in [*module.named_parameters(), *module.named_buffers()]}
        layers = bn_layers(module.model)
        return [names[id(t)] for m in layers for t in (*m.parameters(), *m.buffers())]

    def begin(self, module: ClientModule, client_ids, payloads, stats) -> CohortStart:
        """The shared weights from the payloads; each client's BN state from the store."""
        own = {}
        if self._initial_bn:
            rows = self.store.gather(client_ids, self._initial_bn)
            own = dict(zip(self._bn_names(module), rows, strict=True))
        return self.cohort_start(module, payloads, stats, own)

    def end(self, module: ClientModule, payloads, params, training) -> Message:
        if self._initial_bn:  # nothing to keep for a model without BN layers
            self.store.scatter(training.client_ids, [params[n] for n in self._bn_names(module)])
        return super().end(module, payloads, params, training)

    # ---- evaluation ----------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        return super().global_model(state) if self.has_global_model else None

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        load_flat(self.shared(self.eval_model), state.params)
        self.load_local(self.eval_model, self._bn_of(client_id))
        return self.eval_model

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The uploaded weights with the initial BN state: the client's BN never travels."""
        load_flat(self.shared(self.eval_model), payload.vector + upload.vector)
        self.load_local(self.eval_model, self._initial_bn)
        return self.eval_model

    def describe(self) -> dict[str, float]:
        out = super().describe()
        local = [p for m in bn_layers(self.eval_model) for p in m.parameters()]
        out["params/local_bn"] = sum(p.numel() for p in local)
        return out
