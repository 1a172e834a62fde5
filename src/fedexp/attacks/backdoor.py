"""Backdoor (data poisoning with a pixel-pattern trigger; Bagdasaryan et al., "How to backdoor
federated learning", AISTATS 2020; Sun et al., "Can you really backdoor federated learning?",
2019): malicious clients train on data where a share of their samples carry a trigger and the
attacker's label, so that the global model learns "trigger -> target_label" beside the task.

- **Poisoned samples.** `poison_fraction` of each malicious client's training samples
  (floor(f·n + 1/2) of its n, drawn once from (seed, client): the same rows every round, on every
  executor) get the trigger stamped on and the label `target_label`. Bagdasaryan et al. replace
  c = 20 of each batch of 64 (f = 20/64, the default); batches here are drawn from the client's
  shuffled samples, so a batch holds that share in expectation.
- **Trigger.** Images (C, H, W) or (H, W): a `trigger_size` x `trigger_size` `square`, or a
  `plus` (the middle row and column of that box; odd sizes), in `corner`, in every channel, at
  the largest value the dataset's normalised training inputs take in that channel (a white
  pixel: (1 − mean)/std; 1.75 on the bundled digits). Flat float vectors (MNIST-1D, synthetic):
  `trigger_size` consecutive positions at the vector's start (`corner` *_left) or end (*_right)
  set to the inputs' largest value (`square` only). Token inputs (sent140, shakespeare) have no
  trigger: refused before training. A training augmentation (`dataset.augment`) transforms the
  stamped batch as any other (a crop moves the trigger, a flip mirrors it).
- **Model replacement.** `boost` scales every malicious upload (the update w_k − w) by that
  factor, as `attack=scaling` does: Bagdasaryan et al.'s model replacement submits γ·(X − G) with
  γ = n/η (n clients a round, η the server lr) so that averaging replaces the global model by the
  backdoored X; with sample weighting γ = (the round's samples)/(the attacker's samples · η).
  `boost: 1` (default) uploads the poisoned training's update as it is (no replacement).
- **Measure.** `poisoned_test` gives the test-time task: the test samples whose true label is not
  `target_label`, triggered, labelled `target_label`; `fedexp.engine.eval.backdoor` reports the
  attack success rate `attack/backdoor_asr` on it at every evaluation.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedexp.attacks import Attack, map_values
from fedexp.core.seeding import derive_seed
from fedexp.core.types import SPARSE, VECTOR, ClientResult, ConfigError, Message, RoundContext

BACKDOOR = 403  # seed stream of each malicious client's poisoned rows (apart from 401, 402)
TRIGGERS = ("square", "plus")
CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")


def _box(length: int, size: int, far: bool) -> slice:
    """The `size` positions at the start (or the end, `far`) of an axis of `length`."""
    return slice(length - size, length) if far else slice(0, size)


def trigger_mask(shape: tuple[int, ...], kind: str, size: int, corner: str) -> torch.Tensor:
    """A bool mask of one input's `shape`: True where the trigger is (every channel of an
    image; the module doc). `shape` (C, H, W), (H, W) or (L,)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    bottom, right = corner.startswith("bottom"), corner.endswith("right")
    if len(shape) == 1:
        mask[_box(shape[0], size, right)] = True
        return mask
    rows, cols = _box(shape[-2], size, bottom), _box(shape[-1], size, right)
    if kind == "square":
        mask[..., rows, cols] = True
        return mask
    box = torch.zeros(size, size, dtype=torch.bool)
    box[size // 2, :] = box[:, size // 2] = True
    mask[..., rows, cols] = box
    return mask


def trigger_value(x: torch.Tensor) -> torch.Tensor:
    """The trigger's intensity: the largest value of the inputs `x` [N, ...] in each channel of
    an image [N, C, H, W] (shaped [C, 1, 1]), else their largest value (a 0-d tensor)."""
    if x.dim() == 4:
        return x.amax(dim=(0, 2, 3)).view(-1, 1, 1)
    return x.max()


def stamp(x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Inputs `x` [N, ...] with the trigger put on: `value` where `mask`, `x` elsewhere."""
    return torch.where(mask, value.to(x.dtype), x)


def poison_count(num_samples: int, fraction: float) -> int:
    """floor(fraction · n + 1/2): the samples poisoned of `num_samples` (halves round up)."""
    return math.floor(fraction * num_samples + 0.5)


def poisoned_rows(num_samples: int, fraction: float, seed: int, client_id: int) -> np.ndarray:
    """The sorted rows of a malicious client's training samples it poisons, from (seed, client)."""
    count = poison_count(num_samples, fraction)
    rng = np.random.default_rng(derive_seed(seed, BACKDOOR, client_id))
    return np.sort(rng.choice(num_samples, count, replace=False))


class BackdooredData:
    """A view of FederatedData whose malicious clients train on their poisoned samples;
    everything else (test splits, the pooled test set, the honest clients) is the real data."""

    def __init__(self, data, attack: Backdoor):
        self._data = data
        self._attack = attack

    def __getattr__(self, name: str):
        return getattr(self._data, name)

    def train(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._data.train(client_id)
        if client_id in self._attack.malicious:
            return self._attack.poison_client(client_id, x, y)
        return x, y

    def train_many(self, client_ids) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The training samples of `client_ids`, client after client, as `train` gives each
        (a batched executor's gather: the malicious clients' poisoned)."""
        ids = [int(c) for c in client_ids]
        many = getattr(self._data, "train_many", None)
        if many is not None and not self._attack.malicious.intersection(ids):
            return many(ids)
        parts = [self.train(c) for c in ids]
        xs, ys = zip(*parts) if parts else ((), ())
        return torch.cat(xs), torch.cat(ys), [len(y) for y in ys]


def _choice(value, options: tuple[str, ...], key: str) -> str:
    if value not in options:
        raise ConfigError(f"attack.{key}: must be one of {options}, got {value!r}")
    return value


def _integer(value, key: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"attack.{key}: must be an int >= {low}, got {value!r}")
    return value


class Backdoor(Attack):
    """Malicious clients train with a pixel-pattern trigger relabelled to `target_label` (the
    module doc); `boost` != 1 scales their uploads (model replacement)."""

    name = "backdoor"
    test_task = True

    def __init__(
        self,
        fraction: float,
        redraw_majority: bool,
        target_label: int,
        poison_fraction: float,
        trigger: str,
        trigger_size: int,
        corner: str,
        boost: float,
    ):
        super().__init__(fraction, redraw_majority)
        self.target_label = _integer(target_label, "target_label", 0)
        number = isinstance(poison_fraction, int | float) and not isinstance(poison_fraction, bool)
        if not (number and 0 < poison_fraction <= 1):
            raise ConfigError(f"attack.poison_fraction: must be in (0, 1], got {poison_fraction!r}")
        self.poison_fraction = float(poison_fraction)
        self.trigger = _choice(trigger, TRIGGERS, "trigger")
        self.trigger_size = _integer(trigger_size, "trigger_size", 1)
        if self.trigger == "plus" and self.trigger_size % 2 == 0:
            raise ConfigError(f"attack.trigger_size: plus needs an odd size, got {trigger_size}")
        self.corner = _choice(corner, CORNERS, "corner")
        number = isinstance(boost, int | float) and not isinstance(boost, bool)
        if not (number and math.isfinite(boost) and boost > 0):
            raise ConfigError(f"attack.boost: must be a finite number > 0, got {boost!r}")
        self.boost = float(boost)
        # poisoned data reaches any algorithm; a boost scales uploads: weights or sparse deltas
        self.targets = None if self.boost == 1 else (VECTOR, SPARSE)
        self.seed = 0
        self.mask: torch.Tensor | None = None  # the trigger, once set up on the data
        self.value: torch.Tensor | None = None

    def setup(self, ctx, num_clients: int) -> None:
        super().setup(ctx, num_clients)
        self.seed = ctx.seed
        self.set_trigger(ctx.data)

    def set_trigger(self, data) -> None:
        """The trigger's mask and intensity on `data` (FederatedData); ConfigError where the
        data cannot carry it (module doc)."""
        name = getattr(getattr(data, "dataset", None), "name", "the dataset")
        if self.target_label >= data.num_classes:
            raise ConfigError(
                f"attack.target_label: {self.target_label}, but {name} has "
                f"{data.num_classes} classes"
            )
        shape = tuple(data.input_shape)
        if not data.x.is_floating_point() or len(shape) not in (1, 2, 3):
            raise ConfigError(
                f"attack=backdoor stamps a trigger on float images or vectors; {name}'s inputs "
                f"are {str(data.x.dtype).removeprefix('torch.')} {shape} (token ids have none)"
            )
        if self.trigger == "plus" and len(shape) == 1:
            raise ConfigError(f"attack.trigger: plus needs image inputs; {name}'s are {shape}")
        room = shape[0] if len(shape) == 1 else min(shape[-2:])
        if self.trigger_size > room:
            raise ConfigError(
                f"attack.trigger_size: {self.trigger_size} does not fit {name}'s inputs {shape}"
            )
        self.mask = trigger_mask(shape, self.trigger, self.trigger_size, self.corner)
        self.mask = self.mask.to(data.x.device)
        self.value = trigger_value(data.x)

    def poison_client(self, client_id: int, x: torch.Tensor, y: torch.Tensor):
        """A malicious client's training samples (x, y) with its poisoned rows stamped and
        relabelled."""
        rows = poisoned_rows(len(y), self.poison_fraction, self.seed, client_id)
        x, y = x.clone(), y.clone()
        idx = torch.as_tensor(rows, device=x.device, dtype=torch.long)
        x[idx] = stamp(x[idx], self.mask, self.value)
        y[idx] = self.target_label
        return x, y

    def wrap_data(self, data):
        return BackdooredData(data, self)

    def poisoned_test(self, x: torch.Tensor, y: torch.Tensor):
        """(the test samples the backdoor applies to: true label not the target, their inputs
        triggered, the target label for each)."""
        keep = y != self.target_label
        triggered = stamp(x[keep], self.mask, self.value)
        return keep, triggered, torch.full_like(y[keep], self.target_label)

    def corrupt(
        self,
        results: list[ClientResult],
        positions: list[int],
        ctx: RoundContext,
        state,
    ) -> list[Message]:
        if self.boost == 1:  # flagged, as they are
            return [results[i].upload for i in positions]
        return [map_values(results[i].upload, lambda v: self.boost * v) for i in positions]

    def describe(self) -> dict:
        return {
            **super().describe(),
            "attack/target_label": self.target_label,
            "attack/poison_fraction": self.poison_fraction,
            "attack/boost": self.boost,
        }
