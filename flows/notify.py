"""Notifications of the flows to a webhook: a failed pipeline run, a version that became champion.

Sent with Prefect's ``CustomWebhookNotificationBlock`` (a JSON POST of ``{"title": ..., "text": ...}``, which Slack's,
Mattermost's and Teams' incoming webhooks and any small receiver accept). The URL is a secret (a Slack webhook URL
is its own credential): params.yaml names the environment variable that holds it (``schedule.notify.webhook_env``)
and it goes into the block as a template secret, so neither the block's repr nor a line of ours ever shows it. A
notification that cannot be sent is a warning in the flow's log, never a failed run.
"""

from __future__ import annotations

import os
import sys

from pipeline.core.sections.schedule import NotifyConfig

TITLE = "adaptbert"


def promotion_text(model: str, version: str, reason: str, before: str | None = None, forced: bool = False) -> str:
    """What the webhook reads when a version becomes champion (the pipeline's gate, or compare-and-promote)."""
    how = " (forced past the gate)" if forced else ""
    return f"{model} v{version} is the champion (was v{before or '-'}){how}: {reason}"


def webhook_url(nc: NotifyConfig) -> str | None:
    """The webhook's URL from the environment variable ``webhook_env`` names (``None``: unset or empty: off)."""
    return os.environ.get(nc.webhook_env, "").strip() or None


def notify(nc: NotifyConfig, event: str, text: str) -> bool:
    """POST ``text`` to the webhook if ``event`` (``failure`` | ``promotion``) is one ``schedule.notify.events`` lists;
    whether it was sent. A failure to send prints a warning naming the variable, not the URL."""
    url = webhook_url(nc)
    if url is None or event not in nc.events:
        return False
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.types import SecretDict

    block = CustomWebhookNotificationBlock(
        name="adaptbert",
        url="{{webhook_url}}",  # filled from secrets when sent: the URL is in no field a repr or log shows
        secrets=SecretDict({"webhook_url": url}),
        headers=None,
        cookies=None,
        json_data={"title": "{{subject}}", "text": "{{body}}", "event": event},
        allow_private_urls=True,  # the operator's own address (a receiver on the LAN is common): not user input
        timeout=10,
    )
    try:
        block.notify(body=text, subject=f"{TITLE}: {event}")
    except Exception as err:  # the flow's outcome stands whatever the webhook does
        print(
            f"notify: the {event} notification to ${nc.webhook_env} was not delivered ({type(err).__name__})",
            file=sys.stderr,
        )
        return False
    return True
