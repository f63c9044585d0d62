"""ELECTRA's replaced-token detection (Clark et al. 2020) as a domain-adaptive pretraining objective.

A small generator (a masked LM: the base model's first layers, or a scratch config's) fills the positions the
masking chose with tokens sampled from its predictions; the discriminator (the base encoder, all its layers)
reads the corrupted block and tells, at every position, whether its token is the original. Every token gives
the discriminator a training signal instead of the ~15% an MLM learns from. As in the paper: the two train
jointly, ``loss = generator MLM loss + rtd_weight * discriminator loss`` (lambda = 50), the sampling is not
differentiated through, the generator and the discriminator share their embeddings (token, position, type),
and a position whose sample equals the original token is labelled original.

:class:`ElectraPretraining` is a plain ``nn.Module`` (the HF Trainer checkpoints it with the shared embeddings
once: :func:`unique_state_dict`); what the pretrain stage saves is ``bert`` alone, a standard ``BertModel``
that fine-tuning, evaluation, compression and serving load unchanged, with the generator (a standard
``BertForMaskedLM``) and the discriminator head kept apart (:func:`save_electra_parts`).

The replacements are sampled from a generator seeded per batch by the collator (:class:`RtdCollator`, from
the batch's own seeded RNG, like its masks), so a resumed run samples exactly as the uninterrupted one did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import ModelOutput

from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.modelling.masking import MaskingCollator, pad_masked
from pipeline.modelling.mlm import mlm_loss

GENERATOR_DIR = "electra/generator"  # under models/dapt/: the generator, a BertForMaskedLM (fill-mask)
HEAD_FILE = "electra/discriminator_head.safetensors"  # under models/dapt/: the replaced-token detection head


def generator_layers(num_layers: int, fraction: float) -> int:
    """Encoder layers of the generator: ``fraction`` of the discriminator's, at least 1 (MiniLM's 6 x 1/3 = 2)."""
    return max(1, min(num_layers, round(num_layers * fraction)))


class DiscriminatorHead(nn.Module):
    """Per-token 'replaced?' logit: dense + GELU + a 1-unit projection (ELECTRA's discriminator predictions)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(hidden))).squeeze(-1)


@dataclass
class ElectraOutput(ModelOutput):  # type: ignore[misc]
    """The joint loss first (the Trainer reads ``loss``), then its parts and what the discriminator saw."""

    loss: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    discriminator_loss: torch.Tensor | None = None
    discriminator_logits: torch.Tensor | None = None  # [batch, seq]: > 0 means "replaced"
    replaced: torch.Tensor | None = None  # [batch, seq] bool: the discriminator's labels
    corrupted_ids: torch.Tensor | None = None  # [batch, seq]: what the discriminator read


def sample_replacements(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``logits`` ([n, vocab]), drawn from softmax(logits) in fp32 (no gradient).

    By inverse transform: one uniform number per row against the row's cumulative distribution. Written here
    because ``torch.multinomial`` draws an exponential number for every vocabulary entry of every row on a CPU
    (9.4M Mersenne-Twister draws a MiniLM step: 32% of an ELECTRA step on a 2-core AMX Xeon, 230 ms against 20 ms
    this way). ``right=True`` never lands on a zero-probability token (its cumulative value equals its left
    neighbour's); the uniform is scaled by the row's own fp32 total, so rounding in the sum shifts no token's
    share by more than ~1e-7."""
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    cdf = torch.softmax(logits.detach().float(), dim=-1).cumsum_(dim=-1)
    u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1).squeeze(-1)


def corrupt(
    input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(original ids, the discriminator's input, its labels): the masked positions (``labels`` != ignore) get
    ``sampled`` in order; a position is labelled replaced exactly where its token differs from the original."""
    keep = labels != IGNORE_INDEX
    original = torch.where(keep, labels, input_ids)
    corrupted = original.clone()
    corrupted[keep] = sampled
    return original, corrupted, corrupted != original


class ElectraPretraining(nn.Module):
    """Generator + discriminator trained jointly; ``bert`` is the discriminator's encoder (what is kept)."""

    accepts_loss_kwargs = False  # a per-batch mean loss: the Trainer divides it by gradient accumulation itself

    def __init__(self, discriminator: nn.Module, generator: nn.Module, rtd_weight: float) -> None:
        """``discriminator``: a ``BertModel``; ``generator``: a masked-only ``BertForMaskedLM``, whose embeddings
        are replaced by the discriminator's (tied, as in the paper) and whose decoder follows them."""
        super().__init__()
        self.bert = discriminator
        self.generator = generator
        self.discriminator_head = DiscriminatorHead(discriminator.config.hidden_size)
        self.rtd_weight = rtd_weight
        generator.bert.embeddings = discriminator.embeddings
        generator.cls.predictions.decoder.weight = discriminator.embeddings.word_embeddings.weight
        self.config = discriminator.config  # what the Trainer and the checkpoint code read (vocab, type)
        # the aliases a checkpoint leaves out (unique_state_dict): the Trainer's resume expects them missing
        self._keys_to_ignore_on_save = sorted(set(self.state_dict()) - set(unique_state_dict(self)))

    def tie_weights(self) -> None:
        """Point the generator's decoder at the shared word embeddings again (the Trainer calls this after loading a
        checkpoint; the embeddings themselves are one module, loaded in place)."""
        self.generator.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        sample_seed: torch.Tensor | None = None,
        sampler: torch.Generator | None = None,
    ) -> ElectraOutput:
        """``labels``: the masked positions' original ids (ignore elsewhere); ``sample_seed`` (from
        :class:`RtdCollator`) or ``sampler`` seed the replacements; neither: the global RNG."""
        if labels is None:
            raise ValueError("ElectraPretraining trains on masked blocks: labels are required")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if sample_seed is not None:
            sampler = torch.Generator(device=input_ids.device).manual_seed(int(sample_seed.reshape(-1)[0]))
        gen = self.generator
        hidden = gen.bert(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state
        gen_loss, logits = mlm_loss(gen.cls, hidden, labels, gen.masked_only)
        keep = labels != IGNORE_INDEX
        at_masked = logits if gen.masked_only else logits[keep]
        _original, corrupted, replaced = corrupt(input_ids, labels, sample_replacements(at_masked, sampler))
        disc_hidden = self.bert(
            corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state
        disc_logits = self.discriminator_head(disc_hidden)
        active = attention_mask.bool()  # every real token, [CLS] and [SEP] included (the paper's input mask)
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits.float()[active], replaced[active].float())
        return ElectraOutput(
            loss=gen_loss + self.rtd_weight * disc_loss,
            generator_loss=gen_loss,
            discriminator_loss=disc_loss,
            discriminator_logits=disc_logits,
            replaced=replaced,
            corrupted_ids=corrupted,
        )


class RtdCollator(MaskingCollator):
    """:class:`MaskingCollator` plus ``sample_seed``: one number from the batch's own seeded generator (drawn after
    its masks, so the masks are those of MLM training), which seeds the generator's sampling of replacements."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = super().torch_call(examples)
        if "labels" not in examples[0]:  # the fixed evaluation set seeds its sampling itself
            batch["sample_seed"] = torch.randint(0, 2**62, (1,), generator=self.generator)
        return batch


def unique_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared tensor once (the first name wins: ``bert.embeddings...`` before the
    generator's): safetensors refuses aliased tensors, and loading ``bert``'s restores the shared module."""
    seen: set[tuple[int, int]] = set()
    unique = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        unique[name] = tensor
    return unique


@dataclass
class RtdScores:
    """Held-out scores on fixed masks: the generator's perplexity and the discriminator's accuracy and ROC AUC."""

    perplexity: float
    accuracy: float  # share of real tokens whose replaced/original call (logit > 0) is right
    auc: float  # ROC AUC of the logits over real tokens (0.5: no better than chance)
    replaced_share: float  # share of real tokens the generator's samples changed


def rtd_scores(
    model: ElectraPretraining, items: list[dict[str, Any]], pad_id: int, autocast: Any, seed: int, batch_size: int
) -> RtdScores:
    """Score ``items`` (pre-masked blocks: :func:`pipeline.training.pretraining.evaluation.fixed_eval_set`); the replacements
    are sampled with ``seed``, so the same model always sees the same corrupted blocks (ELECTRA's own metrics)."""
    from sklearn.metrics import roc_auc_score

    model.eval()
    device = next(model.parameters()).device
    sampler = torch.Generator(device=device).manual_seed(seed)
    loss_sum, masked, logits_all, labels_all = 0.0, 0, [], []
    with torch.no_grad(), autocast:
        for start in range(0, len(items), batch_size):
            batch = {k: v.to(device) for k, v in pad_masked(items[start : start + batch_size], pad_id).items()}
            out = model(**batch, sampler=sampler)
            n = int((batch["labels"] != IGNORE_INDEX).sum())
            loss_sum += float(out.generator_loss) * n
            masked += n
            active = batch["attention_mask"].bool()
            logits_all.append(out.discriminator_logits.float()[active].cpu())
            labels_all.append(out.replaced[active].cpu())
    logits, labels = torch.cat(logits_all), torch.cat(labels_all)
    both_classes = bool(labels.any()) and not bool(labels.all())
    return RtdScores(
        perplexity=math.exp(min(loss_sum / max(masked, 1), 50.0)),
        accuracy=float(((logits > 0) == labels).float().mean()),
        auc=float(roc_auc_score(labels.numpy(), logits.numpy())) if both_classes else float("nan"),
        replaced_share=float(labels.float().mean()),
    )


def save_electra_parts(model: ElectraPretraining, out: Path) -> None:
    """``out/`` gets the discriminator as a ``BertModel``; ``out/electra/`` the generator (``BertForMaskedLM``:
    its own copy of the shared embeddings, so it loads alone) and the discriminator head."""
    import copy

    from safetensors.torch import save_file

    model.bert.save_pretrained(out)
    generator = copy.deepcopy(model.generator)  # the shared embeddings copied with it, its decoder tied to the copy
    generator.save_pretrained(out / GENERATOR_DIR)
    head = {k: v.detach().contiguous() for k, v in model.discriminator_head.state_dict().items()}
    save_file(head, str(out / HEAD_FILE), metadata={"format": "pt"})
