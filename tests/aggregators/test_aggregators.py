import torch

from fedexp.aggregators.mean import weighted_mean


def test_weighted_mean_on_hand_numbers():
    updates = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    assert torch.equal(weighted_mean(updates, torch.tensor([1.0, 3.0])), torch.tensor([2.5, 1.5]))
    assert torch.equal(weighted_mean(updates, torch.tensor([1.0, 1.0])), torch.tensor([2.0, 1.0]))
