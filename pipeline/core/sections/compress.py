"""params.yaml ``compress``: which compressed variants of the fine-tuned model to build, and how."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pipeline.core.sections.base import Strict


class AccuracyFloor(Strict):
    """How far below the full model a variant may fall and still be registered (metric units)."""

    max_mean_drop: float = Field(ge=0)
    max_task_drop: float = Field(ge=0)


class Int8Config(Strict):
    backend: Literal["auto", "x86", "onednn", "fbgemm", "qnnpack"]
    per_channel: bool


class DistillConfig(Strict):
    student_layers: list[int] | None = None
    temperature: float = Field(gt=0)
    alpha: float = Field(ge=0, le=1)
    max_steps: int = Field(ge=1)
    learning_rate: float = Field(gt=0)

    @field_validator("student_layers")
    @classmethod
    def _layers(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or sorted(set(value)) != value or value[0] < 0):
            raise ValueError("student_layers must be increasing, distinct, non-negative teacher layer indices")
        return value


class PruneConfig(Strict):
    fraction: float = Field(gt=0, lt=1)
    importance_batches: int = Field(ge=1)
    recovery_steps: int = Field(ge=0)
    learning_rate: float = Field(gt=0)


class LatencyConfig(Strict):
    requests: int = Field(ge=1)
    warmup: int = Field(ge=0)
    throughput_batches: int = Field(ge=1)
    batch_size: int = Field(ge=1)


class CompressConfig(Strict):
    """``compress``: variants of ``models/finetuned`` and how each is measured."""

    enabled: bool
    variants: list[Literal["int8", "distilled", "pruned", "distilled_int8"]] = Field(min_length=1)
    accuracy_floor: AccuracyFloor
    int8: Int8Config
    distill: DistillConfig
    prune: PruneConfig
    latency: LatencyConfig

    @field_validator("variants")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"variants must be distinct, got {value}")
        return value
