"""What the FedAvg family gives an aggregator besides the round's uploads.

An aggregator declares the inputs it takes (`fedexp.aggregators.INPUTS`); `aggregate_rows` calls
it with them:

- `previous`: the aggregator's output in the previous aggregation, kept in the server state
  (`ServerState.buffers[PREVIOUS_KEY]`, checkpointed like any buffer; None before the first);
- `reference`: the server's own update of the round (`server_update`): the algorithm's client
  round, as any client runs it (`run_client`: `begin`, the client's local training, `end`), on
  the server pool (`partition.server_pool`, inputs and labels) from the round's global model.

The server trains as client id `num_clients` (no client has it) on streams of its own, derived
from (seed, TRUST_STREAM, round), inside `no_trace`: torch's global RNG and the client store are
put back afterwards, so the clients of this and every later round train as they would without
it, and the same seed gives the same update. It trains in the algorithm's resident module, the
same path whatever executor trains the clients (sequential, processes, vectorized, torchrun
ranks, which all aggregate alike).
"""

from __future__ import annotations

import torch

from fedexp.aggregators import PREVIOUS_KEY, inputs_of
from fedexp.core.algorithm import Algorithm
from fedexp.core.client_loop import no_trace, run_client
from fedexp.core.seeding import derive_seed
from fedexp.core.types import RoundContext, ServerState

TRUST_STREAM = 67  # derive_seed tag of the server's own training (its shuffles, its global RNG)


def aggregate_rows(
    algorithm: Algorithm,
    rows: torch.Tensor,
    weights: torch.Tensor,
    state: ServerState,
    ctx: RoundContext,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The injected aggregator over the round's `rows` [n, d] with the inputs it declares:
    (its output, the server-state buffers to keep beside the next state)."""
    aggregator = algorithm.ctx.aggregator
    wants = inputs_of(aggregator)
    given = {}
    if "previous" in wants:
        given["previous"] = state.buffers.get(PREVIOUS_KEY)
    if "reference" in wants:
        given["reference"] = server_update(algorithm, state, ctx)
    out = aggregator(rows, weights, num_malicious=ctx.num_malicious, **given)
    return out, ({PREVIOUS_KEY: out} if "previous" in wants else {})


def server_update(algorithm: Algorithm, state: ServerState, ctx: RoundContext) -> torch.Tensor:
    """The server's update of round `ctx.round` from `state`, trained on the server pool as a
    client of the algorithm trains: a row [d] like the clients' (`stack_uploads`)."""
    data = algorithm.ctx.data
    x, y = data.server_x, data.server_y
    if x is None or y is None or not len(y):
        raise ValueError("the server's update needs a labelled server pool (partition.server_pool)")
    server = int(data.num_clients)
    own = RoundContext(ctx.round, (server,), ctx.seed)
    generator = torch.Generator().manual_seed(derive_seed(ctx.seed, TRUST_STREAM, ctx.round))
    global_seed = derive_seed(ctx.seed, TRUST_STREAM, ctx.round, 1)
    with no_trace(algorithm, (server,)):
        payload = algorithm.configure_round(state, own)[server]
        stats = algorithm.broadcast_stats(state)
        results = run_client(
            algorithm, server, payload, stats, x, y, global_seed, generator,
            data.batch_transform, round_idx=ctx.round,
        )  # fmt: skip
        return algorithm.stack_uploads(results)[0].clone()
