"""executor=vectorized: the round's clients that share an architecture train at once (torch.func).

On a CPU, `executor.stack=auto` trains a chunk's stacked clients one after another (`stacked`'s
loop form, the module trained as the sequential executor trains it). The rules below are the vmap
form's: what a module must meet to run on a GPU (`check_algorithm` applies them in both forms).

The objective is the module's own `training_step`, run under `functional_call` with each
client's parameters and vmapped over the cohort; `grad` differentiates it and a functional
SGD/Adam (`functional_optim`) keeps one optimizer state per client. What a module must satisfy:

- `training_step(batch, batch_idx)` is a pure function of the module's parameters, buffers and
  attributes: no `.item()`, no data-dependent Python control flow, no in-place writes to
  parameters or buffers (so no BatchNorm running statistics).
- The task loss ignores padded samples: a short batch is padded to `batch_size` with label -100,
  which `F.cross_entropy` ignores (its mean runs over the real samples only), so each client's
  gradient is that of its unpadded batch. Terms that do not depend on the batch (FedProx's
  proximal term, an alignment term on a shared dataset, a KL) need nothing.
- Per-client inputs are module attributes named in the module class's `per_client_state`;
  `Algorithm.begin` gives them stacked [C, ...] (`CohortStart.attrs`), or once for every client
  (`CohortStart.shared`), and they are set back one slice per client inside vmap. Undeclared
  attributes are the module's own, the same for every client (`fedexp.core.client_loop` states
  the rules).
- Randomness inside `training_step` comes from torch's global RNG (`self.generator` is None
  there); vmap draws it independently per client (`randomness="different"`), seeded from
  (seed, round, first client). Shuffling still uses each client's own generator, so a
  deterministic objective trains on exactly the batches of the sequential executor.
- A custom `autograd.Function` (straight-through estimators) needs `setup_context` and
  `generate_vmap_rule = True`.
- The algorithm's client half is the sequential executor's: one `begin` for the group before
  training, one `end` after, with the same facts (`CohortTraining`) a cohort of one gets there.
- What `training_step` logs (`self.log`) leaves the vmapped step as an output, one value per
  client, and is averaged over each client's own (unpadded) steps. A value computed over the
  batch sees the padded samples of an epoch's short last batch (label -100), as the loss does.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.cohort import RoundResults
from fedexp.core.types import ConfigError, Message, RoundContext
from fedexp.engine.executors.batched_round import run_cohort
from fedexp.engine.executors.stacked import check_vmappable


def stack_form(stack: str, cuda: bool, static_shapes: bool) -> str:
    """`executor.stack`'s form: auto is vmap on CUDA (a round's time there is the host's
    launches) or with static shapes (what a CUDA graph replays), loop on a CPU (a batched kernel
    saves nothing there and its stacked activations leave the cache)."""
    if stack != "auto":
        return stack
    return "vmap" if cuda or static_shapes else "loop"


class VectorizedExecutor:
    """Trains each architecture group of the cohort at once with `torch.func`.

    The local batch size and optimizer are the algorithm's `ClientConfig`.

    Args:
        chunk_size: at most this many clients per vmapped call (bounds GPU memory); None: all.
        stack: how a chunk trains (`stacked`): "vmap" (one vmapped step for all its clients),
            "loop" (one client after another on the same stacked state), "auto" (vmap on CUDA
            or with static shapes, loop on a CPU).
    """

    def __init__(
        self,
        chunk_size: int | None,
        static_shapes: bool,
        cuda_graphs: bool,
        device: str,
        stack: str,
    ):
        if chunk_size is not None and chunk_size < 1:
            raise ConfigError(f"executor.chunk_size: must be >= 1 or null, got {chunk_size}")
        for key, value in (("static_shapes", static_shapes), ("cuda_graphs", cuda_graphs)):
            if not isinstance(value, bool):
                raise ConfigError(f"executor.{key}: must be true or false, got {value!r}")
        if stack not in ("auto", "vmap", "loop"):
            raise ConfigError(f"executor.stack: must be auto, vmap or loop, got {stack!r}")
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        if cuda_graphs and not cuda:
            raise ConfigError("executor.cuda_graphs: needs training on CUDA (device=cuda)")
        if stack == "loop" and (static_shapes or cuda_graphs):
            raise ConfigError("executor.static_shapes / cuda_graphs: need executor.stack=vmap")
        self.chunk_size = chunk_size
        self.static_shapes = static_shapes or cuda_graphs
        self.cuda_graphs = cuda_graphs
        self.stack = stack_form(stack, cuda, self.static_shapes)
        self.cohort_size = 0  # static shapes: the largest cohort so far (chunks pad to it)

    def check_algorithm(self, algorithm: Algorithm, num_clients: int) -> None:
        """Raise ConfigError before any training when a client module cannot be vmapped, or the
        algorithm says it cannot be vectorized (`Algorithm.vectorizable`)."""
        seen: set[int] = set()
        for cid in range(num_clients):
            module = algorithm.client_module(cid)
            if id(module) not in seen:
                seen.add(id(module))
                check_vmappable(module)
        if not algorithm.vectorizable:
            raise ConfigError(
                f"executor: {type(algorithm).__name__} cannot be vectorized with this model; use "
                "executor=sequential"
            )

    def run(
        self,
        algorithm: Algorithm,
        payloads: Mapping[int, Message],
        ctx: RoundContext,
        data,
        stats: torch.Tensor | None = None,
    ) -> RoundResults:
        """Each group of the round's clients that train one module, at once (`run_cohort`);
        `stats`: the running statistics broadcast beside the payloads."""
        batch_size = algorithm.ctx.client.batch_size
        pad_to = None
        if self.static_shapes:  # every chunk of every round padded to one size
            self.cohort_size = max(self.cohort_size, len(ctx.client_ids))
            pad_to = min(self.chunk_size or self.cohort_size, self.cohort_size)
        groups: dict[int, tuple] = {}
        for cid in ctx.client_ids:
            module = algorithm.client_module(cid)
            groups.setdefault(id(module), (module, []))[1].append(cid)
        results = [
            run_cohort(
                algorithm,
                module,
                ids,
                payloads,
                stats,
                ctx,
                data,
                batch_size,
                self.chunk_size,
                pad_to,
                self.cuda_graphs,
                loop=self.stack == "loop",
            )  # fmt: skip
            for module, ids in groups.values()
        ]
        return RoundResults.concat(results).take(ctx.client_ids)
