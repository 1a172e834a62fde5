"""`python -m fedexp.claims`: the direction logic on hand-made numbers, and one real claim run.

The end-to-end case runs the cheapest claim (7, FRL's upload between SignSGD's and FedAvg's) for
one seed and two rounds through the real CLI; its bit counts are checkable by hand.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from fedexp.claims.__main__ import main, select
from fedexp.claims.catalogue import CLAIMS, SETTINGS
from fedexp.claims.claim import Term, settings_of
from fedexp.claims.table import BEGIN, END, markers, row, update_doc
from fedexp.claims.tiers import TIERS, tier
from fedexp.claims.verdict import Measured, evaluate, judge, measure, sample_std
from fedexp.core.summary import RunSummary
from fedexp.core.types import ConfigError


def m(label: str, *values: float) -> Measured:
    return Measured(label, "k", dict(enumerate(values)))


def runs(key: str, *values: float) -> dict[int, RunSummary]:
    """Fake completed runs: seed i reports values[i] under key."""
    return {seed: RunSummary("completed", metrics={key: v}) for seed, v in enumerate(values)}


def test_sample_std_uses_n_minus_one():
    assert sample_std([1.0, 2.0, 3.0]) == 1.0  # squares 1 + 0 + 1 over n − 1 = 2
    assert sample_std([0.25, 0.75]) == pytest.approx(0.125**0.5)  # (0.0625 + 0.0625) / 1
    assert sample_std([0.9]) == 0.0


def test_a_paired_interval_by_hand():
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(0.975, 2) = 4.3027: half 0.2484
    a, b = m("A", 0.6, 0.7, 0.8), m("B", 0.5, 0.5, 0.5)
    (interval,) = judge([a, b], ((0, ">", 1),)).intervals
    assert interval.n == 3 and interval.mean == pytest.approx(0.2)
    assert interval.high - interval.mean == pytest.approx(4.302653 * 0.1 / 3**0.5, rel=1e-5)
    assert interval.low == pytest.approx(-0.0484, abs=1e-4)  # crosses 0: inconclusive
    assert interval.verdict == "inconclusive"


def test_yes_no_and_inconclusive_come_from_the_interval():
    # paired: B is A minus 0.1 on every seed: a zero-width interval at +0.1
    a, b = m("A", 0.9, 0.6, 0.8), m("B", 0.8, 0.5, 0.7)
    assert judge([a, b], ((0, ">", 1),)).text() == "yes"  # pairs differ by seed, sd 0
    assert judge([a, b], ((0, "<", 1),)).text() == "no"  # excluded the other way
    assert judge([a, b], ((0, "<", 1),)).failed == ["A < B"]
    # the unpaired spread (0.9 / 0.6 / 0.8) is large, the paired one is not
    noisy = m("C", 0.95, 0.45, 0.8)  # differences from B: +0.15, −0.05, +0.1
    assert judge([noisy, b], ((0, ">", 1),)).text() == "inconclusive"
    assert judge([b, noisy], ((0, ">", 1),)).text() == "inconclusive"  # a "no" needs it too
    one = judge([m("A", 0.9), m("B", 0.1)], ((0, ">", 1),))
    assert one.text() == "inconclusive"  # one seed: no interval


def test_a_chain_needs_every_link():
    a, b, c = m("A", 0.9, 0.91, 0.92), m("B", 0.8, 0.81, 0.8), m("C", 0.7, 0.7, 0.72)
    assert judge([a, b, c], ((0, ">", 1), (1, ">", 2))).text() == "yes"
    broken = judge([a, c, b], ((0, ">", 1), (1, ">", 2)))  # C > B fails clearly
    assert broken.text() == "no" and broken.failed == ["C > B"] and broken.holds is False


def test_sides_measuring_different_quantities_are_refused():
    from fedexp.claims.claim import ACC_CLIENTS, ACC_GLOBAL, ACC_PERSONAL, Claim

    personal = Term("P", "s1", ACC_PERSONAL)
    with pytest.raises(ValueError, match="one quantity on both sides"):
        Claim("x", "x", "t", "p", "n", (personal, Term("G", "s2", ACC_GLOBAL)), ((0, ">", 1),),
              section="s")  # fmt: skip
    # the global model on the clients' local test splits: the same quantity as personal's
    Claim("x", "x", "t", "p", "n", (personal, Term("G", "s2", ACC_CLIENTS)), ((0, ">", 1),),
          section="s")  # fmt: skip
    for claim in CLAIMS:  # the catalogue itself: built, so every relation passed the check
        assert claim.section


def test_drop_pairs_clean_and_attacked_runs_by_seed():
    term = Term("drop", "attacked", ("acc",), clean="clean")
    summaries = {"clean": runs("acc", 0.875, 0.75), "attacked": runs("acc", 0.5, 0.625)}
    got = measure(term, summaries)
    assert got.values == {0: 0.375, 1: 0.125}
    assert got.mean == 0.25
    assert got.final == got.values  # no metrics.jsonl: the final round


def test_a_drop_is_the_mean_of_the_last_10_evaluations_beside_the_final_round():
    from fedexp.claims.verdict import tail_means

    rows = [{"round": t, "acc": 0.1 * (t % 2)} for t in range(1, 13)]  # 0.1, 0, 0.1, ...
    rows.append({"round": 13, "train/loss": 1.0})  # a round without evaluation
    assert tail_means(rows, ("acc",)) == {"acc": pytest.approx(0.05)}  # rounds 3..12
    term = Term("drop", "attacked", ("acc",), clean="clean")
    assert term.window == "last 10" and Term("a", "s", ("acc",)).window == "final"
    summaries = {"clean": runs("acc", 0.9), "attacked": runs("acc", 0.2)}
    tails = {"clean": {0: {"acc": 0.85}}, "attacked": {0: {"acc": 0.45}}}
    got = measure(term, summaries, [0], tails)
    assert got.values == {0: pytest.approx(0.4)} and got.final == {0: pytest.approx(0.7)}
    final = Term("drop", "attacked", ("acc",), clean="clean", window="final")
    assert measure(final, summaries, [0], tails).values == {0: pytest.approx(0.7)}


def test_a_verdict_is_never_computed_on_a_subset_of_seeds():
    term = Term("drop", "attacked", ("acc",), clean="clean")
    # seed 2's clean run failed (no summary): the term is n/a and names it, not a 2-seed mean
    summaries = {"clean": runs("acc", 0.875, 0.75), "attacked": runs("acc", 0.5, 0.625, 0.125)}
    got = measure(term, summaries, seeds=[0, 1, 2])
    assert got.missing == "runs not completed: clean seed 2 failed" and got.values == {}
    # an interrupted or diverged clean run, or any non-completed run of a plain term: n/a too
    summaries["clean"][2] = RunSummary("interrupted", metrics={"acc": 0.9})
    assert "clean seed 2 interrupted" in measure(term, summaries, [0, 1, 2]).missing
    plain = Term("acc", "attacked", ("acc",))
    summaries["attacked"][1] = RunSummary("diverged", metrics={"acc": 0.1})
    assert measure(plain, summaries, [0, 1, 2]).missing == (
        "runs not completed: attacked seed 1 diverged"
    )
    claim = next(c for c in CLAIMS if c.slug == "waffle-unimodal")
    _, verdict = evaluate(claim, {"shards-waffle": runs("eval/personal/acc_mean", 0.9)}, [0])
    assert verdict.holds is None and verdict.text() == "n/a"


def test_a_diverged_attacked_run_counts_as_a_collapse():
    term = Term("drop", "attacked", ("acc",), clean="clean")
    summaries = {
        "clean": runs("acc", 0.875, 0.75, 0.75),
        "attacked": {
            0: RunSummary("completed", metrics={"acc": 0.5}),
            # the last evaluation before the divergence: 0.25
            1: RunSummary("diverged", metrics={"acc": 0.25, "data/classes_used": 10}),
            # diverged before any evaluation: chance, 1 / 10 classes
            2: RunSummary("diverged", metrics={"data/classes_used": 10}),
        },
    }
    got = measure(term, summaries, seeds=[0, 1, 2])
    assert got.missing is None
    assert got.values == {0: 0.375, 1: 0.5, 2: pytest.approx(0.65)}


def test_metric_falls_back_and_the_row_says_so():
    claim = next(c for c in CLAIMS if c.slug == "waffle-mia")
    summaries = {
        "mia-waffle": runs("privacy/mia_acc", 0.5, 0.5),
        "mia-fedavg": runs("privacy/mia_acc", 0.625, 0.5),
    }
    measured, verdict = evaluate(claim, summaries)
    assert [x.key for x in measured] == ["privacy/mia_acc"] * 2
    assert verdict.text() == "inconclusive"  # differences −0.125 and 0 over two seeds
    text = row(claim, measured, verdict)
    assert text.count("(`privacy/mia_acc`: privacy/mia_auc is not reported by this version)") == 1
    assert "WAFFLe 0.500 ± 0.000" in text and "FedAvg 0.562 ± 0.088" in text


def test_a_missing_setting_gives_n_a_not_a_verdict():
    claim = next(c for c in CLAIMS if c.slug == "waffle-unimodal")
    measured, verdict = evaluate(
        claim, {"shards-fedavg-wfc": runs("eval/global/client_acc_mean", 0.8)}
    )
    assert verdict.holds is None and verdict.text() == "n/a"
    assert "WAFFLe n/a (no completed run of shards-waffle)" in row(claim, measured, verdict)


def test_catalogue_is_consistent():
    assert [c.id for c in CLAIMS] == ["1", "1b", *map(str, range(2, 11))]
    for name in TIERS:
        claims, settings = tier(name)
        for claim in claims:
            assert all(sid in settings for sid in settings_of(claim))
            n = len(claim.terms)
            assert all(0 <= i < n and 0 <= j < n for i, _, j in claim.relations)
    assert [c.id for c in select("frl-upload,3", CLAIMS)] == ["3", "7"]
    with pytest.raises(ConfigError, match="--only: unknown claim 99"):
        select("99", CLAIMS)


def test_paper_tier_keeps_the_compared_terms_and_renumbers_the_relations():
    claims, settings = tier("paper")
    by_id = {c.id: c for c in claims}
    # claim 7 (the ledger's identity) needs FedAvg's clean run, which the tier does not define
    assert "7" not in by_id and {"1", "4", "6", "8", "9", "10"} <= set(by_id)
    # claims 2 (heterogeneous clients) and 9 (homogeneous) compare η0 = 0.01 with 0
    for cid, sid in (("2", "shards-fedhenn-het"), ("9", "shards-fedhenn")):
        claim = by_id[cid]
        assert [t.setting for t in claim.terms][:2] == [sid, f"{sid}-eta0"]
        assert claim.relations == ((0, ">", 1),)
    assert "model=mlp_family" in settings["shards-fedhenn-het"].overrides
    assert "model=mlp" in settings["shards-fedhenn"].overrides
    # the alignment measured over η0 and both layers: accuracy, distance and gradient ratio,
    # for homogeneous (9a) and heterogeneous (2a) clients
    for cid, sid in (("2a", "shards-fedhenn-het"), ("9a", "shards-fedhenn")):
        measured = by_id[cid]
        assert len(measured.terms) == 2 * 6 * 3 and measured.relations == ()
        assert {t.setting for t in measured.terms} >= {sid, f"{sid}-out-eta10"}
        assert "algorithm.align_layer=output" in settings[f"{sid}-out-eta10"].overrides
        assert "algorithm.eta0=10" in settings[f"{sid}-out-eta10"].overrides
    # claim 4 (Table 1) on both of its splits: unimodal shards, and 4m on the multimodal one
    assert [t.setting for t in by_id["4"].terms] == ["shards-waffle", "shards-fedavg-wfc"]
    assert "experiment=waffle_mnist_unimodal" in settings["shards-waffle"].overrides
    assert [t.setting for t in by_id["4m"].terms] == ["multimodal-waffle", "multimodal-fedavg"]
    assert "multimodal" in by_id["4m"].text
    # claim 3 at the paper's T = 100; claim 1 against each of FedHeNN's baselines
    assert "rounds=100" in settings["multimodal-waffle"].overrides
    assert [t.setting for t in by_id["1"].terms][2:] == ["shards-fedavg-fhc", "shards-fedprox-fhc"]
    # the paper's populations: FRL 1 000 clients, 25 a round; FedHeNN E = 20
    frl = settings["frl-rr20"].overrides
    assert "experiment=frl_mnist_dir1" in frl and "attack.fraction=0.2" in frl


def test_a_setting_that_does_not_compose_is_one_line_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "o"
    args = ["--tier", "paper", "--only", "6", "--override", "nope=1", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedexp: error: setting ") and "does not compose" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_bad_options_exit_2_before_running(tmp_path, capsys):
    assert main(["--only", "99", "--out", str(tmp_path / "o")]) == 2
    assert main(["--seeds", "0", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "fedexp: error: --only: unknown claim 99" in err
    assert "fedexp: error: --seeds: 0 is not a positive number of seeds" in err
    assert not (tmp_path / "o").exists()


def test_update_doc_replaces_only_the_marked_section(tmp_path):
    doc = tmp_path / "CLAIMS.md"
    doc.write_text(f"intro\n{BEGIN}\nold table\n{END}\noutro\n")
    update_doc(doc, "new table\n")
    assert doc.read_text() == f"intro\n{BEGIN}\nnew table\n{END}\noutro\n"
    # each tier has its own section: the paper tier's leaves the small one alone
    begin, end = markers("paper")
    doc.write_text(f"{BEGIN}\nsmall\n{END}\n{begin}\nold\n{end}\n")
    update_doc(doc, "paper\n", "paper")
    assert doc.read_text() == f"{BEGIN}\nsmall\n{END}\n{begin}\npaper\n{end}\n"


@pytest.mark.slow  # three CLI processes (~50 s); make test-full
def test_cheapest_claim_end_to_end(tmp_path):
    out = tmp_path / "claims"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    env["FEDEXP_CACHE_DIR"] = str(tmp_path / "cache")
    # two seeds: one seed gives no interval (inconclusive, however exact the quantity)
    args = ["--only", "7", "--seeds", "2", "--override", "rounds=2", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "fedexp.claims", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("[claims ") == 6 and "[claims 6/6] claim 7" in proc.stdout
    record = json.loads((out / "claims.json").read_text())
    (claim,) = record["claims"]
    bits = {t["label"]: t["values"]["0"] for t in claim["terms"]}
    # 10 clients a round, 2 rounds; MLP 64-128-10. FRL (no biases): 8192·⌈log2 8192⌉ +
    # 1280·⌈log2 1280⌉ = 8192·13 + 1280·11 = 120,576 bits a client-round; FedAvg: 32 bits ×
    # 9,610 weights and biases; SignSGD: 1 bit × 9,610.
    assert bits == {"FRL": 20 * 120_576, "FedAvg": 20 * 32 * 9_610, "SignSGD": 20 * 9_610}
    for term in claim["terms"]:  # the values are the runs' own summaries
        summary = json.loads(
            (out / "runs" / term["setting"] / "seed0" / "summary.json").read_text()
        )
        assert summary["metrics"]["comm/up_bits_total"] == term["values"]["0"]
    assert claim["holds"] is True and claim["verdict"] == "yes"
    md = (out / "claims.md").read_text()
    assert "| 7. FRL's upload" in md
    assert "FRL 2.41 Mbit ± 0.00 Mbit; FedAvg 6.15 Mbit ± 0.00 Mbit; SignSGD 0.19 Mbit" in md
    (line,) = [x for x in md.splitlines() if x.startswith("| 7. FRL's upload")]
    assert "| yes: FRL < FedAvg: Δ " in line and "; FRL > SignSGD: Δ +" in line
    # a second call with the same out dir reuses the runs
    again = subprocess.run(
        [sys.executable, "-m", "fedexp.claims", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout.count("| reused |") == 6
    # their own time counted apart, from their summaries
    own = sum(
        json.loads(p.read_text())["timing"]["wall_time_s"]
        for p in (out / "runs").glob("*/seed*/summary.json")
    )
    shown = re.search(
        r"6 runs reused from an earlier check \(their own time, from their summaries: "
        r"(\d+) min (\d+) s of run time",
        again.stdout,
    )
    assert shown and abs(int(shown[1]) * 60 + int(shown[2]) - own) <= 1


def test_settings_text_is_read_from_the_runs_configs():
    from fedexp.claims.claim import Claim, Setting
    from fedexp.claims.settings_text import claim_setting_text

    def summary(lr, batch, algo):
        config = {"rounds": 20, "client": {"lr": lr, "batch_size": batch}, "paths": {"x": 1}}
        return RunSummary("completed", config=config, choices={"algorithm": algo})

    settings = {"a": Setting("a", (), 1), "b": Setting("b", (), 1)}
    claim = Claim(
        "9", "t", "A > B", "paper", "accuracy",
        (Term("A", "a", ("acc",)), Term("B", "b", ("acc",))), ((0, ">", 1),), section="s",
    )  # fmt: skip
    summaries = {"a": {0: summary(0.01, 10, "x")}, "b": {0: summary(0.05, 10, "y")}}
    text = claim_setting_text(claim, settings, summaries)
    # what both share is stated once; every differing key names each setting's value; paths
    # (where files go) are not settings
    assert text == (
        "accuracy. shared beyond the tier's common settings: rounds=20, client.batch_size=10; "
        "differs: algorithm (a x / b y); client.lr (a 0.01 / b 0.05)"
    )
    # what the whole tier shares is said once above the table, not in each row
    common = {"rounds": 20}
    text = claim_setting_text(claim, settings, summaries, common)
    assert text.startswith("accuracy. shared beyond the tier's common settings: client.batch_size")


def test_settings_text_of_a_claim_without_runs_is_composed_from_its_overrides():
    from fedexp.claims.settings_text import claim_setting_text

    claim = next(c for c in CLAIMS if c.slug == "fedhenn-heterogeneous")
    text = claim_setting_text(claim, SETTINGS)
    # the two settings differ in η0 alone, and the local training is FedHeNN's own
    assert text.endswith(
        "differs: algorithm.eta0 (shards-fedhenn-het 0.01 / shards-fedhenn-het-eta0 0 / "
        "shards-fedhenn-het-eta0.001 0.001 / shards-fedhenn-het-eta0.1 0.1 / "
        "shards-fedhenn-het-eta1 1)"
    )
    assert "model=cnn_family" in text and "client.batch_size=10" in text


def test_vary_runs_the_claim_once_per_value_and_tabulates_each_verdict(tmp_path, monkeypatch):
    import fedexp.claims.__main__ as cli
    from fedexp.claims.runner import RunRecord, SettingResult

    # the trimmed mean's drop grows with clients_per_round in this fake; FRL's stays 0.05
    acc = {
        "frl-clean": lambda n: 0.9,
        "frl-rr20": lambda n: 0.85,
        "fedavg-trmean-clean": lambda n: 0.9,
        "fedavg-trmean-agr20": lambda n: 0.9 - n / 500,
    }
    seen = []

    class FakeRunner:
        def __init__(self, out, seeds, labels, overrides, jobs, attacked=None):
            self.seeds, self.n = seeds, int(overrides[-1].split("=")[1])
            seen.append(list(overrides))

        def run_all(self, settings):
            out = {}
            for s in settings:
                summary = RunSummary("completed", metrics={"eval/global/acc": acc[s.id](self.n)})
                runs = {k: RunRecord(s.id, k, "d", "completed", 1.0, summary=summary)
                        for k in self.seeds}  # fmt: skip
                out[s.id] = SettingResult(s.id, runs, 1.0)
            return out

    monkeypatch.setattr(cli, "Runner", FakeRunner)
    out = tmp_path / "v"
    args = ["--only", "6", "--seeds", "2", "--vary", "clients_per_round=10,40", "--out", str(out)]
    assert main(args) == 0
    assert [o[-1] for o in seen] == ["clients_per_round=10", "clients_per_round=40"]
    text = (out / "vary.md").read_text()
    # 10 a round: trimmed mean drops 0.02 < FRL's 0.05 (no); 40: 0.08 > 0.05 (yes)
    assert "| 6. frl-vs-trimmed-mean | 10 |" in text and "| 6. frl-vs-trimmed-mean | 40 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| 6.")]
    assert rows[0].endswith("| no: FRL drop < trimmed-mean drop: Δ +0.030 [+0.030, +0.030] |")
    assert rows[1].endswith("| yes: FRL drop < trimmed-mean drop: Δ -0.030 [-0.030, -0.030] |")
    assert (out / "clients_per_round-40" / "claims.json").is_file()
    assert main(["--vary", "clients_per_round", "--out", str(out)]) == 2


def test_runner_resumes_an_interrupted_setting_and_sets_stale_runs_aside(tmp_path, monkeypatch):
    import fedexp.claims.runner as runner_mod
    from fedexp.claims.claim import Setting

    # a stand-in CLI: a multirun writes multirun.yaml and one job dir per seed (as Hydra), and
    # refuses a sweep dir that already holds one (as fedexp's sweep does)
    script = (
        "import json, sys, pathlib\n"
        "sweep = pathlib.Path(sys.argv[1]); seeds = sys.argv[2].split(',')\n"
        "if (sweep / 'multirun.yaml').exists(): sys.exit(2)\n"
        "(sweep / 'multirun.yaml').write_text('x')\n"
        "for s in seeds[: int(sys.argv[3])]:\n"
        "    d = sweep / f'seed{s}'; (d / '.hydra').mkdir(parents=True)\n"
        "    (d / 'summary.json').write_text(json.dumps({'status': 'completed', 'metrics': {}}))\n"
    )
    limit = {"n": 1}  # the first call is "interrupted" after one run

    def fake_command(setting, seeds, sweep_dir, extra):
        seeds_arg = ",".join(map(str, seeds))
        return [sys.executable, "-c", script, str(sweep_dir), seeds_arg, str(limit["n"])]

    monkeypatch.setattr(runner_mod, "command", fake_command)
    setting = Setting("s", ("rounds=2",), 1)
    first = runner_mod.Runner(tmp_path, [0, 1, 2], {"s": "1"}).run_all([setting])["s"]
    assert [first.runs[k].status for k in (0, 1, 2)] == ["completed", "failed", "failed"]
    limit["n"] = 9
    second = runner_mod.Runner(tmp_path, [0, 1, 2], {"s": "1"}).run_all([setting])["s"]
    assert second.error is None and second.runs[0].reused
    assert [Path(second.runs[k].run_dir).parent.name for k in (1, 2)] == ["batch-1", "batch-1"]
    third = runner_mod.Runner(tmp_path, [0, 1, 2], {"s": "1"}).run_all([setting])["s"]
    assert all(third.runs[k].reused for k in (0, 1, 2))
    # other overrides: the old runs are set aside, never reused
    changed = Setting("s", ("rounds=3",), 1)
    fourth = runner_mod.Runner(tmp_path, [0, 1, 2], {"s": "1"}).run_all([changed])["s"]
    assert not any(fourth.runs[k].reused for k in (0, 1, 2)) and fourth.error is None
    assert len(list((tmp_path / "runs").glob("s.stale-*"))) == 1


def test_what_the_protocol_tier_changes_is_read_from_the_composed_configs():
    from fedexp.claims.paper_tier import SETTINGS as PAPER
    from fedexp.claims.protocol_diff import differences, differences_markdown

    rows = {key: (paper, here) for key, paper, here in differences(PAPER["shards-fedhenn"])}
    # the tier's departures and what they change through the presets' dataset-keyed values
    assert rows["rounds"] == ("200", "30") and rows["dataset"] == ("cifar10", "mnist1d")
    assert rows["algorithm.eta0"] == ("0.001", "0.01")  # the paper's CIFAR η0 is not kept
    assert rows["algorithm.rad_size"] == ("5000", "200")
    assert not [k for k in rows if k.endswith("data_dir")]  # no machine paths
    text = differences_markdown([PAPER["frl-clean"]], {"frl-clean": "6"})
    assert "| frl-clean (6) | `rounds` | 2000 | 150 |" in text
    assert "lr·0.999 each round" in text  # what the preset does not set, listed by hand


def test_a_measurement_row_is_tabulated_term_by_term():
    from fedexp.claims.claim import Claim
    from fedexp.claims.table import grid_tables

    terms = tuple(
        Term(f"{q} ({layer}, η0 = {eta})", f"s-{layer}-{eta}", (q,), unit=unit)
        for layer in ("body", "output")
        for eta in ("0", "1")
        for q, unit in (("acc", "acc"), ("dist", "fine"))
    )
    claim = Claim("9a", "m", "what the term does", "none", "note", terms, (), section="s")
    values = [0.5, 0.01, 0.6, 0.001, 0.5, 0.02, 0.7, 0.002]
    measured = [Measured(t.label, t.keys[0], {0: v, 1: v + 0.1}) for t, v in zip(terms, values)]
    measured[7] = Measured(terms[7].label, None, missing="run failed")
    text = grid_tables([claim], {"9a": measured})
    lines = text.splitlines()
    assert lines[2:4] == ["| | acc | dist |", "| --- | --- | --- |"]
    # one line a (layer, η0), the quantities in columns: mean ± std over the two seeds
    assert lines[4] == "| body, η0 = 0 | 0.550 ± 0.071 | 0.06 ± 0.07071 |"
    assert lines[6] == "| output, η0 = 0 | 0.550 ± 0.071 | 0.07 ± 0.07071 |"
    assert lines[7] == "| output, η0 = 1 | 0.750 ± 0.071 | n/a |"
    # a claim that compares something has no such table
    pair = (terms[0], terms[2])
    compared = Claim("1", "c", "A > B", "p", "n", pair, ((0, ">", 1),), section="s")
    assert grid_tables([compared], {"1": [measured[0], measured[2]]}) == ""


def test_an_attack_option_applies_to_the_attacked_settings_alone():
    from fedexp.claims.claim import Setting
    from fedexp.claims.runner import overrides_for
    from fedexp.claims.settings_text import attacked_settings

    settings = [
        Setting("clean", ("experiment=frl_digits",), 1),
        Setting("named", ("experiment=frl_digits", "attack=rank_reversal"), 1),
        Setting("none", ("experiment=frl_digits", "attack=none"), 1),
        # attacked by its preset, with no attack= override of its own
        Setting("preset", ("experiment=frl_digits_attack20",), 1),
    ]
    extra = ("attack.fraction=0.1", "rounds=5")
    # read from the composed configs, not the overrides' text
    assert attacked_settings(settings, extra) == {"named", "preset"}
    assert attacked_settings(settings, ("rounds=5",)) is None  # no attack option: all take all
    assert overrides_for(extra, attacked=True) == extra
    # a clean run has no attack whose fraction could be set: it runs as its tier has it
    assert overrides_for(extra, attacked=False) == ("rounds=5",)
    assert overrides_for(("+attack.x=1", "~attack.y"), attacked=False) == ()


def test_reused_runs_are_timed_by_their_summaries_where_they_say():
    from fedexp.claims.heading import own_seconds
    from fedexp.claims.runner import RunRecord
    from fedexp.core.summary import Timing

    timed = RunSummary("completed", timing=Timing(12.5, 1.0))
    untimed = RunSummary("completed")  # an older summary without its timing
    records = [
        RunRecord("a", 0, "d", "completed", 0.0, True, timed),
        RunRecord("a", 1, "d", "completed", 0.0, True, untimed),
        RunRecord("a", 2, "d", "completed", 40.0, False, timed),  # made by this check
    ]
    assert own_seconds(records) == [12.5]
