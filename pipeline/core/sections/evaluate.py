"""params.yaml ``evaluate``: test scoring and the paired bootstrap."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict


class EvaluateConfig(Strict):
    batch_size: int = Field(ge=1)
    bootstrap_resamples: int = Field(ge=0)
    confidence: float = Field(gt=0, lt=1)
