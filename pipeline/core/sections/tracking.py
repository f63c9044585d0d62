"""params.yaml ``tracking``: MLflow run logging."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict

PROFILE_NAME = r"^[A-Za-z0-9_-]+$"  # a profiles/<name>.yaml stem that MLflow accepts inside model names


class TrackingConfig(Strict):
    """MLflow run logging; where to (``MLFLOW_TRACKING_URI``) is environment, not params."""

    enabled: bool
    experiment: str = Field(min_length=1)
    retries: int = Field(ge=0)
    retry_backoff_s: int = Field(ge=0)  # MLflow takes an integer backoff factor
    request_timeout_s: int = Field(ge=1)
    # the profile these params come from (set by flows.stages.profile_overrides, never by hand): runs, versions and
    # reports are tagged with it, and its runs use their own experiment and registered model (see profile_overrides)
    profile: str | None = Field(default=None, pattern=PROFILE_NAME)
