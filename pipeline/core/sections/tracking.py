"""params.yaml ``tracking``: MLflow run logging."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict


class TrackingConfig(Strict):
    """MLflow run logging; where to (``MLFLOW_TRACKING_URI``) is environment, not params."""

    enabled: bool
    experiment: str = Field(min_length=1)
    retries: int = Field(ge=0)
    retry_backoff_s: int = Field(ge=0)  # MLflow takes an integer backoff factor
    request_timeout_s: int = Field(ge=1)
