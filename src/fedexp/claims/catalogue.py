"""The claims `python -m fedexp.claims` checks: settings (CLI overrides) and claims over them.

A `Setting` is one configuration, run once per seed and shared by every claim that names it. A
`Claim` compares `Term`s (a metric of a setting, or its drop from a clean setting) with
`relations`; it holds in direction when every relation holds on the means over seeds.
"""

from __future__ import annotations

from fedexp.claims.claim import (
    ACC_CLIENTS,
    ACC_GLOBAL,
    ACC_PERSONAL,
    GAP,
    MIA,
    UP_BITS,
    Claim,
    Setting,
    Term,
)

# digits (1,797 8x8 images), 20 clients of 2-class shards, 10 a round, MLP 200-200, SGD lr 0.05
# one server pool for every method compared with FedHeNN (its RAD of 100 is drawn from it)
SHARDS = ("rounds=20", "client.local_epochs=5", "partition.server_pool=200")
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
# evaluated every round: an attack's drop is the mean of the last 10 evaluations (rounds 31-40)
FRL = ("experiment=frl_digits", "eval_every=1")
# docs/robustness.md's FedAvg-family baselines on the frl_digits setting
DENSE = ("experiment=frl_digits", "eval_every=1", "client.lr=0.05", "client.momentum=0")
ATTACK20 = ("attack.fraction=0.2",)

HET = ("algorithm=fedhenn", "algorithm.variant=heterogeneous", "model=cnn_family")
TRMEAN = ("algorithm=fedavg", "aggregator=trimmed_mean")
# FedAvg over FRL's own supermask (the same seeded network, FRL's client training and lr): the
# scores are averaged, trimmed, instead of voted on
SM_TRMEAN = ("algorithm=supermask_fedavg", "aggregator=trimmed_mean")

# the ablations' values of FedHeNN's η0 (0.01: the default; 0: no alignment, identical training)
ETAS = ("0", "0.001", "0.01", "0.1", "1")


def _eta_settings(prefix: str, base: tuple[str, ...], cost: float) -> list[Setting]:
    """One setting per η0 of `ETAS`: `<prefix>` for the default 0.01, `<prefix>-eta<v>` else."""
    return [
        Setting(prefix if eta == "0.01" else f"{prefix}-eta{eta}", (*base, f"algorithm.eta0={eta}"),
                cost)
        for eta in ETAS
    ]  # fmt: skip


_SETTINGS = [
    # every method of a comparison trains its clients alike: FedHeNN's local training
    # (client=fedhenn) for claim 1, WAFFLe's (client=waffle) for claim 4
    Setting("shards-fedavg-fhc", (*SHARDS, "algorithm=fedavg", "client=fedhenn"), 40),
    Setting("shards-fedrep-fhc", (*SHARDS, "algorithm=fedrep", "client=fedhenn"), 40),
    Setting("shards-fedprox-fhc", (*SHARDS, "algorithm=fedprox", "client=fedhenn"), 45),
    *_eta_settings("shards-fedhenn", (*SHARDS, "algorithm=fedhenn"), 50),
    *_eta_settings("shards-fedhenn-het", (*SHARDS, *HET), 75),
    # WAFFLe averages its clients uniformly: so does its FedAvg here
    Setting(
        "shards-fedavg-wfc",
        (*SHARDS, "algorithm=fedavg", "client=waffle", "algorithm.weighting=uniform"),
        35,
    ),
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
    Setting("smavg-trmean-clean", (*FRL, *SM_TRMEAN), 20),
    Setting("smavg-trmean-agr20", (*FRL, *SM_TRMEAN, "attack=agr_tailored", *ATTACK20), 30),
    Setting("signsgd-clean", (*DENSE, "algorithm=signsgd"), 14),
    Setting("signsgd-flip20", (*DENSE, "algorithm=signsgd", "attack=sign_flip", *ATTACK20), 14),
]
SETTINGS: dict[str, Setting] = {s.id: s for s in _SETTINGS}

