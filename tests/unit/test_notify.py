"""Notifications to a webhook (schedule.notify): sent for the events asked for, the URL never shown."""

from __future__ import annotations

import pytest

from flows.notify import notify
from pipeline.core.sections.schedule import NotifyConfig
from tests.conftest import free_port, webhook_receiver

NC = NotifyConfig(webhook_env="ADAPTBERT_TEST_WEBHOOK", events=["failure", "promotion"])


def test_a_notification_reaches_the_webhook_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    with webhook_receiver() as (url, received):
        monkeypatch.setenv(NC.webhook_env, url)
        assert notify(NC, "promotion", "adaptbert v3 is the champion")
    assert received == [{"title": "adaptbert: promotion", "text": "adaptbert v3 is the champion", "event": "promotion"}]


def test_nothing_is_sent_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    with webhook_receiver() as (url, received):
        monkeypatch.delenv(NC.webhook_env, raising=False)
        assert not notify(NC, "failure", "x")  # no URL: off
        monkeypatch.setenv(NC.webhook_env, url)
        assert not notify(NotifyConfig(webhook_env=NC.webhook_env, events=["failure"]), "promotion", "x")
    assert received == []


def test_an_undeliverable_notification_warns_without_the_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/hooks/secret-token-abc123"  # nothing listens there
    monkeypatch.setenv(NC.webhook_env, url)
    assert not notify(NC, "failure", "the run failed")
    said = capsys.readouterr()
    assert "was not delivered" in said.err and "$ADAPTBERT_TEST_WEBHOOK" in said.err
    assert "secret-token" not in said.err + said.out
