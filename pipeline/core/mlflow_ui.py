"""Addresses of MLflow UI pages: the run, its artifacts, a registered version, as every report and log line writes them."""

from __future__ import annotations

# MLflow 3's UI shows an experiment in the workflow of the address's ``workflowType`` (else the browser's last choice,
# GenAI at first: traces, an assistant panel, a run report framed as an evaluation): every address we write asks for
# the machine-learning one, whose pages are the runs table, the run with its metrics and artifacts, the registry
ML_WORKFLOW = "workflowType=machine_learning"


def mlflow_ui_page(route: str, base: str = "") -> str:
    """``base`` + ``#/<route>`` in the MLflow UI's machine-learning workflow (e.g. ``experiments/1/runs/abc``)."""
    return f"{base.rstrip('/')}/#/{route.lstrip('/')}?{ML_WORKFLOW}" if base else f"#/{route.lstrip('/')}?{ML_WORKFLOW}"


LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` / `mlflow server` listen by default


def ui_base(tracking_uri: str) -> str:
    """The MLflow UI of a tracking store: the server itself for an http(s) URI, else a local ``mlflow ui`` on :5000."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith("http") else LOCAL_UI
