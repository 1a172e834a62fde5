"""WAFFLe (Hao et al., "Weight Anonymized Factorization for Federated Learning", IEEE Access 2022).

Every linear and convolutional layer of the model is a global dictionary of F rank-1 factors,
W_i = W_a diag(r ⊙ b_i) W_b (models/factorized.py). Client i selects factors with b_i under an
Indian Buffet Process prior (v_k ~ Beta(α, 1), π_k = Π_{j<=k} v_j, b_ik ~ Bern(π_k)) and keeps
its variational posterior {π̃, c, d} (q(v) = Kumaraswamy(c, d), q(b) = Bern(π̃), relaxed by a
binary Concrete at temperature τ) in the client store: it never leaves the client. Each round a
client trains {W_a, W_b, r, biases} and its {π̃, c, d} on the negative ELBO per sample

    mean CE(y, f(x; W_a, W_b, r, b)) + kl_weight · [Σ KL(Kuma ‖ Beta) + E_q Σ KL(Bern ‖ Bern)] / n_i

(n_i: the client's training-set size; kl_weight = 1 is the exact ELBO / n_i) and uploads the
change of {W_a, W_b, r, biases} only; the server averages them with FedAvg's server step, by
default as the paper's "simple averaging step" (`weighting: uniform`, 1/|S| each; `samples`
weights by n_i, the same on equal-sized clients).

Evaluation: a client that has trained uses the global dictionary with b from its own posterior
(`eval_mask`: threshold = 1[π̃ >= 1/2], or mean = π̃). A client never sampled uses, as in the
paper, "only the aggregated global parameters {W_a, W_b, r}": every factor weighted by r
(`unseen_mask: all`); or its initial posterior, the prior (π̃_k = (α/(1+α))^k), by the same rule
as a trained client (`unseen_mask: prior`). The global model (eval/global/*) is that
never-sampled client, and so is what an eavesdropper rebuilds from an upload: the dictionary
without the client's b.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.algorithms.fedavg import FedAvg
from fedexp.core.algorithm import BuildContext
from fedexp.core.client import ClientModule, JointOptimizer, Phase, make_optimizer
from fedexp.core.cohort import CohortStart, flat_rows
from fedexp.core.flat import flat_params, load_flat, named_views
from fedexp.core.local import ClientConfig
from fedexp.core.types import (
    FLOAT_BITS,
    ConfigError,
    Message,
    RoundContext,
    ServerState,
    VectorMessage,
)
from fedexp.models.factorized import (
    IBPPosterior,
    dense_param_count,
    factorize,
    factorized_layers,
    ibp_prior_pi,
    set_factor_masks,
)

EVAL_MASKS = ("threshold", "mean")
UNSEEN_MASKS = ("prior", "all")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class DictionaryPayload(VectorMessage):
    """The global dictionary {W_a, W_b, r, biases} (flat) and this round's Concrete temperature."""

    values: torch.Tensor
    temperature: float

    def num_bits(self) -> int:
        return self.values.numel() * FLOAT_BITS + FLOAT_BITS


class WaffleModule(ClientModule):
    """Negative ELBO of one client: data term over MC samples of (v, b) plus the scaled KL."""

    per_client_state = ("temperature", "num_train")  # given by begin

    uses_task_loss = False  # the data term runs the factorized model under sampled masks

    def __init__(
        self,
        model: nn.Module,
        client: ClientConfig,
        posterior: IBPPosterior,
        mc_samples: int,
        kl_weight: float,
        variational_lr: float | None,
        variational_optimizer: str,
    ):
        super().__init__(model, client)
        self.posterior = posterior
        self.mc_samples = mc_samples
        self.kl_weight = kl_weight
        self.variational_lr = variational_lr
        self.variational_optimizer = variational_optimizer
        self.temperature = 1.0  # set per round from the payload
        self.num_train = 1  # set per client: the KL is spread over the client's samples

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        data_term = torch.zeros((), device=x.device)
        kl_selection = torch.zeros((), device=x.device)
        for _ in range(self.mc_samples):
            b, log_pi = self.posterior.rsample(self.temperature, self.generator)
            set_factor_masks(self.model, self.posterior.layer_masks(b))
            kl_selection = kl_selection + self.posterior.kl_selection(log_pi)
            data_term = data_term + F.cross_entropy(self.model(x), y)
        set_factor_masks(self.model, None)
        kl = self.posterior.kl_sticks() + kl_selection / self.mc_samples
        return data_term / self.mc_samples + self.kl_weight * kl / self.num_train

    def phases(self) -> list[Phase]:
        params = (*self.model.parameters(), *self.posterior.parameters())
        return [Phase("all", self.client.local_epochs, params)]

    def configure_optimizers(self) -> JointOptimizer:
        variational = {id(p) for p in self.posterior.parameters()}
        model = [p for p in self._phase_params if id(p) not in variational]
        post = [p for p in self._phase_params if id(p) in variational]
        # Adam for {π̃, c, d}: their gradients are orders of magnitude smaller than the
        # weights' (each factor is a small part of the output), so plain SGD leaves them at the
        # prior and no client ever personalises
        spec = self.round_spec()  # the round's lr (`client.lr_schedule`)
        lr = self.variational_lr or spec[1]["lr"]
        optimizer = torch.optim.Adam if self.variational_optimizer == "adam" else torch.optim.SGD
        return JointOptimizer(make_optimizer(model, spec), optimizer(post, lr=lr))


