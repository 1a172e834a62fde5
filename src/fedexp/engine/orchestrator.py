"""THE round loop. It never names an algorithm: it samples, moves messages, and measures."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from functools import partial

from fedexp.core.algorithm import Algorithm
from fedexp.core.callbacks import Callback, RoundReport, frozen
from fedexp.core.cohort import RoundResults
from fedexp.core.types import Diverged, RoundContext, ServerState, malicious_count
from fedexp.engine.eval.all_clients import evaluate
from fedexp.engine.eval.backdoor import backdoor_metrics
from fedexp.engine.eval.finetuned import Finetune
from fedexp.engine.executors.sequential import train_aside
from fedexp.engine.participation import Participation
from fedexp.metrics.comm import stats_bits


def logged_means(results: RoundResults) -> dict[str, float]:
    """`client/<name>` for each name the clients' steps logged: the mean over the clients that
    logged it of each one's mean over its steps."""
    return {f"client/{k}": float(v) for k, v in results.logged_means().items()}


def work_metrics(algorithm: Algorithm, results: RoundResults) -> dict[str, float]:
    """`clients/local_steps_{min,mean,max}` over the clients that trained, where each client's
    local work is drawn (`client.local_work`); nothing otherwise."""
    if not algorithm.ctx.client.varies:
        return {}
    steps = results.num_steps
    return {
        "clients/local_steps_min": min(steps),
        "clients/local_steps_mean": sum(steps) / len(steps),
        "clients/local_steps_max": max(steps),
    }


