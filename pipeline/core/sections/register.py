"""params.yaml ``register``: the registry entry and the promotion gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pipeline.core.sections.base import Strict

MLFLOW_REFUSED = "/:.%\"'"  # characters MLflow refuses in registered and logged model names


class ServeRule(Strict):
    """Which of a run's models (the full one or a compressed variant) is proposed for serving."""

    rule: Literal["full", "fastest_within"]
    max_mean_drop: float = Field(ge=0)
    max_task_drop: float = Field(ge=0)
    # characters of text one request may hold, all rows together (a bigger one is a 400 naming this limit): a QA
    # context of 2 MB was ~8,000 windows and 27 s of both cores, for one row
    max_request_chars: int = Field(ge=1)
    # what `adaptbert serve` reads of a request before the model sees it (MLflow's own server has no bound: a 30 MB
    # body was answered after 36 s, JSON nested 100,000 deep an HTTP 500): more bytes is a 413, deeper JSON a 400
    max_body_bytes: int = Field(ge=1024)
    max_json_depth: int = Field(ge=3, le=1000)  # dataframe_records are 3 levels deep


class CardSettings(Strict):
    """What every registered version's model card declares that no report knows: the terms and the language."""

    # an SPDX id or Hub license name (apache-2.0, mit, other, ...): the base model's terms and your data's decide it
    license: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    language: list[str] = Field(min_length=1)  # ISO 639-1 codes of the text the model reads (en, zh, ...)

    @field_validator("language")
    @classmethod
    def _iso_codes(cls, value: list[str]) -> list[str]:
        if bad := [code for code in value if not (2 <= len(code) <= 3 and code.isascii() and code.islower())]:
            raise ValueError(f"{bad}: ISO 639 language codes, e.g. en, zh")
        return value


class RegisterConfig(Strict):
    """The registry entry and the promotion gate (``pipeline.tracking.gate.should_promote``)."""

    model_name: str = Field(min_length=1)
    min_delta: float
    max_regression: float = Field(ge=0)
    min_gain_over_trivial: float
    floors: dict[str, float] = Field(default_factory=dict)
    log_fill_mask: bool
    serve: ServeRule
    card: CardSettings

    @field_validator("model_name")
    @classmethod
    def _mlflow_accepts(cls, value: str) -> str:
        """Names MLflow accepts, checked at load time so that register does not refuse one after the whole run:
        the registered name (``mlflow.utils.validation._validate_model_name``: no ``/`` or ``:``) and the logged
        models named after it (``<name>-full``; ``_validate_logged_model_name``: none of ``/:.%"'`` either).
        Restated, not imported: importing MLflow costs ~2 s in every process that loads params."""
        if not value.strip():
            raise ValueError("must not be blank")
        if bad := sorted(set(value) & set(MLFLOW_REFUSED)):
            raise ValueError(f"'{value}': MLflow refuses {bad} in model names (refused: {MLFLOW_REFUSED})")
        if bad := sorted(set(value) & set("<>&")):  # the name is written into pages, model cards and Markdown notes
            raise ValueError(f"'{value}': markup characters {bad} are refused in model names")
        return value
