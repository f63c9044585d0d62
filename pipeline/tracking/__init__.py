"""MLflow runs, the registry and its CLI."""
