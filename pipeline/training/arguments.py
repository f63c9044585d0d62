"""One ``TrainingArguments`` builder for every Trainer the pipeline runs (pretraining, fine-tuning and with it
distillation and the pruning recovery): the choices they share are made here once.

Shared: evaluation and checkpoints every ``eval_steps``/``save_steps`` steps, losses logged as they are (no NaN
filter: the NaN guard must see them), ``seed`` for the model and the data order, no dataloader workers (the blocks
are memory-mapped; worker processes would only copy them), every column kept (our collators read them), reporting to
MLflow only when a run is active here (:func:`~pipeline.tracking.runs.trainer_report_to`), the CPU unless the
precision is on a GPU, no progress bars (our callbacks print progress lines).
"""

from __future__ import annotations

from typing import Any

from pipeline.modelling.precision import Precision
from pipeline.tracking.runs import trainer_report_to


def training_arguments(  # noqa: PLR0913
    *,
    output_dir: str,
    max_steps: int,
    batch_size: int,
    learning_rate: float,
    weight_decay: float,
    warmup: float,
    lr_schedule: str,
    max_grad_norm: float,
    logging_steps: int,
    eval_steps: int,
    save_steps: int,
    save_total_limit: int | None,
    seed: int,
    precision: Precision,
    bf16_autocast: bool,
    **specific: Any,
) -> Any:
    """``TrainingArguments`` with the pipeline's shared choices and ``specific`` (a trainer's own options).

    ``warmup`` is transformers 5's ``warmup_steps``, which reads a value below 1 as a share of ``max_steps``
    (rounded up) and one of 1 or more as a step count (``warmup_ratio`` is deprecated there): fine-tuning passes its
    ``warmup_ratio`` (< 1 by its config), pretraining its step count. ``bf16_autocast`` is the Trainer's own bf16
    (autocast over fp32 weights); a model that trains in bf16 weights with fp32 masters turns it off.
    """
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        warmup_steps=warmup,
        lr_scheduler_type=lr_schedule,
        max_grad_norm=max_grad_norm,
        logging_steps=logging_steps,
        logging_nan_inf_filter=False,
        eval_strategy="steps",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=save_total_limit,
        bf16=bf16_autocast,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        report_to=trainer_report_to(),
        use_cpu=precision.device != "cuda",
        disable_tqdm=True,
        **specific,
    )
