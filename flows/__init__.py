"""Prefect flows and deployments over the DVC stages (wiring only; no ML logic here).

The flows arrive with the orchestration issue; ``pipeline/`` never imports Prefect.
"""
