"""Tests, e2e layer: the real components: dvc repro in a temporary git repo, mlflow and prefect servers, the report in a browser, faults (mostly slow)."""
