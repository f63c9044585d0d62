"""Developer tools: ``python -m tools.dvc_deps`` (the computed code deps of dvc.yaml and dvc.lock)."""
