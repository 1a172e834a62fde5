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
    vocab_size: int | None = None,
    pretrained_embeddings: torch.Tensor | None = None,
    embed_dim: int = 100,
    hidden: int = 100,
    num_layers: int = 2,
    fc_hidden: int = 128,
    freeze_pretrained: bool = True,
    arch: int | None = None,
    num_archs: int = 2,
) -> BodyHead:
    """The LSTM classifier; `arch` i (heterogeneous clients) means i + 1 LSTM layers.

    `vocab_size` and `pretrained_embeddings` come from the text dataset (`model_kwargs`); with
    pretrained vectors the embedding size is theirs and `embed_dim` is ignored.
    """
    if vocab_size is None:
        raise ConfigError("model: lstm needs a text dataset that gives vocab_size (sent140)")
    if arch is not None:
        if not 0 <= arch < num_archs:
            raise ConfigError(f"model.num_archs: arch {arch} outside [0, {num_archs})")
        num_layers = arch + 1
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
