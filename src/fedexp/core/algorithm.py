"""The Algorithm base: the server half, plus the hooks the executor calls around local training.

The round loop only moves messages; what a payload or an upload *is* belongs to the algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedexp.core.client import ClientModule
from fedexp.core.client_store import ClientStore
from fedexp.core.types import ClientResult, Message, RoundContext, ServerState


@dataclass
class BuildContext:
    """What every algorithm is built from (assembled by `fedexp.run`)."""

    model_factory: Callable[[], nn.Module]
    client_cfg: Any
    aggregator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    data: Any  # FederatedData
    device: torch.device
    seed: int
    store: ClientStore


class Algorithm:
    """Base class. Subclasses implement the server half and the client hooks.

    Client hooks run inside the executor, around the module's local training:
    `client_module` -> `client_begin` -> (training) -> `client_end`.

    `upload_type` is the Message class clients upload (None: not declared); the aggregator and
    the attack are checked against it before training.
    """

    upload_type: type[Message] | None = None

    def __init__(self, ctx: BuildContext):
        self.ctx = ctx
        self.device = ctx.device
        self.store = ctx.store

    # ---- server half -------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        raise NotImplementedError

    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        """What each sampled client receives."""
        raise NotImplementedError

    def aggregate(
        self, state: ServerState, results: Sequence[ClientResult], ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        raise NotImplementedError

    # ---- client half -------------------------------------------------------------------------
    def client_module(self, client_id: int) -> ClientModule:
        """The (resident) module this client trains."""
        raise NotImplementedError

    def client_begin(self, module: ClientModule, client_id: int, payload: Message) -> None:
        """Load the payload (and the client's stored state) into the module."""
        raise NotImplementedError

    def client_end(self, module: ClientModule, client_id: int, payload: Message) -> Message:
        """Store what stays on the client; return what is uploaded."""
        raise NotImplementedError

    # ---- evaluation --------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        """The global model, or None where the algorithm has none."""
        return None

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        """Client `client_id`'s own model, or None where the algorithm has none."""
        return None

    def state_is_finite(self, state: ServerState) -> bool:
        return state.params is None or bool(torch.isfinite(state.params).all())

    def describe(self) -> dict[str, float]:
        """Static facts to report once (e.g. parameter counts)."""
        return {}


def flat_params(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Concatenate parameters into one detached flat vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in params])


@torch.no_grad()
def load_flat(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into parameters in place (no aliasing)."""
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n
