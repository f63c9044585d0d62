"""Knowledge distillation of the multi-task model into a shallower student (Hinton et al. 2015; DistilBERT).

The student is the teacher with fewer encoder layers, initialised from the teacher's own layers
(DistilBERT takes every other one), its embeddings and every task head. It trains on the tasks'
train splits with finetune's sampler, schedule and early stopping
(:func:`pipeline.training.trainer.train`); the loss of each batch is
``alpha * soft + (1 - alpha) * gold``, where ``soft`` is the task type's ``distill_loss`` of the
student's logits against the (frozen, eval-mode) teacher's on the same batch, and ``gold`` the
task's ordinary loss.
"""

from __future__ import annotations

import copy
from typing import Any

from pipeline.core.errors import ConfigError
from pipeline.training.trainer import LossFn


def student_layers(teacher_layers: int, requested: list[int] | None) -> list[int]:
    """Teacher layer indices the student keeps: ``requested``, or every other one from 0 (6 -> 0, 2, 4)."""
    layers = requested if requested is not None else list(range(0, teacher_layers, 2))
    if not layers or layers[-1] >= teacher_layers:  # checked before any stage runs too (check_against_base_model)
        raise ConfigError(
            f"compress.distill.student_layers: {layers} names a layer the teacher does not have "
            f"(it has layers 0..{teacher_layers - 1})"
        )
    return layers


def student_from_teacher(teacher: Any, layers: list[int]) -> Any:
    """A copy of the multi-task ``teacher`` whose encoder keeps only ``layers`` (weights copied, heads included)."""
    from torch import nn

    student = copy.deepcopy(teacher)
    encoder = student.encoder
    encoder.encoder.layer = nn.ModuleList([encoder.encoder.layer[i] for i in layers])
    for new_index, layer in enumerate(encoder.encoder.layer):
        for module in layer.modules():  # the KV-cache index of a layer (unused by an encoder, kept consistent)
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    encoder.config.num_hidden_layers = len(layers)
    return student.train()


def distillation_loss(teacher: Any, alpha: float, temperature: float) -> LossFn:
    """The Trainer loss: ``alpha`` x the type's soft-target loss against ``teacher`` + (1 - alpha) x the gold loss."""
    import torch

    teacher.eval()  # no dropout; its forward runs under no_grad, and its parameters are in no optimizer

    def compute(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        out = model(**inputs)
        task = inputs["task"]
        spec = model.specs[task]
        features = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in inputs}
        if next(teacher.parameters()).device != inputs["input_ids"].device:
            teacher.to(inputs["input_ids"].device)  # the Trainer moved the student (GPU); the teacher follows once
        with torch.no_grad():
            target = teacher(task=task, **features)["logits"]
        soft = spec.kind.distill_loss(out["logits"], target, inputs, temperature)
        loss = alpha * spec.settings.loss_weight * soft + (1 - alpha) * out["loss"]
        return {**out, "loss": loss, "soft_loss": soft.detach()}

    return compute
