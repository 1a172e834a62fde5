"""What a claim is made of: `Setting` (CLI overrides run once per seed), `Term` (a metric of a
setting, or its drop from a clean setting), `Claim` (terms compared by relations), and the
metric keys with the quantity each measures."""

from __future__ import annotations

from dataclasses import dataclass

ACC_GLOBAL = ("eval/global/acc",)  # the global model on the pooled test set
# the global model on each client's local test split, averaged over clients: what FedHeNN and
# WAFFLe report for every method ("the average test accuracy obtained on the clients' test
# datasets"), global ones included
ACC_CLIENTS = ("eval/global/client_acc_mean",)
ACC_PERSONAL = ("eval/personal/acc_mean",)
GAP = ("eval/group/gap",)
MIA = ("privacy/mia_auc", "privacy/mia_acc")  # the first key every run reports is used
UP_BITS = ("comm/up_bits_total",)

# what a metric measures: two sides of a relation must measure the same quantity (a personal
# model's and a global model's accuracy on the clients' local test splits are one quantity)
QUANTITY = {
    "eval/global/acc": "accuracy on the pooled test set",
    "eval/global/client_acc_mean": "accuracy on the clients' local test splits, client mean",
    "eval/personal/acc_mean": "accuracy on the clients' local test splits, client mean",
    "eval/group/gap": "best − worst client group's local test accuracy",
    "privacy/mia_auc": "membership-inference attack on the uploads",
    "privacy/mia_acc": "membership-inference attack on the uploads",
    "comm/up_bits_total": "bits uploaded over the run",
    "fedhenn/align_dist_last": "FedHeNN's alignment distance at the end of a round",
    "fedhenn/grad_ratio": "FedHeNN's |η∇d| / |∇F|",
}
ALIGN_DIST = ("fedhenn/align_dist_last",)
GRAD_RATIO = ("fedhenn/grad_ratio",)


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
    window: str = ""  # a drop's rounds: `last 10` (default for a drop) or `final`

    def __post_init__(self) -> None:
        if not self.window:
            object.__setattr__(self, "window", "last 10" if self.clean else "final")
        if self.window not in ("last 10", "final"):
            raise ValueError(f"Term {self.label}: window must be 'last 10' or 'final'")

    @property
    def quantity(self) -> str:
        """What the term measures (`QUANTITY`), a drop of it where it has a clean setting."""
        what = QUANTITY.get(self.keys[0], self.keys[0])
        return f"drop of {what} over the {self.window} evaluations" if self.clean else what


@dataclass(frozen=True)
class Claim:
    """A paper's headline claim and the comparison that checks its direction here.

    `relations` are (i, op, j) with op in `>`, `<`, `>=`, `<=`: terms[i] op terms[j]; the two
    sides of every relation measure the same quantity (`Term.quantity`), or the claim is
    refused when it is defined. `quote` is the paper's sentence the claim checks and `section`
    where it stands; a claim without a quote is the project's own (a finding of an ablation, a
    relation the paper's tables show but no sentence states), and says so.
    """

    id: str
    slug: str
    text: str
    paper: str
    note: str  # what is measured; the settings themselves are printed from their configs
    terms: tuple[Term, ...]
    relations: tuple[tuple[int, str, int], ...]
    quote: str = ""
    section: str = ""

    def __post_init__(self) -> None:
        for i, op, j in self.relations:
            if op not in (">", "<", ">=", "<="):
                raise ValueError(f"claim {self.id}: relation {op!r} is not >, <, >= or <=")
            a, b = self.terms[i], self.terms[j]
            if a.quantity != b.quantity:
                raise ValueError(
                    f"claim {self.id}: {a.label} measures {a.quantity}, {b.label} "
                    f"{b.quantity}: a relation compares one quantity on both sides"
                )
        if not self.section:
            raise ValueError(f"claim {self.id}: no section (where the paper states it)")
        if self.quote and not self.relations:
            raise ValueError(f"claim {self.id}: a quoted claim compares something")


def settings_of(claim: Claim) -> list[str]:
    """The setting ids a claim needs, in order of first use."""
    ids: list[str] = []
    for term in claim.terms:
        for sid in (term.setting, term.clean):
            if sid is not None and sid not in ids:
                ids.append(sid)
    return ids
