"""The Algorithm base: the server half, plus the hooks the executor calls around local training.

The round loop only moves messages; what a payload or an upload *is* belongs to the algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedexp.core.client import ClientModule
from fedexp.core.client_store import ClientStore
from fedexp.core.cohort import CohortStart, CohortTraining
from fedexp.core.local import ClientConfig
from fedexp.core.types import ClientResult, Message, RoundContext, ServerState


@dataclass
class BuildContext:
    """What every algorithm is built from (assembled by `fedexp.run`)."""

    model_factory: Callable[[], nn.Module]
    client: ClientConfig  # the client's local training settings, built once from `client.*`
    aggregator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    data: Any  # FederatedData
    device: torch.device
    seed: int
    store: ClientStore
    model_args: dict = field(default_factory=dict)  # data-derived factory args (input_shape...)
    # `conf/model/<name>.yaml` built and bound to `model_args` (`family("cnn_family")`); an
    # algorithm that needs a model family where one architecture was chosen asks for it here
    family: Callable[[str], Callable[..., nn.Module]] | None = None


@dataclass
class PersonalBatch:
    """Several clients' personal models of one architecture, for a batched evaluation.

    `model` is the architecture (a resident module, run with `torch.func.functional_call`);
    `shared` holds the parameters and buffers every client of the batch has in common (by
    `model.named_parameters()` / `named_buffers()` name), `stacked` the others with a leading
    client dimension; `attrs` / `shared_attrs` are per-client plain attributes of submodules
    (submodule name -> {attribute: value}), stacked or common.
    """

    model: nn.Module
    shared: dict[str, torch.Tensor]
    stacked: dict[str, torch.Tensor]
    attrs: dict[str, dict] = field(default_factory=dict)
    shared_attrs: dict[str, dict] = field(default_factory=dict)


class Algorithm:
    """Base class. Subclasses implement the server half and the client half.

    The client half is written once, for a cohort (`fedexp.core.cohort`): `client_module` ->
    `begin` (what the cohort starts from, stacked) -> training -> `end` (the trained parameters
    in, the uploads out, stacked). Every executor calls these three in this order; the
    sequential one with a cohort of one client (`fedexp.core.client_loop.run_client`).

    `upload_type` is the Message class clients upload (None: not declared); the aggregator and
    the attack are checked against it before training.
    """

    upload_type: type[Message] | None = None

    # ---- capabilities, declared: the wiring, the evaluation and the audits read these --------
    # (an instance may set one from its model: FedBN has no global model with BatchNorm layers)
    has_global_model = False  # `global_model` returns the model every client shares
    has_personal_models = False  # `personal_model` returns each client's own model
    batches_personal_models = False  # `personal_models` hands over a stacked batch itself
    can_be_eavesdropped = False  # `eavesdropped_model` rebuilds a model from an upload
    vectorizable = True  # executor=vectorized may train its client modules (they are checked)
    clients_train = True  # clients train and upload (False: training on the server alone)

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
        """The next state from the round's results; `ctx.num_malicious` is the round's count
        of corrupted uploads, for aggregators granted it."""
        raise NotImplementedError

    # ---- client half: one protocol, shaped for a batch (`fedexp.core.cohort`) -----------------
    def client_module(self, client_id: int) -> ClientModule:
        """The (resident) module this client trains; clients given the same module train
        together on the vectorized executor."""
        raise NotImplementedError

    def begin(
        self,
        module: ClientModule,
        client_ids: Sequence[int],
        payloads: Sequence[Message],
        stats: torch.Tensor | None,
    ) -> CohortStart:
        """What a cohort of clients, all training `module`, starts from: every client's
        parameters and buffers and its per-client inputs (`per_client_state`), stacked [C, ...]
        in `client_ids` order. `payloads` are what each received; `stats` the running statistics
        broadcast beside them (`broadcast_stats`), or None. A value, not a side effect: `begin`
        writes nothing into the module and draws from no random stream. The sequential executor
        calls it with one client, the vectorized executor with a whole group."""
        raise NotImplementedError

    def end(
        self,
        module: ClientModule,
        payloads: Sequence[Message],
        params: Mapping[str, torch.Tensor],
        training: CohortTraining,
    ) -> Message:
        """After local training: store what stays on the clients from their trained parameters
        and buffers `params` (name -> [C, ...]; for a cohort of one they may be views of the
        module's own tensors: copy what is kept) and return the cohort's uploads as one message
        whose tensor fields are stacked [C, ...] (`fedexp.core.cohort.unstack` gives a client's).
        `training` says what the training did (steps, samples, learning rates, the data)."""
        raise NotImplementedError

    # ---- running statistics (`fedexp.models.running_stats`) -----------------------------------
    def broadcast_stats(self, state: ServerState) -> torch.Tensor | None:
        """The running statistics every client of the round receives besides its payload (the
        global model's BatchNorm statistics), or None (the default: none travel). The round loop
        calls it before `configure_round`, counts it in comm/down_bits and hands it to `begin`."""
        return None

    def client_stats(
        self, module: ClientModule, params: Mapping[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """After local training: the running statistics the clients upload beside their uploads,
        [C, s] from the trained `params` (`RoundResults.stats_rows`, counted in comm/up_bits),
        or None (the default)."""
        return None

    def load_stats(self, model: nn.Module, stats: torch.Tensor | None) -> None:
        """Load uploaded running statistics into a rebuilt model (the audit's eavesdropper sees
        them beside the upload); nothing by default."""

    # ---- evaluation --------------------------------------------------------------------------
    def global_model(self, state: ServerState) -> nn.Module | None:
        """The global model, or None where the algorithm has none."""
        return None

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        """Client `client_id`'s own model, or None where the algorithm has none."""
        return None

    def personal_models(
        self, state: ServerState, client_ids: Sequence[int]
    ) -> PersonalBatch | None:
        """The personal models of `client_ids` as one `PersonalBatch`, or None (the default):
        evaluation then reads `personal_model` client by client and stacks what it finds. An
        algorithm whose clients share most of their model (FedRep's body) overrides this to
        hand over the stacked personal part directly."""
        return None

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The model an eavesdropper who sees a round's broadcast `payload` and one client's
        `upload` can rebuild (for the membership-inference audit), or None where it cannot.
        The returned module may be reused by the next call: use it before calling again."""
        return None

    def prepare_shadow(self, shadow_id: int, client_id: int) -> None:
        """Before the membership-inference audit trains `shadow_id` (an id outside the
        federation) as a shadow of client `client_id`: give it what that client starts its local
        training from beyond the broadcast, as far as an eavesdropper knows it (heterogeneous
        FedHeNN: the client's architecture and last uploaded weights). Nothing by default: a
        client starts from the broadcast alone."""

    def on_resume(self, state: ServerState) -> None:
        """After a resume, rebuild caches that depend on the restored `state` (none by default).

        A resumed run calls `init_state()` first, as a fresh run does, then replaces the state
        with the checkpointed one and calls this. Server state that determines the future must
        live in `state`, per-client state in `self.store`: both are checkpointed, nothing else.
        """

    def state_is_finite(self, state: ServerState) -> bool:
        # one float64 reduction (NaN and inf propagate; finite float32 values cannot overflow
        # it) instead of isfinite's elementwise passes: the same answer at a fraction of the cost
        params = state.params
        return params is None or bool(torch.isfinite(params.sum(dtype=torch.float64)))

    def describe(self) -> dict[str, float]:
        """Static facts to report once (e.g. parameter counts)."""
        return {}

    def round_lrs(self, round_idx: int) -> dict[str, float]:
        """The learning rates of round `round_idx`, reported in its metrics: `train/client_lr`,
        the clients' lr that round (`client.lr_schedule`; none where the model's own
        `configure_optimizers` sets it), and `train/server_lr` where the server has one."""
        client = self.ctx.client
        return {} if client.optimizer == "module" else {"train/client_lr": client.lr_at(round_idx)}

    def run_warnings(self, rounds: int) -> list[str]:
        """What in this algorithm's settings changes what its numbers mean over a run of
        `rounds` rounds (a part that never trains, a term that is never on), one line each,
        naming the option; the final table, the sweep table and the report show them."""
        return []
