"""params.yaml ``register``: the registry entry and the promotion gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.sections.base import Strict


class ServeRule(Strict):
    """Which of a run's models (the full one or a compressed variant) is proposed for serving."""

    rule: Literal["full", "fastest_within"]
    max_mean_drop: float = Field(ge=0)
    max_task_drop: float = Field(ge=0)


class RegisterConfig(Strict):
    """The registry entry and the promotion gate (``pipeline.tracking.promotion.should_promote``)."""

    model_name: str = Field(min_length=1)
    min_delta: float
    max_regression: float = Field(ge=0)
    min_gain_over_trivial: float
    floors: dict[str, float] = Field(default_factory=dict)
    log_fill_mask: bool
    serve: ServeRule
