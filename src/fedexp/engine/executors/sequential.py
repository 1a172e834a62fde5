"""executor=sequential: one client after another; the plain loop is the hot path."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.client_loop import client_streams, run_client
from fedexp.core.types import ClientResult, Message, RoundContext, ServerState


class SequentialExecutor:
    """One client after another on one resident model per architecture; the local batch size
    and optimizer are the algorithm's `ClientConfig`."""

    def run(
        self, algorithm: Algorithm, payloads: Mapping[int, Message], ctx: RoundContext, data
    ) -> list[ClientResult]:
        results = []
        for cid in ctx.client_ids:
            global_seed, generator = client_streams(ctx.seed, ctx.round, cid)
            x, y = data.train(cid)
            result = run_client(
                algorithm, cid, payloads[cid], x, y, global_seed, generator, data.batch_transform
            )
            results.append(result)
        return results


def train_aside(
    algorithm: Algorithm,
    executor,
    data,
    state: ServerState,
    round_idx: int,
    seed: int,
    client_ids: Sequence[int],
) -> list[ClientResult]:
    """Benign local training of `client_ids` in round `round_idx`, outside the round's cohort.

    The clients get what `configure_round` would send them and train through `executor` on
    their usual streams (seed, round, client id), exactly as if they had been sampled; then
    everything the training touched is put back: torch's global RNG (CPU and the algorithm's
    device) and the clients' entries in the client store. The round's cohort and every later
    round therefore train as they would without this call. Model-poisoning attackers use it to
    learn benign updates of attackers that were not sampled (FRL's reference code).
    """
    ids = tuple(int(c) for c in client_ids)
    if not ids:
        return []
    ctx = RoundContext(round_idx, ids, seed)
    store = algorithm.store
    saved = {cid: copy.deepcopy(store.get(cid)) for cid in ids if cid in store}
    device = torch.device(algorithm.device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        results = executor.run(algorithm, algorithm.configure_round(state, ctx), ctx, data)
    for cid in ids:
        if cid in saved:
            store.put(cid, saved[cid])
        else:
            store.delete(cid)
    return results
