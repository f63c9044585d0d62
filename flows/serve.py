"""``python -m flows.serve`` (``adaptbert-serve``): serve the scheduled pipeline and the manual promotion flow.

Needs a real Prefect server (schedules do nothing on the ephemeral one): start it with
``prefect server start`` and point ``PREFECT_API_URL`` at it. Without one this refuses with a clear
message instead of serving a schedule that would never fire. The process keeps running and
executes the runs the server schedules (or that someone triggers from the UI).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import flows
from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.core.sections.schedule import ScheduleConfig

DEPLOYMENT = "scheduled"


class ServeError(RuntimeError):
    """Serving cannot start: no server, an unreachable one, or an invalid schedule."""


def api_url() -> str:
    """``PREFECT_API_URL`` (from the environment or the active Prefect profile), or a :class:`ServeError`."""
    from prefect.settings import PREFECT_API_URL

    url = os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()
    if not url:
        raise ServeError(
            "no Prefect server configured: schedules need one. Start it with `prefect server start` and "
            "`export PREFECT_API_URL=http://127.0.0.1:4200/api` (or `prefect config set PREFECT_API_URL=...`)"
        )
    return str(url)


def check_server(url: str) -> None:
    """The server answers its health endpoint, or a :class:`ServeError` naming the URL."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=10).raise_for_status()
    except httpx.HTTPError as err:
        raise ServeError(
            f"Prefect server at {url} is unreachable ({type(err).__name__}: {err}); "
            "is `prefect server start` running, and is PREFECT_API_URL right?"
        ) from None


def check_cron(sc: ScheduleConfig) -> None:
    """A :class:`ServeError` naming ``schedule.cron`` when it is not a valid cron expression or timezone."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=sc.cron, timezone=sc.timezone)
    except ValueError as err:  # pydantic's ValidationError: the first problem, without the URL footer
        why = err.errors()[0]["msg"] if hasattr(err, "errors") else str(err)
        raise ServeError(
            f"params.yaml: schedule.cron '{sc.cron}' (timezone '{sc.timezone}') is not a valid schedule: {why}"
        ) from None


def deployments(root: Path, sc: ScheduleConfig, profile: str | None) -> list:
    """The scheduled pipeline and the manual compare-and-promote flow."""
    from prefect.schedules import Cron

    from flows.pipeline import adaptbert_pipeline, compare_and_promote

    return [
        adaptbert_pipeline.to_deployment(
            name=DEPLOYMENT,
            schedule=Cron(sc.cron, timezone=sc.timezone),
            parameters={"root": str(root), "profile": profile},
            description=f"adaptbert pipeline over the DVC stages of {root}, on '{sc.cron}' ({sc.timezone})",
        ),
        compare_and_promote.to_deployment(
            name="manual",
            parameters={"root": str(root), "profile": profile},
            description="run the promotion gate for a registered version (give `version`)",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="adaptbert-serve", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(flows.PROJECT_ROOT), help="the project (git + DVC repository) to run")
    parser.add_argument("--profile", default=None, help="profiles/<name>.yaml applied to every scheduled run")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    try:
        sc = load_config(root / "params.yaml").schedule
        check_cron(sc)
        url = api_url()
        check_server(url)
    except (ServeError, ConfigError) as err:
        print(f"serve: {err}", file=sys.stderr)
        return 2
    from prefect import serve

    print(
        f"serving adaptbert-pipeline/{DEPLOYMENT} ('{sc.cron}', {sc.timezone}) and compare-and-promote/manual on {url}",
        flush=True,
    )
    serve(*deployments(root, sc, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
