"""The batched per-client evaluation gives the per-client loop's accuracies: exactly, but for
samples whose argmax the two passes' float kernels may settle differently (`near_ties`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from fedexp.__main__ import find_conf
from fedexp.engine.eval.hits import accuracy, client_accuracies
from fedexp.run import Experiment
from near_ties import assert_same_accuracies, near_ties

pytestmark = pytest.mark.experiment


def test_client_accuracies_equal_the_per_client_loop(tmp_path):
    with initialize_config_dir(config_dir=find_conf(), version_base="1.3"):
        cfg = compose(
            "config", ["debug=smoke", "partition=dirichlet", f"paths.cache_dir={tmp_path}"]
        )
    exp = Experiment(cfg, tmp_path)
    model = exp.algorithm.global_model(exp.algorithm.init_state())
    clients = range(exp.data.num_clients)
    loop = np.array([accuracy(model, *exp.data.test(c)) for c in clients])
    batched = client_accuracies(model, exp.data)
    # the loop's logits: the batched pass gives them to float tolerance, in other batches
    with torch.no_grad():
        ties = [near_ties(model.eval()(exp.data.test(c)[0])) for c in clients]
    assert_same_accuracies(batched, loop, exp.data.split_sizes("test"), ties)
    x, y, owner = exp.data.pooled_local_test()
    assert len(x) == len(y) == len(owner) == sum(len(t) for t in exp.data.partition.test)
    assert torch.equal(owner.bincount(), torch.tensor([len(t) for t in exp.data.partition.test]))
