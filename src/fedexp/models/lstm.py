"""LSTM text classifier: embedding, 1 or 2 LSTM layers, then 2 fully connected layers.

The FedHeNN Sent140 model (LEAF's stacked LSTM: 2 layers of 100 units, FC 128, FC classes);
heterogeneous clients draw `arch` 0 (one LSTM layer) or 1 (two). Inputs are (batch, seq_len)
token ids padded at the end with 0; the representation is the LSTM output at each sequence's
last real token (LEAF reads the last step, padding included), passed through FC + ReLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.errors import ConfigError
from fedexp.models.mlp import BodyHead

PAD = 0


class LSTMBody(nn.Module):
    """Token ids -> a `fc_hidden`-wide representation."""

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden: int,
        num_layers: int,
        fc_hidden: int,
        pretrained: torch.Tensor | None = None,
        freeze_pretrained: bool = True,
    ):
        super().__init__()
        if pretrained is not None:
            vocab_size, embed_dim = pretrained.shape
        self.embedding: nn.Parameter | None = None
        if pretrained is not None and freeze_pretrained:
            # a buffer, not a frozen parameter: it never travels and no phase can unfreeze it
            self.register_buffer("frozen_embedding", pretrained.clone())
        else:
            init = torch.randn(vocab_size, embed_dim) * 0.1
            init[PAD] = 0.0
            self.embedding = nn.Parameter(pretrained.clone() if pretrained is not None else init)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden, fc_hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        table = self.embedding if self.embedding is not None else self.frozen_embedding
        out, _ = self.lstm(F.embedding(tokens, table))
        lengths = (tokens != PAD).sum(1).clamp(min=1)  # an empty tweet reads step 0
        last = out[torch.arange(len(tokens), device=tokens.device), lengths - 1]
        return F.relu(self.fc(last))


def lstm(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    embed_dim: int,
    hidden: int,
    num_layers: int,
    fc_hidden: int,
    freeze_pretrained: bool,
    vocab_size: int | None = None,
    pretrained_embeddings: torch.Tensor | None = None,
) -> BodyHead:
    """The LSTM classifier (embedding, `num_layers` LSTM layers, FC + ReLU, FC).

    `vocab_size` and `pretrained_embeddings` come from the text dataset (`model_kwargs`); with
    pretrained vectors the embedding size is theirs and `embed_dim` is ignored.
    """
    if vocab_size is None:
        raise ConfigError("model: lstm needs a text dataset that gives vocab_size (sent140)")
    body = LSTMBody(
        vocab_size,
        embed_dim,
        hidden,
        num_layers,
        fc_hidden,
        pretrained_embeddings,
        freeze_pretrained,
    )
    return BodyHead(body, nn.Linear(fc_hidden, num_classes))


def lstm_family(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    num_archs: int,
    embed_dim: int,
    hidden: int,
    fc_hidden: int,
    freeze_pretrained: bool,
    arch: int | None = None,
    vocab_size: int | None = None,
    pretrained_embeddings: torch.Tensor | None = None,
) -> BodyHead:
    """The LSTM as a family for heterogeneous clients: `arch` i has i + 1 LSTM layers.

    Without `arch` (an algorithm with one architecture) the largest, `num_archs` layers.
    """
    if arch is not None and not 0 <= arch < num_archs:
        raise ConfigError(f"model.num_archs: arch {arch} outside [0, {num_archs})")
    return lstm(
        input_shape,
        num_classes,
        embed_dim=embed_dim,
        hidden=hidden,
        num_layers=num_archs if arch is None else arch + 1,
        fc_hidden=fc_hidden,
        freeze_pretrained=freeze_pretrained,
        vocab_size=vocab_size,
        pretrained_embeddings=pretrained_embeddings,
    )
