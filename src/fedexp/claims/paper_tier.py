"""The protocol tier (`python -m fedexp.claims --tier paper`): the papers' populations and
protocols on MNIST-1D, a generated data set harder than the 8x8 digits.

Every dimension follows the paper's setting except the data (MNIST-1D instead of MNIST/CIFAR-10,
fewer samples a client where a run would not fit a 2-core machine), the model (the 200-200 MLP)
and the number of rounds (fewer than the papers'; each setting says how many):

- FRL (claims 6, 8, 10): 1 000 clients, 25 a round, Dirichlet(1), 20 % of all clients malicious,
  the attackers' pool and the round re-draw of the reference code, E = 2, batch 8, the paper's
  attack against each method (`attack=frl_paper`: rank reversal, AGR-tailored, sign flip) and the
  reference code's dense learning rates (`paper=frl`).
- WAFFLe (claims 3, 4, 4m, 5): the unimodal split (100 clients of 2-class shards) and the
  multimodal split of 100 majority : 20 minority clients, C = 0.1, E = 5, B = 10, T = 100 for
  the gap (claim 3); the MIA on 40 iid clients with enough epochs over few samples to overfit.
- FedHeNN (claims 1, 1b, 2, 9): 100 clients of 5-class shards, 10 % a round, E = 20, the
  authors' local training, the RAD drawn from a server pool; claim 2's heterogeneous clients
  each get one of 5 MLPs of 1 to 3 hidden layers (`model=mlp_family`), the paper's CNN family
  on flat inputs. Claims 2 and 9 run η0 over {0, 0.001, 0.01, 0.1, 1, 10} at both layers FedHeNN
  can align (rows 2a and 9a measure what the term does).

A claim keeps the terms whose settings the tier defines; one whose compared terms are not all
defined is not in the tier.
"""

from __future__ import annotations

from dataclasses import replace

from fedexp.claims.catalogue import WAFFLE_RESULTS, WAFFLE_TABLE1
from fedexp.claims.claim import (
    ACC_CLIENTS,
    ACC_PERSONAL,
    ALIGN_DIST,
    GRAD_RATIO,
    Claim,
    Setting,
    Term,
)

MNIST1D = ("dataset=mnist1d", "model=mlp")
ATTACK20 = ("attack=frl_paper", "attack.fraction=0.2")

# FRL: frl_mnist_dir1 (the paper's MNIST protocol) on MNIST-1D; 48 samples a client
# evaluated every 5 rounds: an attack's drop is the mean of the last 10 evaluations (rounds
# 105-150)
FRL = ("experiment=frl_mnist_dir1", *MNIST1D, "~model.bias", "rounds=150", "eval_every=5")
# WAFFLe's multimodal split: 100 : 20 clients of 2 classes, 78 samples each (20 000 generated),
# the paper's T = 100 rounds
WAFFLE = (
    "experiment=waffle_mnist_multimodal",
    *MNIST1D,
    "dataset.num_samples=20000",
    "rounds=100",
    "eval_every=20",
)
# WAFFLe's unimodal split (Table 1): 100 clients of 2-class shards, C = 0.1, E = 5, B = 10
UNIMODAL = (
    "experiment=waffle_mnist_unimodal",
    *MNIST1D,
    "dataset.num_samples=20000",
    "rounds=60",
    "eval_every=20",
)
# WAFFLe's MIA: 40 iid clients of 276 training samples (395 with test and validation), E = 5
MIA = (
    "experiment=waffle_cifar10_mia",
    *MNIST1D,
    "dataset.num_samples=20000",
    "rounds=30",
    "eval_every=15",
    "privacy.num_targets=4",
)
# FedHeNN: 100 clients of 5-class shards (70 samples, 49 to train), 10 a round, E = 20; RAD 200
# re-drawn every round from a pool of 1 000
FEDHENN = (
    "experiment=fedhenn_cifar10_homogeneous",
    *MNIST1D,
    "dataset.num_samples=10000",
    "partition.server_pool=1000",
    "rounds=30",
    "eval_every=15",
)
# claim 2: the same population and protocol, each client's MLP drawn from a family of 5
FEDHENN_HET = (
    "experiment=fedhenn_cifar10_heterogeneous",
    "dataset=mnist1d",
    "model=mlp_family",
    "dataset.num_samples=10000",
    "partition.server_pool=1000",
    "rounds=30",
    "eval_every=15",
)
RAD = ("algorithm.rad_size=200",)
# FedHeNN's alignment, measured: η0 over its range at each layer it can align (the body's output,
# the paper's text; the network's output, the authors' code)
ETAS = ("0", "0.001", "0.01", "0.1", "1", "10")
LAYERS = ("body", "output")


def align_id(layer: str, eta: str, prefix: str = "shards-fedhenn") -> str:
    """`shards-fedhenn` (body, η0 = 0.01), `shards-fedhenn-eta0`, `shards-fedhenn-out-eta1`,
    `shards-fedhenn-het-out-eta10`..."""
    layer_part = "" if layer == "body" else "-out"
    eta_part = "" if eta == "0.01" else f"-eta{eta}"
    return f"{prefix}{layer_part}{eta_part}"


def alignment_terms(prefix: str = "shards-fedhenn") -> tuple[Term, ...]:
    """For each (layer, η0): personal accuracy, the distance at round end, the gradient ratio."""
    terms = []
    for layer in LAYERS:
        for eta in ETAS:
            sid, tag = align_id(layer, eta, prefix), f"{layer}, η0 = {eta}"
            terms += [
                Term(f"acc ({tag})", sid, ACC_PERSONAL),
                Term(f"1 − CKA at round end ({tag})", sid, ALIGN_DIST, unit="fine"),
                Term(f"|η∇d| / |∇F| ({tag})", sid, GRAD_RATIO, unit="fine"),
            ]
    return tuple(terms)


