"""executor=sequential: one client after another; the plain loop is the hot path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.client_loop import client_streams, no_trace, run_client
from fedexp.core.cohort import RoundResults
from fedexp.core.types import Message, RoundContext, ServerState


def import_optimizer_stack() -> None:
    """torch imports its compiler stack (`torch._dynamo`, 1.5-2 s) on an optimizer's first
    construction: here, in the run's start-up, where an executor is built, so that the first
    round's time (`time/round_s`, the summary's mean) is training and not that import."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


class SequentialExecutor:
    """One client after another on one resident model per architecture; the local batch size
    and optimizer are the algorithm's `ClientConfig`."""

    def __init__(self):
        import_optimizer_stack()

    def run(
        self,
        algorithm: Algorithm,
        payloads: Mapping[int, Message],
        ctx: RoundContext,
        data,
        stats: torch.Tensor | None = None,
    ) -> RoundResults:
        """Each client of the round as a cohort of one (`run_client`); `stats`: the running
        statistics broadcast beside the payloads."""
        results = []
        client = algorithm.ctx.client
        for cid in ctx.client_ids:
            global_seed, generator = client_streams(ctx.seed, ctx.round, cid)
            x, y = data.train(cid)
            results.append(
                run_client(
                    algorithm,
                    cid,
                    payloads[cid],
                    stats,
                    x,
                    y,
                    global_seed,
                    generator,
                    data.batch_transform,
                    round_idx=ctx.round,
                    work=client.work(ctx.seed, ctx.round, cid),
                )  # fmt: skip
            )
        return RoundResults.concat(results)


def train_aside(
    algorithm: Algorithm,
    executor,
    data,
    seed: int,
    state: ServerState,
    round_idx: int,
    client_ids: Sequence[int],
) -> RoundResults:
    """Benign local training of `client_ids` in round `round_idx` from the round's starting
    `state`, outside the round's cohort.

    The clients get what `configure_round` would send them and train through `executor` on
    their usual streams (seed, round, client id), exactly as if they had been sampled, inside
    `no_trace`: torch's global RNG and the clients' store entries are put back afterwards, so
    the round's cohort and every later round train as they would without this call. The round
    loop hands the attack this function bound to its first four arguments
    (`NoAttack.use_aside`): model-poisoning attackers learn benign updates of attackers that
    were not sampled (FRL's reference code).
    """
    ids = tuple(int(c) for c in client_ids)
    if not ids:
        return RoundResults.empty()
    ctx = RoundContext(round_idx, ids, seed)
    with no_trace(algorithm, ids):
        stats = algorithm.broadcast_stats(state)
        return executor.run(algorithm, algorithm.configure_round(state, ctx), ctx, data, stats)
