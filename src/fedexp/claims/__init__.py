"""`python -m fedexp.claims`: check the direction of the papers' headline claims on small data.

Each claim (`catalogue.CLAIMS`) compares a few settings run through the real CLI for several
seeds (`runner`), and holds in direction when its relations hold on the means (`verdict`). The
result is `claims.md` and `claims.json` in the output dir (`table`). See docs/CLAIMS.md.
"""

from fedexp.claims.catalogue import CLAIMS, SETTINGS
from fedexp.claims.claim import Claim, Setting, Term
from fedexp.claims.verdict import Measured, Verdict, evaluate, judge, measure

__all__ = [
    "CLAIMS",
    "SETTINGS",
    "Claim",
    "Measured",
    "Setting",
    "Term",
    "Verdict",
    "evaluate",
    "judge",
    "measure",
]
