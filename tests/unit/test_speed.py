"""The serving-speed worker forks a child per model: each child's result and peak memory are its own."""

from __future__ import annotations

import os

import pytest

from pipeline.serving.speed import in_child, peak_rss_mb

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this OS")


def allocate_and_report(megabytes: int) -> dict[str, float]:
    block = bytearray(megabytes * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved
    return {"pid": os.getpid(), "peak_rss_mb": peak_rss_mb()}


def test_a_childs_peak_starts_afresh_not_at_the_parents() -> None:
    allocate_and_report(300)  # this process's peak is now >= 300 MB above what it holds
    assert in_child(lambda: allocate_and_report(10))["peak_rss_mb"] < peak_rss_mb() - 250


def test_each_child_reports_its_own_peak_not_a_siblings() -> None:
    big = in_child(lambda: allocate_and_report(300))
    small = in_child(lambda: allocate_and_report(10))
    assert big["pid"] != small["pid"] != os.getpid()
    assert big["peak_rss_mb"] - small["peak_rss_mb"] > 250  # the 300 MB child's peak did not carry over


def test_an_error_in_the_child_is_raised_in_the_parent_naming_it() -> None:
    def fail() -> dict:
        raise ValueError("no model.safetensors in models/compressed/int8")

    with pytest.raises(RuntimeError, match=r"ValueError: no model.safetensors in models/compressed/int8"):
        in_child(fail)
    assert in_child(lambda: {"ok": 1}) == {"ok": 1}  # the parent carries on
