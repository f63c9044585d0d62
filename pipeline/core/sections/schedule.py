"""params.yaml ``schedule``: the Prefect deployment."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.sections.base import Strict


class NotifyConfig(Strict):
    """Notifications of the Prefect flows to a webhook (Slack, Teams, Mattermost, your own): its URL is a secret, so
    params.yaml names the environment variable that holds it; unset or empty, nothing is sent."""

    webhook_env: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$")
    events: list[Literal["failure", "promotion"]]  # (not "on": YAML 1.1 reads that key as True)


class ScheduleConfig(Strict):
    """The Prefect deployment (``flows/``): when it runs, retries of transient failures, stage timeouts."""

    cron: str = Field(min_length=1)
    timezone: str = Field(min_length=1)
    retries: int = Field(ge=0)
    retry_delay_s: list[float] = Field(min_length=1)
    timeout_s: dict[str, int] = Field(min_length=1)
    notify: NotifyConfig

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if "default" not in self.timeout_s:
            raise ValueError("timeout_s needs a 'default' entry (seconds) for the stages not listed")
        if any(v <= 0 for v in self.timeout_s.values()):
            raise ValueError(f"timeout_s values must be positive seconds, got {self.timeout_s}")
        return self

    def timeout_for(self, stage: str) -> int:
        """Wall-clock limit of ``stage`` in seconds."""
        return self.timeout_s.get(stage, self.timeout_s["default"])