HENN_RESULTS = "FedHeNN, Experiments: results (Table 2)"
HENN_BETTER = (
    "The results for comparisons of the personalised models are reported in Table 2 and the "
    "results demonstrate that the FedHeNN's performance is better than the baselines."
)
WAFFLE_TABLE1 = (
    "WAFFLe’s local test performance outstripping the other methods by 18.8% and 20.9% for "
    "unimodal and multimodal settings, respectively."
)
WAFFLE_RESULTS = "WAFFLe, Experiments: results (Table 1)"
FRL_TABLE1 = (
    "for FEMNIST, 10% (20%) malicious clients reduce accuracy of the global model from 85.8% "
    "to 72.7% (56.2%) for Trimmed-Mean, and to 80.9% (23.7%) for Multi-krum, while FRL accuracy "
    "decreases to 83.0% (65.8%)."
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "1",
        "fedhenn-homogeneous",
        "FedHeNN homogeneous (personal) > each baseline: FedRep (personal), FedAvg and FedProx "
        "(global), on the clients' local test splits (2-class shards)",
        "FedHeNN Table 2 (CIFAR-10/100, Sent140): homogeneous FedHeNN above FedRep and the "
        "FedAvg/FedProx global models (the table's values are not in the extracted text)",
        "every method on the clients' local test splits, averaged over clients (the paper's "
        "metric: global models evaluated there too); the four train their clients alike "
        "(FedHeNN's local training)",
        (
            Term("FedHeNN homog.", "shards-fedhenn", ACC_PERSONAL),
            Term("FedRep", "shards-fedrep-fhc", ACC_PERSONAL),
            Term("FedAvg", "shards-fedavg-fhc", ACC_CLIENTS),
            Term("FedProx", "shards-fedprox-fhc", ACC_CLIENTS),
        ),
        ((0, ">", 1), (0, ">", 2), (0, ">", 3)),
        quote=HENN_BETTER,
        section=HENN_RESULTS,
    ),
    Claim(
        "1b",
        "fedrep-vs-fedavg",
        "FedRep (personal) > FedAvg (global), on the clients' local test splits (2-class shards)",
        "no number of the papers: a relation between two of FedHeNN's baselines",
        "the two baselines of claim 1, same runs and metric",
        (
            Term("FedRep", "shards-fedrep-fhc", ACC_PERSONAL),
            Term("FedAvg", "shards-fedavg-fhc", ACC_CLIENTS),
        ),
        ((0, ">", 1),),
        section="the project's: two of FedHeNN's baselines compared",
    ),
    Claim(
        "2",
        "fedhenn-heterogeneous",
        "FedHeNN heterogeneous > isolated local training of the same models (η = 0)",
        "FedHeNN Table 2: heterogeneous FedHeNN above the baselines; η = 0 is isolated local "
        "training (§3); gain smaller than homogeneous",
        "personal accuracy, η0 = 0.01 (the default) vs 0 (isolated local training), identical "
        "client training; the other η0 values show the direction of the CKA term",
        (
            Term("η0 = 0.01", "shards-fedhenn-het", ACC_PERSONAL),
            Term("η0 = 0", "shards-fedhenn-het-eta0", ACC_PERSONAL),
            Term("η0 = 0.001", "shards-fedhenn-het-eta0.001", ACC_PERSONAL),
            Term("η0 = 0.1", "shards-fedhenn-het-eta0.1", ACC_PERSONAL),
            Term("η0 = 1", "shards-fedhenn-het-eta1", ACC_PERSONAL),
        ),
        ((0, ">", 1),),
        quote=HENN_BETTER + " For the heterogeneous FedHeNN, the objective function given in "
        "equation (6) boils down to individual clients training their own local models in "
        "isolation using only the local data [for η = 0].",
        section=HENN_RESULTS + "; the method: the case η = 0",
    ),
    Claim(
        "3",
        "waffle-gap",
        "WAFFLe's majority − minority gap < FedAvg's and FedProx's (multimodal split)",
        "WAFFLe Table 2: FedAvg's minority (evens) ≈ 30 points below its majority (odds); "
        "WAFFLe's groups on par",
        "`eval/group/gap`: best − worst client group's mean local test accuracy (odd/even "
        "digits); WAFFLe's personal models, the baselines' global model",
        (
            Term("WAFFLe gap", "multimodal-waffle", GAP),
            Term("FedAvg gap", "multimodal-fedavg", GAP),
            Term("FedProx gap", "multimodal-fedprox", GAP),
        ),
        ((0, "<", 1), (0, "<", 2)),
        quote="FedAvg's performance for the “evens” group of clients is almost 30% lower than "
        "that of the “odds” group. [...] WAFFLe is able to successfully model them, with "
        "performances on par with the overall population.",
        section="WAFFLe, Experiments: fairness, multimodal split (Table 2)",
    ),
    Claim(
        "4",
        "waffle-unimodal",
        "WAFFLe (personal) > FedAvg (global) on the clients' local test splits (unimodal "
        "2-class shards)",
        "WAFFLe Table 1: CIFAR-10 unimodal, WAFFLe ahead of FedAvg/FedProx by 18.8 points",
        "WAFFLe's personal accuracy vs its dense counterpart FedAvg's global model, both on the "
        "clients' local test splits (the paper's \"local test performance\"), at the same budget "
        "(WAFFLe's local training)",
        (
            Term("WAFFLe", "shards-waffle", ACC_PERSONAL),
            Term("FedAvg", "shards-fedavg-wfc", ACC_CLIENTS),
        ),
        ((0, ">", 1),),
        quote=WAFFLE_TABLE1,
        section=WAFFLE_RESULTS,
    ),
    Claim(
        "5",
        "waffle-mia",
        "WAFFLe's membership-inference AUC ≤ FedAvg's",
        "WAFFLe Table 3 (CIFAR-10, 1000 training images a client): the attack succeeds highly "
        "on FedAvg's upload, moderately above chance (50 %) on WAFFLe's",
        "membership-inference AUC on the eavesdropped uploads (`privacy=mia`)",
        (
            Term("WAFFLe", "mia-waffle", MIA),
            Term("FedAvg", "mia-fedavg", MIA),
        ),
        ((0, "<=", 1),),
        quote="MIA success rate on WAFFLe is only moderately higher than random chance (50%). "
        "This means it is significantly harder to identify the private training data for "
        "WAFFLe, relative to FedAvg.",
        section="WAFFLe, Experiments: membership inference (Table 3)",
    ),
    Claim(
        "6",
        "frl-vs-trimmed-mean",
        "FRL under 20 % rank reversal loses less accuracy than FedAvg + trimmed mean under "
        "20 % AGR-tailored (each against its clean run)",
        "FRL §7 / Table 1, FEMNIST 20 %: trimmed mean 85.8 → 56.2 %, FRL → 65.8 %",
        "accuracy drop of the global model on the pooled test set = clean − attacked, paired "
        "by seed, mean over the last 10 evaluated rounds (the final round beside it)",
        (
            Term("FRL drop", "frl-rr20", ACC_GLOBAL, clean="frl-clean"),
            Term(
                "trimmed-mean drop", "fedavg-trmean-agr20", ACC_GLOBAL, clean="fedavg-trmean-clean"
            ),
        ),
        ((0, "<", 1),),
        quote=FRL_TABLE1,
        section="FRL, Experiments: robustness (Table 1)",
    ),
    Claim(
        "7",
        "frl-upload",
        "FRL's upload (n·⌈log2 n⌉ bits a layer) < FedAvg's and > SignSGD's",
        "FRL Table 2: rankings cost less than FedAvg's 32-bit weights, more than SignSGD's 1 bit "
        "a weight",
        "`comm/up_bits_total` over the run: an identity of the ledger's formulas (n·⌈log2 n⌉ "
        "bits a ranked layer, 32 a weight, 1 a sign), which cannot fail while they hold",
        (
            Term("FRL", "frl-clean", UP_BITS, unit="bits"),
            Term("FedAvg", "fedavg-clean", UP_BITS, unit="bits"),
            Term("SignSGD", "signsgd-clean", UP_BITS, unit="bits"),
        ),
        ((0, "<", 1), (0, ">", 2)),
        quote="In FRL, both clients and server communicate just the edge ranks instead of weight "
        "parameters. Thus, FRL reduces both upload and download communication cost. [FRL > "
        "SignSGD: Table 2's figures, no sentence]",
        section="FRL, Experiments: communication cost (Table 2)",
    ),
    Claim(
        "8",
        "signsgd-vs-frl",
        "SignSGD under 20 % sign flip loses more accuracy than FRL under 20 % rank reversal",
        "FRL Table 1 lists SignSGD under Bernstein et al.'s attack beside FRL under rank "
        "reversal; no sentence compares them",
        "accuracy drop of the global model on the pooled test set = clean − attacked, paired "
        "by seed, mean over the last 10 evaluated rounds (the final round beside it)",
        (
            Term("SignSGD drop", "signsgd-flip20", ACC_GLOBAL, clean="signsgd-clean"),
            Term("FRL drop", "frl-rr20", ACC_GLOBAL, clean="frl-clean"),
        ),
        ((0, ">", 1),),
        section="the project's: a relation of FRL Table 1's figures, stated by no sentence",
    ),
    Claim(
        "9",
        "fedhenn-alignment",
        "FedHeNN homogeneous: the CKA alignment (η0 = 0.01) lifts personal accuracy above η0 = 0",
        "FedHeNN §3, Table 2: the alignment term is what FedHeNN adds to its clients' training "
        "(η = 0 leaves FedAvg's local models)",
        "personal accuracy over η0, identical client training; η0 = 0 is FedAvg's clients "
        "evaluated on their own local models",
        (
            Term("η0 = 0.01", "shards-fedhenn", ACC_PERSONAL),
            Term("η0 = 0", "shards-fedhenn-eta0", ACC_PERSONAL),
            Term("η0 = 0.001", "shards-fedhenn-eta0.001", ACC_PERSONAL),
            Term("η0 = 0.1", "shards-fedhenn-eta0.1", ACC_PERSONAL),
            Term("η0 = 1", "shards-fedhenn-eta1", ACC_PERSONAL),
        ),
        ((0, ">", 1),),
        section="the project's: an ablation of FedHeNN's η (the method: η = 0 is FedAvg)",
    ),
    Claim(
        "10",
        "frl-vote",
        "On FRL's own supermask, the rank vote under 20 % rank reversal loses less accuracy than "
        "the trimmed mean of the scores under 20 % AGR-tailored",
        "FRL §5–7: the vote bounds what each client can move (a ranking is a permutation), which "
        "FRL credits for its robustness; the ablation keeps FRL's network and client training",
        "accuracy drop = clean − attacked, paired by seed, mean over the last 10 evaluated "
        "rounds; `supermask_fedavg` trains FRL's network as FRL does and averages (trims) the "
        "scores instead of voting",
        (
            Term("FRL (vote) drop", "frl-rr20", ACC_GLOBAL, clean="frl-clean"),
            Term(
                "scores, trimmed mean drop",
                "smavg-trmean-agr20",
                ACC_GLOBAL,
                clean="smavg-trmean-clean",
            ),
            Term("FRL clean", "frl-clean", ACC_GLOBAL),
            Term("scores, trimmed mean clean", "smavg-trmean-clean", ACC_GLOBAL),
        ),
        ((0, "<", 1),),
        section="the project's: an ablation of FRL's vote on its own supermask",
    ),
)
