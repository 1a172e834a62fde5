"""Every option of every config group composes, and builds into a runnable experiment."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from fedexp.__main__ import find_conf
from fedexp.core.types import ConfigError
from fedexp.run import Experiment

CONF = Path(find_conf())
SKIP_GROUPS = {"experiment", "debug", "hydra", "hparams_search"}
# chosen through the defaults list's interpolations, never on their own
SKIP_GROUPS |= {
    "paper",
    "paper_algorithm",
    "experiment_algorithm",
    "algorithm_dataset",
    "debug_algorithm",
}
SKIP_GROUPS |= {"attack_paper"}
# options that only make sense together with others
REQUIRES: dict[tuple[str, str], tuple[str, ...]] = {
    ("partition", "natural"): ("dataset=synthetic",),
    ("model", "cnn_family"): ("algorithm=fedhenn", "algorithm.variant=heterogeneous"),
    ("model", "mlp_family"): ("algorithm=fedhenn", "algorithm.variant=heterogeneous"),
    ("model", "lstm"): ("dataset=sent140",),
    ("dataset", "hf"): ("dataset.path=someone/images", "dataset.image_key=img"),
    ("dataset", "mnist1d"): ("dataset.num_samples=400",),  # the default takes minutes
    ("model", "lstm_family"): ("dataset=sent140",),
    ("model", "lightning"): ("model._target_=lightning_docs_model.LitBodyHead",),
    ("dataset", "custom"): (
        "dataset._target_=fedexp.data.datasets.load_digits",
        "+dataset.test_fraction=0.2",
    ),
    ("aggregator", "rank_vote"): ("algorithm=frl",),
    ("attack", "rank_reversal"): ("algorithm=frl",),
}


def options():
    for group in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name not in SKIP_GROUPS):
        for option in sorted(group.glob("*.yaml")):
            if not option.stem.startswith("_"):  # partial configs, included by the options
                yield group.name, option.stem


def load(overrides, tmp_path):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                *overrides,
                "debug=smoke",
                f"paths.cache_dir={tmp_path}",
                f"paths.data_root={tmp_path}/data",
            ],
        )


@pytest.mark.experiment
@pytest.mark.parametrize("group,option", list(options()))
def test_option_composes_and_builds(group, option, tmp_path):
    cfg = load([f"{group}={option}", *REQUIRES.get((group, option), ())], tmp_path)
    try:
        experiment = Experiment(cfg, tmp_path)
    except ConfigError as err:
        if "dataset.data_dir" in str(err):  # a real dataset whose files the tests do not have
            pytest.skip(f"composes; needs files: {err}")
        if (group, option) == ("executor", "distributed") and "torchrun" in str(err):
            # tests/engine/executors/test_distributed_parts.py and tests/cli/test_distributed_cli.py
            # build it
            pytest.skip("composes; builds under torchrun")
        raise
    assert experiment.data.num_clients == cfg.num_clients


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_presets_compose(preset, tmp_path):
    cfg = load([f"experiment={preset}"], tmp_path)
    assert cfg.rounds == 2  # debug=smoke still shrinks a preset
