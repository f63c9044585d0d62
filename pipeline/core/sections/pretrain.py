"""params.yaml ``pretrain``: domain-adaptive masked-LM training."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.sections.base import Seed, Strict


class ScratchModel(Strict):
    """The BertConfig used when ``pretrain.base_model: scratch``."""

    hidden_size: int = Field(ge=8)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=8)
    max_position_embeddings: int = Field(ge=8)

    @model_validator(mode="after")
    def _heads_divide(self) -> ScratchModel:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({self.num_attention_heads})"
            )
        return self


class Selection(Strict):
    """Which corpus blocks DAPT trains on: all of them, or those nearest to the tasks' train inputs (kNN-TAPT)."""

    mode: Literal["all", "nearest"]
    # corpus blocks kept per train example; at most 1,000: the neighbour lists (k x train examples x 8 bytes) are held
    # in memory, and k = 10^8 failed after 28 s as "out of memory" without naming k
    k: int = Field(ge=1, le=1000)
    embedder: str = Field(min_length=1)  # a sentence-embedding model: minilm | a local model dir | a hub id
    batch_size: int = Field(ge=1)  # texts per embedding forward pass


class Electra(Strict):
    """``pretrain.objective: electra``: replaced-token detection (ELECTRA) instead of masked-LM alone."""

    generator_fraction: float = Field(gt=0, le=1)  # generator layers as a share of the base model's (paper: 1/4-1/3)
    rtd_weight: float = Field(gt=0)  # weight of the discriminator's loss beside the generator's MLM loss (paper: 50)


class Simcse(Strict):
    """``pretrain.objective: simcse``: unsupervised SimCSE (two dropout views of a text, in-batch negatives)."""

    temperature: float = Field(gt=0)  # of the cosine similarities (paper: 0.05)
    learning_rate: float = Field(gt=0)  # its own: far below masked-LM's (paper: 3e-5 for BERT-base)
    batch_size: int = Field(ge=2)  # texts per step; each is the others' negative
    max_length: int = Field(ge=4)  # tokens of a block kept (paper: 32 for Wikipedia sentences)


class PretrainConfig(Strict):
    base_model: str = Field(min_length=1)
    objective: Literal["mlm", "electra", "simcse"] = "mlm"
    electra: Electra = Electra(generator_fraction=1 / 3, rtd_weight=50.0)
    simcse: Simcse = Simcse(temperature=0.05, learning_rate=3e-5, batch_size=32, max_length=64)
    scratch: ScratchModel
    masking: Literal["token", "whole_word", "span", "ngram"]
    ngram_probs: list[float] = Field(default=[0.4, 0.3, 0.2, 0.1], min_length=1, max_length=10)
    mask_token: Literal["mask", "similar"] = "mask"
    similar_top_k: int = Field(default=5, ge=1, le=100)
    similar_min_cosine: float = Field(default=0.5, ge=-1, le=1)
    mlm_probability: float = Field(gt=0, lt=1)
    mask_replace_prob: float = Field(ge=0, le=1)
    random_replace_prob: float = Field(ge=0, le=1)
    span_geometric_p: float = Field(gt=0, le=1)
    span_max_words: int = Field(ge=1)
    sentence_objective: Literal["none", "sop", "nsp"]
    sentence_loss_weight: float = Field(ge=0)
    max_steps: int = Field(ge=1)
    # wall-clock budget: the steps are planned to end on it (max_steps caps them)
    budget_minutes: float | None = Field(default=None, gt=0)
    head_warmup_steps: int = Field(ge=0)
    selection: Selection
    task_text: bool  # DAPT+TAPT: also train on the labelled tasks' train inputs (no labels)
    corpus_text: bool = True  # false with task_text: TAPT, the tasks' train inputs alone (the corpus only evaluates)
    micro_batch_size: int = Field(ge=1)
    gradient_accumulation_steps: int = Field(ge=1)
    learning_rate: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    warmup_steps: int = Field(ge=0)
    lr_schedule: Literal["linear", "cosine"]
    max_grad_norm: float = Field(gt=0)
    logging_steps: int = Field(ge=1)
    eval_steps: int = Field(ge=1)
    eval_max_blocks: int = Field(ge=1)
    eval_seed: Seed
    save_steps: int = Field(ge=1)
    save_total_limit: int = Field(ge=1)
    mlm_head: Literal["masked_only", "dense"]
    attention_dropout: float | None = Field(ge=0, lt=1)
    hidden_dropout: float | None = Field(ge=0, lt=1)
    torch_compile: bool
    nproc: int = Field(ge=1)

    @field_validator("ngram_probs")
    @classmethod
    def _probabilities(cls, probs: list[float]) -> list[float]:
        if any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-6):
            raise ValueError(
                f"probabilities of 1- to {len(probs)}-grams, each >= 0, summing to 1 (these sum to {sum(probs):g})"
            )
        return probs

    @model_validator(mode="after")
    def _check(self) -> PretrainConfig:
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(
                f"mask_replace_prob + random_replace_prob must not exceed 1, got {self.mask_replace_prob} + {self.random_replace_prob}"
            )
        if self.save_steps % self.logging_steps:
            raise ValueError(
                f"save_steps ({self.save_steps}) must be a multiple of logging_steps ({self.logging_steps}): "
                "the NaN check runs on logged losses and must see every step before a checkpoint is written"
            )
        if self.head_warmup_steps >= self.max_steps:
            raise ValueError(
                f"head_warmup_steps ({self.head_warmup_steps}) must be below max_steps ({self.max_steps}): "
                "the encoder would never train"
            )
        if self.sentence_objective != "none" and self.masking != "token":
            raise ValueError(
                f"sentence_objective: {self.sentence_objective} trains on sentence pairs, which carry no word ids: "
                "use masking: token with it"
            )
        if self.sentence_objective != "none" and self.objective == "electra":
            raise ValueError(
                f"objective: electra replaces masked tokens of masked-LM blocks; it does not combine with "
                f"sentence_objective: {self.sentence_objective}"
            )
        if self.sentence_objective != "none" and self.task_text:
            raise ValueError(
                f"task_text: true trains on masked-LM blocks; it does not combine with sentence_objective: "
                f"{self.sentence_objective}"
            )
        if self.sentence_objective != "none" and self.selection.mode == "nearest":
            raise ValueError(
                f"selection.mode: nearest selects masked-LM blocks; sentence_objective: {self.sentence_objective} "
                "trains on sentence pairs, which are not selected: use one of them"
            )
        return self

    @model_validator(mode="after")
    def _text_and_objective(self) -> PretrainConfig:
        if not self.corpus_text and not self.task_text:
            raise ValueError("corpus_text and task_text are both false: nothing to train on")
        if not self.corpus_text and (self.selection.mode == "nearest" or self.sentence_objective != "none"):
            raise ValueError(
                "corpus_text: false trains on the tasks' text alone; selection.mode: nearest and sentence_objective "
                "choose corpus blocks and need corpus_text: true"
            )
        if self.objective == "simcse" and (self.sentence_objective != "none" or self.nproc > 1):
            raise ValueError(
                "objective: simcse trains single texts in one process: use sentence_objective: none and nproc: 1"
            )
        return self
