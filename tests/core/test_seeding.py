import torch

from fedexp.core.seeding import client_generator, sample_clients


def test_sampling_depends_on_seed_and_round_only():
    a = sample_clients(0, 3, 100, 10)
    assert a == sample_clients(0, 3, 100, 10)
    assert a != sample_clients(0, 4, 100, 10) and a != sample_clients(1, 3, 100, 10)
    assert len(set(a)) == 10 and list(a) == sorted(a)


def test_client_streams_are_independent_of_order():
    first = torch.randperm(10, generator=client_generator(0, 1, 5))
    torch.randperm(10, generator=client_generator(0, 1, 6))
    assert torch.equal(first, torch.randperm(10, generator=client_generator(0, 1, 5)))
