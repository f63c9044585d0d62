"""Task heads over the encoder's last hidden states: the building blocks task types pick from."""

from __future__ import annotations

import torch
from torch import nn


class ClassificationHead(nn.Module):
    """Pooled sequence -> dense + tanh -> ``num_outputs`` logits ([CLS] or attention-masked mean pooling).

    One output per label for (multi-label) classification, a single output for regression.
    """

    def __init__(self, hidden: int, num_outputs: int, pooling: str, dropout: float) -> None:
        super().__init__()
        self.pooling = pooling
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_outputs)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "mean":
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        else:
            pooled = hidden[:, 0]
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(pooled)))))


class TokenHead(nn.Module):
    """Per-token label logits (BIO tags)."""

    def __init__(self, hidden: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(hidden))


class SpanHead(nn.Module):
    """Start and end logits per token: ``[batch, tokens, 2]``; padding gets -inf-like scores."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, 2)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.out(hidden)
        return logits.masked_fill(attention_mask.unsqueeze(-1) == 0, torch.finfo(logits.dtype).min / 2)
