"""The batched per-client evaluation gives exactly the per-client loop's accuracies."""

from __future__ import annotations

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from fedexp.__main__ import find_conf
from fedexp.engine.eval.hits import accuracy, client_accuracies
from fedexp.run import Experiment


def test_client_accuracies_equal_the_per_client_loop(tmp_path):
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose(
            "config", ["debug=smoke", "partition=dirichlet", f"paths.cache_dir={tmp_path}"]
        )
    exp = Experiment(cfg, tmp_path)
    model = exp.algorithm.global_model(exp.algorithm.init_state())
    loop = np.array([accuracy(model, *exp.data.test(c)) for c in range(exp.data.num_clients)])
    batched = client_accuracies(model, exp.data)
    assert np.array_equal(loop, batched) and loop.mean() == batched.mean()
    x, y, owner = exp.data.pooled_local_test()
    assert len(x) == len(y) == len(owner) == sum(len(t) for t in exp.data.partition.test)
    assert torch.equal(owner.bincount(), torch.tensor([len(t) for t in exp.data.partition.test]))
