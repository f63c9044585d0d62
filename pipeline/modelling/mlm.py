"""BERT masked-LM models whose head runs only where there is something to predict.

MosaicBERT's and NVIDIA's "sparse prediction": the MLM head (transform + the vocabulary-sized
decoder) is applied to the hidden states of the labelled positions only, ~15% of the tokens,
instead of every position; the loss is the same cross-entropy (fp32), over the same tokens.
With MiniLM's 384-wide hidden state and a 30,522-token vocabulary the decoder is most of the
step's FLOPs on CPU, so this is the largest single saving of the pretrain stage.

The classes differ from ``transformers``' ``BertForMaskedLM`` / ``BertForPreTraining`` only in
``forward`` when labels are given (without labels, e.g. in ``fill-mask``, they are the parent
classes), have the same weights and state-dict keys, and save as the parent class, so a saved
model loads with ``from_pretrained`` and ``pipeline("fill-mask")`` unchanged. ``masked_only =
False`` gives the dense head (every position) for comparison. The sentence objective's loss
weight lives here too, so pretraining needs no loss code of its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from transformers import BertForMaskedLM, BertForPreTraining
from transformers.modeling_outputs import MaskedLMOutput
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput

from pipeline.modelling.labels import IGNORE_INDEX


def mlm_loss(
    head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, masked_only: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean fp32 cross-entropy over the labelled positions, the logits that were computed).

    ``masked_only``: logits ``[n_labelled, vocab]`` for the labelled positions only; otherwise
    ``[batch, seq, vocab]`` for every position, as ``BertForMaskedLM`` computes them.
    """
    keep = labels != IGNORE_INDEX
    if masked_only:
        logits = head(hidden[keep])
        targets = labels[keep]
    else:
        logits = head(hidden)
        targets = labels
    if not bool(keep.any()):  # nothing to predict in this batch: a zero loss that still touches the graph, not NaN
        return logits.float().sum() * 0.0, logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    return loss, logits


class _SavesAsParent:
    """Saved ``config.json`` names the ``transformers`` parent class, so loaders see a standard BERT."""

    accepts_loss_kwargs = False  # our loss is a per-batch mean: the Trainer divides it by gradient accumulation itself
    masked_only: bool = True
    saved_as: str  # the transformers class name written into config.json

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        super().save_pretrained(save_directory, *args, **kwargs)  # type: ignore[misc]
        self.config.architectures = [self.saved_as]  # type: ignore[attr-defined]
        self.config.save_pretrained(save_directory)  # type: ignore[attr-defined]


class MaskedOnlyBertForMaskedLM(_SavesAsParent, BertForMaskedLM):
    """``BertForMaskedLM`` whose training/eval forward computes the MLM head at labelled positions only."""

    saved_as = "BertForMaskedLM"

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        if labels is None:
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs
            )
        hidden = self.bert(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state
        loss, logits = mlm_loss(self.cls, hidden, labels, self.masked_only)
        return MaskedLMOutput(loss=loss, logits=logits)


class MaskedOnlyBertForPreTraining(_SavesAsParent, BertForPreTraining):
    """``BertForPreTraining`` (MLM + sentence order/next sentence) with the masked-only MLM head
    and ``sentence_loss_weight`` on the sentence loss (transformers adds the two with weight 1)."""

    saved_as = "BertForPreTraining"
    sentence_loss_weight: float = 1.0

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> BertForPreTrainingOutput:
        if labels is None:
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs
            )
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True)
        loss, logits = mlm_loss(self.cls.predictions, out.last_hidden_state, labels, self.masked_only)
        relationship = self.cls.seq_relationship(out.pooler_output)
        if next_sentence_label is not None:
            loss = loss + self.sentence_loss_weight * F.cross_entropy(relationship.float(), next_sentence_label)
        return BertForPreTrainingOutput(loss=loss, prediction_logits=logits, seq_relationship_logits=relationship)
