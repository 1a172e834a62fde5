import random

import torch

from fedexp.core.client_loop import client_streams
from fedexp.core.seeding import CLIENT, client_generator, client_seeds, derive_seed, sample_clients


def test_sampling_depends_on_seed_and_round_only():
    a = sample_clients(0, 3, 100, 10)
    assert a == sample_clients(0, 3, 100, 10)
    assert a != sample_clients(0, 4, 100, 10) and a != sample_clients(1, 3, 100, 10)
    assert len(set(a)) == 10 and list(a) == sorted(a)


def test_client_streams_are_independent_of_order():
    first = torch.randperm(10, generator=client_generator(0, 1, 5))
    torch.randperm(10, generator=client_generator(0, 1, 6))
    assert torch.equal(first, torch.randperm(10, generator=client_generator(0, 1, 5)))


def test_client_seeds_equal_numpy_seed_sequences():
    # the joint hash gives exactly what two numpy SeedSequences give, at every word size
    rng = random.Random(7)
    values = [0, 1, 2, 255, 2**31, 2**32 - 1, 2**32, 2**40 + 3, 2**64 + 1]
    cases = [(s, r, c) for s in values for r in values[:5] for c in values]
    cases += [tuple(rng.randrange(2**33) for _ in range(3)) for _ in range(1000)]
    cases += [(0, r, c) for r in range(1, 30) for c in range(50)]
    seen = set()
    for s, r, c in cases:
        own, global_seed = client_seeds(s, r, c)
        assert own == derive_seed(s, CLIENT, r, c)
        assert global_seed == derive_seed(s, CLIENT, r, c, 1)
        seen.add(own)
    assert len(seen) > 2000  # distinct inputs, distinct seeds


def test_client_streams_draw_from_the_client_seeds():
    global_seed, generator = client_streams(3, 4, 5)
    assert global_seed == derive_seed(3, CLIENT, 4, 5, 1)
    expected = torch.randperm(10, generator=client_generator(3, 4, 5))
    assert torch.equal(torch.randperm(10, generator=generator), expected)