class Orchestrator:
    """Drives `rounds` rounds of configure -> local training -> attack -> aggregate -> evaluate.

    Everything that watches the run (loggers, checkpoints, progress, audits) is one of
    `callbacks` (`fedexp.core.callbacks`), called in list order with read-only round reports.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        executor,
        data,
        attack,
        *,
        seed: int,
        rounds: int,
        clients_per_round: int,
        eval_every: int,
        callbacks: Sequence[Callback] = (),
        personal_clients: int | None = None,
        finetune_epochs: int = 0,
        participation: Participation | None = None,
    ):
        self.algorithm = algorithm
        self.executor = executor
        self.data = data
        self.attack = attack
        self.seed = seed
        self.rounds = rounds
        # a natural split with fewer owners than asked: every client, each round
        self.clients_per_round = min(clients_per_round, data.num_clients)
        self.eval_every = eval_every
        # who takes part in a round (`sampling`, `dropout`, `availability`); None: uniform
        self.participation = participation or Participation(
            seed, data.num_clients, self.clients_per_round
        )
        self.personal_clients = personal_clients  # None: every client's personal model
        self.finetune_epochs = finetune_epochs  # K > 0: eval/finetuned/* at each evaluation
        self.callbacks = list(callbacks)
        self.train_data = attack.wrap_data(data)
        # attackers may train benignly beyond a round's cohort to learn more benign updates
        attack.use_aside(partial(train_aside, algorithm, executor, self.train_data, seed))
        self.totals = {"comm/up_bits_total": 0, "comm/down_bits_total": 0}
        self.train_seconds = 0.0  # summed round times (local training + aggregation)
        self.last_eval: dict = {}
        self.client_accs: dict = {}
        self.state: ServerState | None = None
        self.round = 0

    def run_round(self, state: ServerState, t: int) -> tuple[ServerState, dict]:
        start = time.perf_counter()
        # the attack may have a round re-drawn (`attack.redraw_majority`, FRL's reference code)
        cohort = self.participation.cohort(t, self.attack.rejects)
        ctx = RoundContext(t, cohort.sampled, self.seed)
        stats = self.algorithm.broadcast_stats(state)  # running statistics, besides the payloads
        payloads = self.algorithm.configure_round(state, ctx)  # every sampled client is sent it
        down = sum(payloads[c].num_bits() for c in ctx.client_ids)
        down += len(ctx.client_ids) * stats_bits(stats)
        if cohort.returned:  # the dropped clients do not train: their state stays as it was
            ctx = dataclasses.replace(ctx, client_ids=cohort.returned)
            state, metrics, up, steps = self.train_round(state, payloads, stats, ctx)
        else:  # nobody returns: the server state stays as it was
            lrs, attack = (
                self.algorithm.round_lrs(t),
                self.attack.round_metrics(RoundResults.empty()),
            )
            metrics, up, steps = {**lrs, **attack}, 0, 0
        self.totals["comm/up_bits_total"] += up
        self.totals["comm/down_bits_total"] += down
        elapsed = time.perf_counter() - start
        self.train_seconds += elapsed
        metrics = {
            "round": t,
            **metrics,
            **cohort.metrics(),  # clients/sampled, clients/returned, clients/dropped
            "comm/up_bits": up,
            "comm/down_bits": down,
            **self.totals,
            "time/round_s": elapsed,
            "time/client_steps_per_s": steps / elapsed if elapsed > 0 else 0.0,
        }
        return state, metrics

    def train_round(
        self, state: ServerState, payloads, stats, ctx: RoundContext
    ) -> tuple[ServerState, dict, int, int]:
        """The returned clients' training, the attack and the aggregation: (the next state, the
        round's metrics so far, the upload bits, the local steps)."""
        results = self.executor.run(self.algorithm, payloads, ctx, self.train_data, stats)
        results = self.attack.apply(results, ctx, state)
        # the aggregation is told how many uploads the attack corrupted (it flags them)
        ctx = dataclasses.replace(ctx, num_malicious=malicious_count(results))
        train_loss = float(results.train_loss.mean())
        if not math.isfinite(train_loss):
            raise Diverged(ctx.round, "non-finite training loss")
        state, metrics = self.algorithm.aggregate(state, results, ctx)
        if not self.algorithm.state_is_finite(state):
            raise Diverged(ctx.round, "non-finite global model")
        metrics = {
            "train/loss": train_loss,
            **self.algorithm.round_lrs(ctx.round),  # train/client_lr, train/server_lr
            **work_metrics(self.algorithm, results),
            **logged_means(results),
            **metrics,
            **self.attack.round_metrics(results),
        }
        return state, metrics, results.upload_bits(stats_bits), sum(results.num_steps)

    def run(self, state: ServerState | None = None, start_round: int = 1) -> dict:
        """Run to the last round; returns the metrics of the last evaluated round."""
        state = self.algorithm.init_state() if state is None else state
        self.state = state
        start = getattr(self.executor, "start", None)  # worker processes: the run's start-up
        if start is not None and start_round <= self.rounds:
            start(self.algorithm, self.train_data)
        for t in range(start_round, self.rounds + 1):
            state, metrics = self.run_round(state, t)
            self.state, self.round = state, t
            evaluated = t % self.eval_every == 0 or t == self.rounds
            if evaluated:
                scalars, self.client_accs = evaluate(
                    self.algorithm,
                    state,
                    self.data,
                    self.personal_clients,
                    self.seed,
                    self.finetune(t),
                )
                # an attack's test-time task (a backdoor): its success rate beside the accuracy
                scalars.update(
                    backdoor_metrics(
                        self.attack,
                        self.algorithm,
                        state,
                        self.data,
                        self.personal_clients,
                        self.seed,
                    )
                )
                metrics.update(scalars)
                self.last_eval = metrics
                for callback in self.callbacks:  # audits add their metrics to the round's
                    metrics.update(callback.on_evaluate(self.report(metrics, True)) or {})
            report = self.report(metrics, evaluated)
            for callback in self.callbacks:
                callback.on_round_end(report)
        return self.last_eval

    def finetune(self, t: int) -> Finetune | None:
        """Fine-tuning at round `t`'s evaluation (`eval.finetune_epochs`), or None when off."""
        if self.finetune_epochs == 0:
            return None
        return Finetune(self.finetune_epochs, self.algorithm.ctx.client, t)

    def report(self, metrics: dict, evaluated: bool) -> RoundReport:
        """The current round as callbacks see it (copies: a report never changes)."""
        return RoundReport(
            round=self.round,
            last_round=self.rounds,
            metrics=frozen(metrics),
            evaluated=evaluated,
            state=self.state,
            client_accs=frozen(self.client_accs),
            loop_state=frozen(self.state_dict()),
        )

    def state_dict(self) -> dict:
        """The loop's own running state (comm totals, last round and evaluation) for resume."""
        return {
            "round": self.round,
            "totals": dict(self.totals),
            "last_eval": dict(self.last_eval),
            "client_accs": dict(self.client_accs),
            "train_seconds": self.train_seconds,
        }

    def load_state_dict(self, state: dict) -> None:
        self.round = int(state["round"])
        self.totals = dict(state["totals"])
        self.last_eval = dict(state["last_eval"])
        self.client_accs = dict(state["client_accs"])
        self.train_seconds = float(state.get("train_seconds", 0.0))