class WAFFLe(FedAvg):
    """Shared factor dictionary, per-client IBP factor selection kept on the client."""

    has_personal_models = True

    def __init__(
        self,
        ctx: BuildContext,
        alpha: float,
        num_factors: int,
        tau: float,
        tau_final: float | None,
        tau_anneal_rounds: int,
        mc_samples: int,
        kl_weight: float,
        variational_lr: float | None,
        variational_optimizer: str,
        eval_mask: str,
        unseen_mask: str,
        **kwargs,
    ):
        checks = [
            (alpha > 0, "alpha", f"must be > 0, got {alpha}"),
            (num_factors >= 1, "num_factors", f"must be >= 1, got {num_factors}"),
            (tau > 0, "tau", f"must be > 0, got {tau}"),
            (tau_final is None or tau_final > 0, "tau_final", "must be > 0 or null"),
            (tau_anneal_rounds >= 1, "tau_anneal_rounds", "must be >= 1"),
            (mc_samples >= 1, "mc_samples", f"must be >= 1, got {mc_samples}"),
            (kl_weight >= 0, "kl_weight", f"must be >= 0, got {kl_weight}"),
            (variational_lr is None or variational_lr > 0, "variational_lr", "must be > 0 or null"),
            (variational_optimizer in OPTIMIZERS, "variational_optimizer", f"one of {OPTIMIZERS}"),
            (eval_mask in EVAL_MASKS, "eval_mask", f"must be one of {EVAL_MASKS}"),
            (unseen_mask in UNSEEN_MASKS, "unseen_mask", f"must be one of {UNSEEN_MASKS}"),
        ]
        for ok, key, problem in checks:
            if not ok:
                raise ConfigError(f"algorithm.{key}: {problem}")
        self.alpha, self.num_factors = alpha, num_factors
        self.tau, self.tau_final, self.tau_anneal_rounds = tau, tau_final, tau_anneal_rounds
        self.mc_samples, self.kl_weight, self.variational_lr = mc_samples, kl_weight, variational_lr
        self.variational_optimizer = variational_optimizer
        self.eval_mask, self.unseen_mask = eval_mask, unseen_mask
        super().__init__(ctx, **kwargs)
        self.eval_posterior = self.make_posterior(self.eval_model)
        # every client starts at the prior; a constant, not training state
        self.prior_variational = flat_params(list(self.eval_posterior.parameters()))
        sizes = [ctx.data.num_train(c) for c in range(ctx.data.num_clients)]
        self.mean_client_size = max(1, round(sum(sizes) / len(sizes)))

    # ---- model -----------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """The configured model with every dense linear/conv layer factorised."""
        model = factorize(self.ctx.model_factory(), self.num_factors).to(self.device)
        layers = factorized_layers(model)
        if not layers or any(isinstance(m, nn.RNNBase) for m in model.modules()):
            # a recurrent layer would stay dense and shared: no factor selection to anonymise it
            raise ConfigError("model: WAFFLe factorises linear and conv layers only (no RNN/LSTM)")
        for layer in layers:  # a sparse prior selection starts at the dense layer's scale
            layer.calibrate_strengths(ibp_prior_pi(self.alpha, layer.num_factors))
        return model

    def make_posterior(self, model: nn.Module) -> IBPPosterior:
        factors = [layer.num_factors for layer in factorized_layers(model)]
        return IBPPosterior(factors, self.alpha).to(self.device)

    def make_module(self, model: nn.Module) -> ClientModule:
        return WaffleModule(
            model,
            self.ctx.client,
            self.make_posterior(model),
            self.mc_samples,
            self.kl_weight,
            self.variational_lr,
            self.variational_optimizer,
        )

    def temperature(self, round_idx: int) -> float:
        """τ annealed geometrically from `tau` to `tau_final` over `tau_anneal_rounds` rounds."""
        if self.tau_final is None:
            return self.tau
        progress = min(1.0, (round_idx - 1) / self.tau_anneal_rounds)
        return self.tau * (self.tau_final / self.tau) ** progress

    # ---- server ----------------------------------------------------------------------------
    def configure_round(self, state: ServerState, ctx: RoundContext) -> Mapping[int, Message]:
        payload = DictionaryPayload(state.params, self.temperature(ctx.round))
        return {cid: payload for cid in ctx.client_ids}

    # ---- client ----------------------------------------------------------------------------
    def begin(self, module: WaffleModule, client_ids, payloads, stats) -> CohortStart:
        """The global dictionary for every client; each client's {π̃, c, d} from the store; its
        size (an id outside the federation, an auditor's shadow client, gets the mean size)."""
        variational = self.store.gather(client_ids, self.prior_variational)
        own = named_views(variational, module, list(module.posterior.parameters()))
        start = self.cohort_start(module, payloads, stats, own)
        inside = self.ctx.data.num_clients
        sizes = [self.ctx.data.num_train(c) if 0 <= c < inside else self.mean_client_size
                 for c in client_ids]  # fmt: skip
        temperatures = [p.temperature for p in payloads]
        for name, values in (("temperature", temperatures), ("num_train", sizes)):
            if all(v == values[0] for v in values):  # one number for every client
                start.shared[name] = values[0]
            else:
                start.attrs[name] = torch.tensor(values, device=self.device)
        return start

    def end(self, module: WaffleModule, payloads, params, training) -> Message:
        """Each client keeps its posterior; the dictionary's change travels."""
        posterior = flat_rows(module, params, list(module.posterior.parameters()))
        self.store.scatter(training.client_ids, posterior)
        return super().end(module, payloads, params, training)

    # ---- evaluation ------------------------------------------------------------------------
    def load_posterior(self, variational: torch.Tensor) -> IBPPosterior:
        """`eval_posterior` holding a client's flat {π̃, c, d}."""
        load_flat(list(self.eval_posterior.parameters()), variational)
        return self.eval_posterior

    def masks(self, variational: torch.Tensor | None) -> list[torch.Tensor] | None:
        """Evaluation b per layer from a client's posterior; None (all factors) for `all`."""
        if variational is None and self.unseen_mask == "all":
            return None
        self.load_posterior(self.prior_variational if variational is None else variational)
        return self.eval_posterior.layer_masks(self.eval_posterior.eval_mask(self.eval_mask))

    def _with_dictionary(self, dictionary: torch.Tensor, variational) -> nn.Module:
        load_flat(self.shared(self.eval_model), dictionary)
        set_factor_masks(self.eval_model, self.masks(variational))
        return self.eval_model

    def global_model(self, state: ServerState) -> nn.Module | None:
        return self._with_dictionary(state.params, None)

    def personal_model(self, state: ServerState, client_id: int) -> nn.Module | None:
        return self._with_dictionary(state.params, self.store.get(client_id))

    def eavesdropped_model(self, payload: Message, upload: Message) -> nn.Module | None:
        """The uploaded dictionary without the client's b (which never leaves the client)."""
        return self._with_dictionary(payload.vector + upload.vector, None)

    def describe(self) -> dict[str, float]:
        dictionary = sum(p.numel() for p in self.shared(self.eval_model))
        variational = len(self.prior_variational)
        return {
            "params/total": dictionary + variational,  # what one client learns
            "params/uploaded_per_client": dictionary,
            "params/variational_per_client": variational,
            "params/fedavg_model": dense_param_count(self.eval_model),  # same net, dense layers
        }
