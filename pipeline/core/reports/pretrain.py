"""``reports/pretrain.json``: what the pretrain stage (or a tournament arm) trained, how fast, and the held-out
perplexity of the base and the adapted model on the same fixed masks.

One type for every kind of run; each kind sets its own keys and the file holds only those: masked-LM DAPT (the
masking keys, the warm-up timer, a time budget, a selection), ELECTRA (``objective``, ``electra``), SimCSE
(``objective``, ``simcse``), no adaptation (``adaptation: none`` and its reason). Timings and what a run found
left by an earlier one (``resumed_from``, ``checkpoint_log``) are its measured half (``reports/measured/``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.core.reports.base import StageReport


class Budget(StageReport):
    """``pretrain.budget_minutes``: the minutes asked, the plan that fitted them, epochs of the blocks seen."""

    minutes_asked: int | float  # as configured (an int stays one: the report keeps its bytes)
    plan: dict[str, Any] | None  # budget-plan.json as written by training/pretraining/budget.py (steps, speeds)
    epochs: float


class HeldOutDetection(StageReport):
    """ELECTRA's discriminator on the held-out blocks: replaced-token detection scores."""

    accuracy: float
    auc: float | None  # None where one class is absent (no replacement sampled)
    replaced_share: float


class Electra(StageReport):
    """``pretrain.electra`` as run, the generator's depth and the detection scores before and after."""

    model_config = StageReport.model_config | {"extra": "allow"}  # pretrain.electra's keys, as configured
    generator_layers: int
    base: HeldOutDetection
    adapted: HeldOutDetection


class Selection(StageReport):
    """The select stage's nearest blocks a run trained on (``pretrain.selection.mode: nearest``)."""

    mode: Literal["nearest"]
    k: int
    corpus_blocks: int
    selected_blocks: int


class PretrainReport(StageReport):
    """reports/pretrain.json."""

    adaptation: Literal["none"] | None = None  # set only when the adapt stage chose no adaptation
    adaptation_reason: str | None = None
    objective: Literal["electra", "simcse"] | None = None  # set for the objectives other than masked LM
    simcse: dict[str, Any] | None = None  # pretrain.simcse as run (its config section dumped)
    base_model: str
    masking: str | None = None  # masked-LM and ELECTRA runs: pretrain.masking, mask_token, similar words
    mask_token: str | None = None
    similar_word_coverage: float | None = None
    mlm_head: str
    device: str
    world_size: int
    precision: str
    precision_reason: str
    training_weights: str | None = None  # "bf16, fp32 masters" or "fp32" (the Trainer's runs)
    global_step: int
    resumed_from: str | None = None  # measured: the checkpoint this session resumed
    checkpoint_log: list[str] = Field(default_factory=list)  # measured: what was done with the checkpoints found
    global_batch: int
    block_length: int
    train_blocks: int
    task_text_blocks: int
    eval_blocks: int
    tokens_seen: int
    train_seconds: float | None = None  # measured (absent from the versioned file)
    tokens_per_s: int | None = None  # measured: this session's tokens per second of training
    warmup_seconds: float | None = None  # measured: the first steps' seconds (the Trainer's runs)
    warm_tokens_per_s: int | None = None  # measured: tokens/s after them
    train_loss: float | None
    base_perplexity: float
    adapted_perplexity: float
    perplexity_ratio: float
    budget: Budget | None = None  # pretrain.budget_minutes runs
    budget_minutes_used_s: float | None = None  # measured: seconds of training this session
    selection: Selection | None = None
    electra: Electra | None = None

    @property
    def text_trained(self) -> str:
        """What the masked-LM run trained on, as the literature names it: TAPT (the tasks' train inputs alone),
        DAPT+TAPT (both), DAPT (the corpus)."""
        if not self.task_text_blocks:
            return "DAPT"
        return "TAPT" if self.task_text_blocks == self.train_blocks else "DAPT+TAPT"

    @property
    def adapted(self) -> bool:
        """Whether the encoder was trained at all (the adapt stage may choose none: the base kept)."""
        return self.adaptation != "none"
