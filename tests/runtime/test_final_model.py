"""The final models a run writes (`model.pt`, `personal_models/`) and `python -m fedexp.evaluate`:
evaluating them reproduces the run's own final evaluation exactly."""

from __future__ import annotations

import json
import math
import re
import sys

import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO, smoke_experiment
from fedexp.core.client_store import state_bytes
from fedexp.engine.eval.all_clients import evaluate
from fedexp.evaluate import evaluate_run, load_models, main

RUNS = {
    "fedavg": ("algorithm=fedavg", "partition.val_fraction=0"),  # no validation splits
    # two local epochs: one for the body, one for the heads, so every sampled client's head moves
    "fedrep": ("algorithm=fedrep", "client.local_epochs=2"),
    "ditto": ("algorithm=ditto",),
    "frl": ("algorithm=frl",),
    "waffle": ("algorithm=waffle",),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (run dir, summary.json) of a finished smoke run, its config saved as Hydra does."""
    done = {}

    def get(name, *extra):
        if name not in done:
            exp = smoke_experiment(tmp_path_factory.mktemp(name), *RUNS[name], *extra)
            (exp.run_dir / ".hydra").mkdir()
            OmegaConf.save(exp.cfg, exp.run_dir / ".hydra" / "config.yaml")
            exp.run()
            done[name] = exp.run_dir, json.loads((exp.run_dir / "summary.json").read_text())
        return done[name]

    return get


def test_metrics(metrics: dict, val: bool = False) -> dict:
    """The evaluation metrics of one split (a summary's `metrics` hold more)."""
    return {k: v for k, v in metrics.items() if k.startswith("eval/val/") == val
            and k.startswith("eval/")}  # fmt: skip


test_metrics.__test__ = False  # a helper, not a test


def same(a: dict, b: dict) -> bool:
    """Equal keys and bit-equal values (NaN equal to NaN; JSON writes it as null)."""
    nan = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
    return a.keys() == b.keys() and all(a[k] == b[k] or (nan(a[k]) and nan(b[k])) for k in a)


@pytest.mark.experiment
@pytest.mark.parametrize("name", list(RUNS))
def test_evaluating_the_saved_models_reproduces_the_final_evaluation(runs, name):
    run_dir, summary = runs(name)
    metrics, report = evaluate_run(run_dir, "test")
    assert metrics and same(metrics, test_metrics(summary["metrics"]))
    written = json.loads((run_dir / "evaluate" / "test.json").read_text())
    assert same(written["metrics"], metrics) and written["round"] == 2
    assert written["client_acc"] == summary["client_acc"]
    # smoke: 2 rounds, checkpoint_every 10: no checkpoint, the final model all the same
    assert not (run_dir / "checkpoint.pt").exists()


@pytest.mark.experiment
def test_validation_split_and_a_model_without_a_global_model(runs):
    run_dir, summary = runs("fedrep")
    metrics, _ = evaluate_run(run_dir, "val")
    assert "eval/val/personal/acc_mean" in metrics and same(
        metrics, test_metrics(summary["metrics"], True)
    )
    assert (run_dir / "evaluate" / "val.json").exists()
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    assert saved["state_dict"] is None and saved["meta"]["global_model"] is False
    assert saved["meta"]["note"] == "FedRep has no global model: personal models only " + (
        "(personal_models/)"
    )
    (file,) = saved["meta"]["personal"]["files"]
    parts = torch.load(run_dir / "personal_models" / file, weights_only=True)
    assert sorted(parts) == list(range(6))
    # the body is stored once: every client's body tensors share one storage
    body = [k for k in parts[0]["state_dict"] if k.startswith("body.")]
    ptrs = {parts[c]["state_dict"][body[0]].untyped_storage().data_ptr() for c in parts}
    assert body and len(ptrs) == 1
    models = load_models(run_dir)
    assert models.global_model() is None and models.personal_model(client_id=0) is not None


def doc_snippet() -> str:
    text = (REPO / "docs" / "lifecycle.md").read_text()
    block = re.search(
        r"<!-- final-model-snippet -->\n```python\n(.*?)```\n<!-- end-final-model-snippet -->",
        text,
        re.S,
    )
    return block.group(1)


class Stub:
    """An algorithm whose evaluation models are given modules."""

    def __init__(self, model=None, personal=None):
        self.model, self.personal = model, personal

    def global_model(self, state):
        return self.model

    def personal_model(self, state, client_id):
        return None if self.personal is None else self.personal(client_id)

    def personal_models(self, state, client_ids):
        return None


@pytest.mark.experiment
def test_the_docs_plain_pytorch_snippet_loads_the_models_of_the_run(runs):
    for name in ("fedavg", "ditto"):
        run_dir, summary = runs(name)
        scope = {"run_dir": str(run_dir)}
        exec(doc_snippet(), scope)
        model, personal = scope["model"], scope["personal"]
        assert type(model).__module__.startswith("fedexp.models")
        data = load_models(run_dir).algorithm.ctx.data  # the run's data, rebuilt
        if name == "fedavg":
            assert personal == {}
            scalars, _ = evaluate(Stub(model), None, data)
        else:  # Ditto's v_k are of the factory's architecture: load each into a copy
            import copy

            own = copy.deepcopy(model)

            def client(cid, own=own, states=personal):
                own.load_state_dict(states[cid])
                return own

            scalars, _ = evaluate(Stub(model, client), None, data)
        assert same(test_metrics(scalars), test_metrics(summary["metrics"]))


@pytest.mark.experiment
def test_frl_saves_its_supermask_network_with_the_voted_mask(runs):
    from fedexp.models.supermask import to_supermask

    run_dir, summary = runs("frl")
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    meta = saved["meta"]
    assert meta["global_model"] and not meta["loads_into_model"] and meta["personal"] is None
    spec = meta["model"]
    factory = __import__(spec["_target_"].rpartition(".")[0], fromlist=["x"])
    dense = getattr(factory, spec["_target_"].rpartition(".")[2])(**spec["kwargs"])
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml").algorithm
    model = to_supermask(dense, cfg.k, cfg.weight_init)
    model.load_state_dict(saved["state_dict"])
    scalars, _ = evaluate(Stub(model), None, load_models(run_dir).algorithm.ctx.data)
    assert same(test_metrics(scalars), test_metrics(summary["metrics"]))


@pytest.mark.experiment
def test_waffle_personal_models_carry_their_factor_masks(runs):
    run_dir, _ = runs("waffle")
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    assert not saved["meta"]["loads_into_model"]
    (file,) = saved["meta"]["personal"]["files"]
    parts = torch.load(run_dir / "personal_models" / file, weights_only=True)
    masks = [v for a in parts[0]["attrs"].values() for v in a.values() if torch.is_tensor(v)]
    assert masks  # the client's factor selection b, which a state_dict leaves out


@pytest.mark.experiment
def test_personal_models_are_written_within_the_client_store_budget(tmp_path):
    exp = smoke_experiment(tmp_path, "algorithm=local")
    one = state_bytes(exp.algorithm.eval_model.state_dict())
    exp.store.max_bytes = 2 * one  # two clients' models a file at most
    exp.run()
    saved = torch.load(exp.run_dir / "model.pt", weights_only=True)
    files = saved["meta"]["personal"]["files"]
    # local training: the never-sampled clients share the initial model, stored once a file
    held = {}
    for file in files:
        part = torch.load(exp.run_dir / "personal_models" / file, weights_only=True)
        tensors = [t for record in part.values() for t in record["state_dict"].values()]
        seen = {t.untyped_storage().data_ptr(): t for t in tensors}
        assert state_bytes(list(seen.values())) <= 2 * one
        held.update(part)
    assert sorted(held) == list(range(6)) and len(files) > 1
    assert not list(exp.run_dir.glob("*.tmp"))


@pytest.mark.experiment
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
    run_dir, _ = runs("fedavg")
    (tmp_path / "bare" / ".hydra").mkdir(parents=True)
    cases = {
        (str(tmp_path),): f"{tmp_path} is not a run dir (no .hydra/config.yaml)",
        (str(tmp_path / "nowhere"),): f"{tmp_path / 'nowhere'} is not a run dir",
        (str(run_dir), "split=train"): "split: must be one of test, val, got 'train'",
        (str(run_dir), "seed=3"): "seed: only split=, dataset=, device=, threads= may be given",
        (str(run_dir), "dataset=nope"): "dataset: no dataset 'nope' (one of cifar10, ",
        (str(run_dir), "split=val"): "split: val, but the run has no validation split",
        (): "usage: python -m fedexp.evaluate <run dir>",
    }
    for args, expected in cases.items():
        with pytest.raises(SystemExit) as exit_:
            main(list(args))
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1
        assert err.startswith(f"fedexp.evaluate: error: {expected}"), err
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    OmegaConf.save(config, tmp_path / "bare" / ".hydra" / "config.yaml")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "bare")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    bare = tmp_path / "bare"
    assert err == f"fedexp.evaluate: error: {bare} has no model.pt (a run writes it when it ends)\n"


@pytest.mark.experiment
def test_other_data_goes_to_a_file_of_its_own(runs, capsys):
    run_dir, summary = runs("fedavg")
    metrics, report = evaluate_run(run_dir, "test", ["dataset.test_fraction=0.3"])
    written = json.loads((run_dir / "evaluate" / "test-test_fraction=0.3.json").read_text())
    assert written["dataset"] == "test_fraction=0.3" and same(written["metrics"], metrics)
    # another pooled test set (30% of the images, not 20%): another accuracy
    assert metrics["eval/global/acc"] != summary["metrics"]["eval/global/acc"]
    with pytest.raises(SystemExit) as exit_:  # 60 features, the model takes 64 (or no shards)
        main([str(run_dir), "dataset=synthetic"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("fedexp.evaluate: error: ")
    assert err.count("\n") == 1


@pytest.mark.slow
def test_the_evaluate_cli_reproduces_a_cli_run(cli):
    import subprocess

    cli("debug=smoke", "algorithm=ditto", "hydra.run.dir=run")
    run_dir = cli.cwd / "run"
    env = {  # the run's own directories (`run_cli`): its config resolves to the same then
        "PYTHONPATH": str(REPO / "src"),
        "FEDEXP_CACHE_DIR": str(cli.cwd / "cache"),
        "FEDEXP_DATA_DIR": str(cli.cwd / "data"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "fedexp.evaluate", str(run_dir)],
        capture_output=True, text=True, env={**__import__("os").environ, **env}, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the saved config says server_pool: auto (and smoke's cap): resolved as the run did
    assert "written for a config other" not in proc.stderr
    assert "eval/personal/acc_mean" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    written = json.loads((run_dir / "evaluate" / "test.json").read_text())
    assert same(written["metrics"], test_metrics(summary["metrics"]))


@pytest.mark.experiment
def test_a_run_dir_saved_before_an_option_was_added_is_evaluated(runs):
    # FRL's lr options did not exist when older run dirs were saved: their configs lack them
    run_dir, summary = runs("frl")
    path = run_dir / ".hydra" / "config.yaml"
    cfg = OmegaConf.load(path)
    for key in ("round_lr_decay", "local_lr_schedule"):
        del cfg.algorithm[key]
    OmegaConf.save(cfg, path)
    metrics, _ = evaluate_run(run_dir, "test")
    assert same(metrics, test_metrics(summary["metrics"]))
