"""The claims `python -m fedexp.claims` checks: settings (CLI overrides) and claims over them.

A `Setting` is one configuration, run once per seed and shared by every claim that names it. A
`Claim` compares `Term`s (a metric of a setting, or its drop from a clean setting) with
`relations`; it holds in direction when every relation holds on the means over seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

ACC_GLOBAL = ("eval/global/acc",)
ACC_PERSONAL = ("eval/personal/acc_mean",)
GAP = ("eval/group/gap",)
MIA = ("privacy/mia_auc", "privacy/mia_acc")  # the first key every run reports is used
UP_BITS = ("comm/up_bits_total",)


@dataclass(frozen=True)
class Setting:
    """One configuration: `python -m fedexp <overrides> seed=<s>` for every seed.

    `cost` is the seconds one run took (CLI start-up included) in a full check on a shared
    2-core machine; settings start in decreasing order of it, so that parallel jobs end together.
    """

    id: str
    overrides: tuple[str, ...]
    cost: float


@dataclass(frozen=True)
class Term:
    """A quantity of a claim, one value per seed.

    Attributes:
        label: how the table names it.
        setting: the id of the setting whose runs give the metric.
        keys: summary metric keys, in order of preference (see `MIA`).
        clean: a setting id; then the value is metric(clean) − metric(setting), paired by seed
            (the accuracy an attack costs).
        unit: `acc` (fractions), `bits`.
    """

    label: str
    setting: str
    keys: tuple[str, ...]
    clean: str | None = None
    unit: str = "acc"


@dataclass(frozen=True)
class Claim:
    """A paper's headline claim and the comparison that checks its direction here.

    `relations` are (i, op, j) with op in `>`, `<`, `>=`, `<=`: terms[i] op terms[j].
    """

    id: str
    slug: str
    text: str
    paper: str
    setting: str
    terms: tuple[Term, ...]
    relations: tuple[tuple[int, str, int], ...]


# digits (1,797 8x8 images), 20 clients of 2-class shards, 10 a round, MLP 200-200, SGD lr 0.05
SHARDS = ("rounds=20", "client.local_epochs=5")
# docs/waffle.md's odd/even digits: 15 majority : 3 minority clients of 36 samples (42 there,
# measured without the server pool)
MULTIMODAL = (
    "partition=multimodal",
    "num_clients=18",
    "clients_per_round=6",
    "rounds=50",
    "eval_every=10",
    "client.local_epochs=5",
    "client.batch_size=10",
    "client.lr=0.02",
)
# iid digits, 10 clients of ~87 training images, many local epochs (an attack needs overfitting)
MIA_BASE = (
    "partition=iid",
    "privacy=mia",
    "num_clients=10",
    "clients_per_round=5",
    "rounds=10",
    "client.local_epochs=10",
    "client.batch_size=10",
    "client.lr=0.02",
    "privacy.num_targets=4",
)
FRL = ("experiment=frl_digits",)
# docs/robustness.md's FedAvg-family baselines on the frl_digits setting
DENSE = ("experiment=frl_digits", "client.lr=0.05", "client.momentum=0")
ATTACK20 = ("attack.fraction=0.2",)

HET = ("algorithm=fedhenn", "algorithm.variant=heterogeneous", "model=cnn_family")
TRMEAN = ("algorithm=fedavg", "aggregator=trimmed_mean")

_SETTINGS = [
    Setting("shards-fedavg", (*SHARDS, "algorithm=fedavg"), 26),
    Setting("shards-fedrep", (*SHARDS, "algorithm=fedrep"), 21),
    Setting("shards-fedhenn", (*SHARDS, "algorithm=fedhenn"), 50),
    Setting("shards-fedhenn-het", (*SHARDS, *HET), 75),
    Setting("shards-fedhenn-het-eta0", (*SHARDS, *HET, "algorithm.eta0=0"), 38),
    Setting("shards-waffle", (*SHARDS, "algorithm=waffle"), 55),
    Setting("multimodal-fedavg", (*MULTIMODAL, "algorithm=fedavg"), 45),
    Setting("multimodal-fedprox", (*MULTIMODAL, "algorithm=fedprox", "algorithm.mu=1.0"), 65),
    Setting("multimodal-waffle", (*MULTIMODAL, "algorithm=waffle"), 140),
    Setting("mia-fedavg", (*MIA_BASE, "algorithm=fedavg"), 45),
    Setting("mia-waffle", (*MIA_BASE, "algorithm=waffle"), 150),
    Setting("frl-clean", FRL, 18),
    Setting("frl-rr20", (*FRL, "attack=rank_reversal", *ATTACK20), 27),
    Setting("fedavg-clean", (*DENSE, "algorithm=fedavg"), 10),
    Setting("fedavg-trmean-clean", (*DENSE, *TRMEAN), 10),
    Setting("fedavg-trmean-agr20", (*DENSE, *TRMEAN, "attack=agr_tailored", *ATTACK20), 12),
    Setting("signsgd-clean", (*DENSE, "algorithm=signsgd"), 14),
    Setting("signsgd-flip20", (*DENSE, "algorithm=signsgd", "attack=sign_flip", *ATTACK20), 14),
]
SETTINGS: dict[str, Setting] = {s.id: s for s in _SETTINGS}

SHARDS_TEXT = "digits, 20 clients × 2-class shards, 10 a round, 20 rounds, E = 5"
FRL_TEXT = "`experiment=frl_digits`: digits, 50 clients, Dir(1), 10 a round, 40 rounds, E = 2"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "1",
        "fedhenn-homogeneous",
        "FedHeNN homogeneous personal > FedRep personal > FedAvg global (2-class shards)",
        "FedHeNN Table 2 (CIFAR-10/100, Sent140): homogeneous FedHeNN above FedRep and the "
        "FedAvg/FedProx global models (the table's values are not in the extracted text)",
        f"{SHARDS_TEXT}, MLP 200-200",
        (
            Term("FedHeNN homog.", "shards-fedhenn", ACC_PERSONAL),
            Term("FedRep", "shards-fedrep", ACC_PERSONAL),
            Term("FedAvg", "shards-fedavg", ACC_GLOBAL),
        ),
        ((0, ">", 1), (1, ">", 2)),
    ),
    Claim(
        "2",
        "fedhenn-heterogeneous",
        "FedHeNN heterogeneous > isolated local training (η = 0)",
        "FedHeNN Table 2: heterogeneous FedHeNN above the baselines; η = 0 is isolated local "
        "training (§3); gain smaller than homogeneous",
        f"{SHARDS_TEXT}, `model=cnn_family`, η0 = 0.01 vs 0",
        (
            Term("η0 = 0.01", "shards-fedhenn-het", ACC_PERSONAL),
            Term("η0 = 0", "shards-fedhenn-het-eta0", ACC_PERSONAL),
        ),
        ((0, ">", 1),),
    ),
    Claim(
        "3",
        "waffle-gap",
        "WAFFLe's majority − minority gap < FedAvg's and FedProx's (multimodal split)",
        "WAFFLe Table 2: FedAvg's minority (evens) ≈ 30 points below its majority (odds); "
        "WAFFLe's groups on par",
        "odd/even digits, 15 : 3 clients × 36 samples, 6 a round, 50 rounds, E = 5, B = 10, "
        "lr 0.02, FedProx μ = 1; `eval/group/gap`",
        (
            Term("WAFFLe gap", "multimodal-waffle", GAP),
            Term("FedAvg gap", "multimodal-fedavg", GAP),
            Term("FedProx gap", "multimodal-fedprox", GAP),
        ),
        ((0, "<", 1), (0, "<", 2)),
    ),
    Claim(
        "4",
        "waffle-unimodal",
        "WAFFLe personal > FedAvg global (unimodal 2-class shards)",
        "WAFFLe Table 1: CIFAR-10 unimodal, WAFFLe ahead of FedAvg/FedProx by 18.8 points",
        f"{SHARDS_TEXT}, MLP 200-200 (WAFFLe F = 32, α = 10)",
        (
            Term("WAFFLe", "shards-waffle", ACC_PERSONAL),
            Term("FedAvg", "shards-fedavg", ACC_GLOBAL),
        ),
        ((0, ">", 1),),
    ),
    Claim(
        "5",
        "waffle-mia",
        "WAFFLe's membership-inference AUC ≤ FedAvg's",
        "WAFFLe Table 3 (CIFAR-10, 1000 training images a client): the attack succeeds highly "
        "on FedAvg's upload, moderately above chance (50 %) on WAFFLe's",
        "iid digits, 10 clients × ~87 training images, 5 a round, 10 rounds, E = 10, B = 10, "
        "lr 0.02, `privacy=mia` (3 shadows, 4 targets)",
        (
            Term("WAFFLe", "mia-waffle", MIA),
            Term("FedAvg", "mia-fedavg", MIA),
        ),
        ((0, "<=", 1),),
    ),
    Claim(
        "6",
        "frl-vs-trimmed-mean",
        "FRL under 20 % rank reversal loses less accuracy than FedAvg + trimmed mean under "
        "20 % AGR-tailored (each against its clean run)",
        "FRL §7 / Table 1, FEMNIST 20 %: trimmed mean 85.8 → 56.2 %, FRL → 65.8 %",
        f"{FRL_TEXT}; FedAvg lr 0.05, β known; accuracy drop = clean − attacked, per seed",
        (
            Term("FRL drop", "frl-rr20", ACC_GLOBAL, clean="frl-clean"),
            Term(
                "trimmed-mean drop", "fedavg-trmean-agr20", ACC_GLOBAL, clean="fedavg-trmean-clean"
            ),
        ),
        ((0, "<", 1),),
    ),
    Claim(
        "7",
        "frl-upload",
        "FRL's upload (n·⌈log2 n⌉ bits a layer) < FedAvg's and > SignSGD's",
        "FRL Table 2: rankings cost less than FedAvg's 32-bit weights, more than SignSGD's 1 bit "
        "a weight",
        f"{FRL_TEXT}; `comm/up_bits_total` over the run",
        (
            Term("FRL", "frl-clean", UP_BITS, unit="bits"),
            Term("FedAvg", "fedavg-clean", UP_BITS, unit="bits"),
            Term("SignSGD", "signsgd-clean", UP_BITS, unit="bits"),
        ),
        ((0, "<", 1), (0, ">", 2)),
    ),
    Claim(
        "8",
        "signsgd-vs-frl",
        "SignSGD under 20 % sign flip loses more accuracy than FRL under 20 % rank reversal",
        "FRL Table 1: SignSGD under Bernstein et al.'s attack vs FRL under rank reversal; FRL the "
        "more robust",
        f"{FRL_TEXT}; SignSGD lr 0.05, server_lr 0.005; drop = clean − attacked, per seed",
        (
            Term("SignSGD drop", "signsgd-flip20", ACC_GLOBAL, clean="signsgd-clean"),
            Term("FRL drop", "frl-rr20", ACC_GLOBAL, clean="frl-clean"),
        ),
        ((0, ">", 1),),
    ),
)


def settings_of(claim: Claim) -> list[str]:
    """The setting ids a claim needs, in order of first use."""
    ids: list[str] = []
    for term in claim.terms:
        for sid in (term.setting, term.clean):
            if sid is not None and sid not in ids:
                ids.append(sid)
    return ids
