"""params.yaml ``register``: the registry entry and the promotion gate."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict


class RegisterConfig(Strict):
    """The registry entry and the promotion gate (``pipeline.tracking.registry.should_promote``)."""

    model_name: str = Field(min_length=1)
    min_delta: float
    max_regression: float = Field(ge=0)
    min_gain_over_trivial: float
    floors: dict[str, float] = Field(default_factory=dict)
    log_fill_mask: bool
