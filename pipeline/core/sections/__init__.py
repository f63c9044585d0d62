"""params.yaml one section per module, so that a stage depends only on the sections it reads (see docs/architecture.md)."""