_SETTINGS = [
    Setting("frl-clean", (*FRL, "algorithm=frl"), 200),
    Setting("frl-rr20", (*FRL, "algorithm=frl", *ATTACK20), 550),
    Setting("fedavg-trmean-clean", (*FRL, "algorithm=fedavg", "aggregator=trimmed_mean"), 250),
    Setting(
        "fedavg-trmean-agr20",
        (*FRL, "algorithm=fedavg", "aggregator=trimmed_mean", *ATTACK20),
        460,
    ),
    Setting("signsgd-clean", (*FRL, "algorithm=signsgd"), 200),
    Setting("signsgd-flip20", (*FRL, "algorithm=signsgd", *ATTACK20), 250),
    Setting(
        "smavg-trmean-clean", (*FRL, "algorithm=supermask_fedavg", "aggregator=trimmed_mean"), 250
    ),
    Setting(
        "smavg-trmean-agr20",
        (*FRL, "algorithm=supermask_fedavg", "aggregator=trimmed_mean", *ATTACK20),
        700,
    ),
    Setting("multimodal-waffle", (*WAFFLE, "algorithm=waffle"), 500),
    Setting("multimodal-fedavg", (*WAFFLE, "algorithm=fedavg", "client=waffle"), 200),
    Setting("multimodal-fedprox", (*WAFFLE, "algorithm=fedprox", "client=waffle"), 250),
    Setting("shards-waffle", (*UNIMODAL, "algorithm=waffle"), 300),
    Setting(
        "shards-fedavg-wfc",
        (*UNIMODAL, "algorithm=fedavg", "client=waffle", "algorithm.weighting=uniform"),
        120,
    ),
    Setting("mia-waffle", (*MIA, "algorithm=waffle"), 300),
    Setting("mia-fedavg", (*MIA, "algorithm=fedavg"), 120),
    *[
        Setting(
            align_id(layer, eta, prefix),
            (
                *base,
                "algorithm=fedhenn",
                *RAD,
                f"algorithm.eta0={eta}",
                f"algorithm.align_layer={layer}",
            ),
            cost_off if eta == "0" else cost_on,
        )
        for prefix, base, cost_off, cost_on in (
            ("shards-fedhenn", FEDHENN, 400, 520),
            ("shards-fedhenn-het", FEDHENN_HET, 60, 330),
        )
        for layer in LAYERS
        for eta in ETAS
    ],  # fmt: skip
    Setting("shards-fedrep-fhc", (*FEDHENN, "algorithm=fedrep", "client=fedhenn"), 200),
    Setting("shards-fedprox-fhc", (*FEDHENN, "algorithm=fedprox", "client=fedhenn"), 220),
    Setting("shards-fedavg-fhc", (*FEDHENN, "algorithm=fedavg", "client=fedhenn"), 200),
]
SETTINGS: dict[str, Setting] = {s.id: s for s in _SETTINGS}

# claims this tier adds to the catalogue's: WAFFLe's Table-1 claim on the multimodal split too
# (the paper states both; the unimodal one is claim 4 itself)
EXTRA = (
    Claim(
        "4m",
        "waffle-multimodal",
        "WAFFLe (personal) > FedAvg (global) on the clients' local test splits (multimodal "
        "100 : 20 split)",
        "WAFFLe Table 1: CIFAR-10 multimodal, WAFFLe ahead of the other methods by 20.9 points",
        "WAFFLe's personal accuracy vs FedAvg's global model, both on the clients' local test "
        "splits, both with WAFFLe's local training",
        (
            Term("WAFFLe", "multimodal-waffle", ACC_PERSONAL),
            Term("FedAvg", "multimodal-fedavg", ACC_CLIENTS),
        ),
        ((0, ">", 1),),
        quote=WAFFLE_TABLE1,
        section=WAFFLE_RESULTS,
    ),
    *(
        Claim(
            f"{claim}a",
            f"fedhenn-{variant}-alignment-measured",
            f"FedHeNN {variant}: what the alignment term does, over η0 and the aligned layer",
            "no figure: the paper reports accuracies only",
            "personal accuracy, the distance d (1 − CKA on the round's RAD) the clients reach at "
            "the end of a round, and |η∇d| / |∇F| there (cohort means, last evaluated round)",
            alignment_terms(prefix),
            (),
            section="the project's: a measurement of FedHeNN's alignment term",
        )
        for claim, variant, prefix in (
            ("2", "heterogeneous", "shards-fedhenn-het"),
            ("9", "homogeneous", "shards-fedhenn"),
        )
    ),
)


def tier_claim(claim: Claim) -> Claim | None:
    """`claim` as this tier runs it, with the terms whose settings the tier defines; None where
    a compared term's setting is missing."""
    defined = [
        i
        for i, t in enumerate(claim.terms)
        if t.setting in SETTINGS and (t.clean is None or t.clean in SETTINGS)
    ]
    compared = {i for rel in claim.relations for i in (rel[0], rel[2])}
    if not compared <= set(defined):
        return None
    index = {old: new for new, old in enumerate(defined)}
    return replace(
        claim,
        terms=tuple(claim.terms[i] for i in defined),
        relations=tuple((index[a], op, index[b]) for a, op, b in claim.relations),
    )
