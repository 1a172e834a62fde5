"""FedPer (Arivazhagan et al., 2019, "Federated Learning with Personalization Layers").

The model splits into shared base layers (`body`) and personalization layers (`head`), the same
split as FedRep. Each round a client loads the global body and its own head, and trains both
jointly with one optimizer for `client.local_epochs` (one phase: the paper's Algorithm 1 runs
SGD on (W_B, W_P) together, unlike FedRep's alternating head/body phases). Only the body
delta is uploaded and averaged (FedAvg's server step, Algorithm 1's W_B aggregation); the head
stays in the client store. A client never sampled uses the initial head. There is no global
head, so only personal metrics are reported.
"""

from __future__ import annotations

from torch import nn

from fedexp.algorithms.fedavg import FedAvg
from fedexp.algorithms.fedrep import FedRep
from fedexp.core.client import ClientModule
from fedexp.core.user_module import check_head_body


class FedPer(FedRep):
    """FedRep's storage of heads and body-only uploads, with one joint training phase."""

    def __init__(self, ctx, **kwargs):
        # FedRep's phase lengths are unused: the joint phase lasts client.local_epochs
        FedAvg.__init__(self, ctx, **kwargs)

    def make_module(self, model: nn.Module) -> ClientModule:
        check_head_body(model, "FedPer")
        return ClientModule(model, self.ctx.client)

    def run_warnings(self, rounds: int) -> list[str]:
        return []  # one joint phase of client.local_epochs: no part is left untrained
