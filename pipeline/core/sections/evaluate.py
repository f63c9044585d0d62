"""params.yaml ``evaluate``: test scoring and the paired bootstrap."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict


class EvaluateConfig(Strict):
    batch_size: int = Field(ge=1)
    bootstrap_resamples: int = Field(ge=0)
    confidence: float = Field(gt=0, lt=1)
    attention_examples: int = Field(default=1, ge=0, le=10)  # test examples per task drawn as attention maps
    attention_layer: int = -1  # encoder layer drawn (negative: from the top)
    attention_head: int | None = Field(default=None, ge=0)  # one head, or None: the mean over the layer's heads
    attention_max_tokens: int = Field(default=40, ge=4, le=128)  # examples up to this long are preferred
    error_examples: int = Field(default=5, ge=0, le=100)  # confusions and mistakes listed per task (errors.json)
