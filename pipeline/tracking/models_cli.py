"""``adaptbert models list | compare | promote | card | rollback``: the registry for people (tables on stdout)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.core.config import Config
from pipeline.core.paths import Paths
from pipeline.reporting.numbers import points


def fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def variant_text(r: dict[str, Any]) -> str:
    return r["variant"] + (f" of v{r['parent_version']}" if r["parent_version"] else "")


def number(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def list_text(rows: list[dict[str, Any]]) -> str:
    """One line per version: what it is (variant of which version), how good (mean primary, its drop against the
    full model it came from, each task's primary metric), what it costs (size, batch-1 latency), when and from what."""
    tasks = sorted({k for r in rows for k in r["primary"]})
    body = [
        [
            r["version"],
            ",".join(r["aliases"]) or "-",
            variant_text(r),
            points(r["mean_primary"]),
            points(r["delta_vs_full"], signed=True) if r["parent_version"] else "",
            number(r["size_mb"]),
            number(r["p50_ms"]),
            *(points(r["primary"].get(t)) for t in tasks),
            r["created"],
            r["git_commit"],
        ]
        for r in rows
    ]
    header = ["version", "aliases", "variant", "mean_primary", "vs_full", "MB", "p50_ms", *tasks, "created", "commit"]
    return table(header, body)


def compare_text(ra: dict[str, Any], rb: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What each version is and costs (variant, mean primary, MB, batch-1 p50 ms), then every test metric (``*``: a
    primary one) side by side with the delta ``a - b``."""

    def label(r: dict[str, Any]) -> str:
        return f"v{r['version']}" + (f" ({','.join(r['aliases'])})" if r["aliases"] else "")

    about = [
        ["  variant", variant_text(ra), variant_text(rb), ""],
        [
            "  mean_primary",
            fmt(ra["mean_primary"]),
            fmt(rb["mean_primary"]),
            change(ra["mean_primary"], rb["mean_primary"], 4),
        ],
        ["  MB", number(ra["size_mb"]), number(rb["size_mb"]), change(ra["size_mb"], rb["size_mb"], 1)],
        ["  p50_ms", number(ra["p50_ms"]), number(rb["p50_ms"]), change(ra["p50_ms"], rb["p50_ms"], 1)],
    ]
    body = [
        [("* " if r["primary"] else "  ") + r["metric"], fmt(r["a"]), fmt(r["b"]), fmt(r["delta"], signed=True)]
        for r in rows
    ]
    return table(["metric (* primary)", label(ra), label(rb), "delta"], about + body)


def change(a: float | None, b: float | None, digits: int) -> str:
    """``a - b`` with a sign, or nothing when either is unknown."""
    return "" if a is None or b is None else f"{a - b:+.{digits}f}"


def verdict_text(decision: Any) -> str:
    rows = [
        [
            r["metric"],
            fmt(r["challenger"]),
            fmt(r["champion"]),
            fmt(r["delta"], signed=True),
            r["check"],
            "ok" if r["ok"] else "FAIL",
        ]
        for r in decision.verdict.rows
    ]
    head = table(["metric", f"v{decision.version}", "champion", "delta", "rule", ""], rows) if rows else ""
    return f"{head}\n{decision.verdict.reason}".strip()


def run_models_command(cfg: Config, paths: Paths, args: argparse.Namespace) -> int:
    """Dispatch one ``models`` action; exit code 1 when a promotion is refused."""
    from pipeline.tracking import promotion
    from pipeline.tracking.gate import Rules
    from pipeline.tracking.runs import connect

    client, _ = connect(cfg.tracking, paths)
    name = cfg.registration.model_name
    if args.action == "list":
        rows = promotion.list_versions(client, name)
        print(json.dumps(rows, indent=2) if args.json else list_text(rows))
    elif args.action == "compare":
        ra, rb, rows = promotion.compare_versions(client, name, args.a, args.b)
        same = ra["version"] == rb["version"]
        if args.json:
            print(json.dumps({"a": ra, "b": rb, "same_version": same, "metrics": rows}, indent=2))
        else:
            print(compare_text(ra, rb, rows))
            if same:
                print(f"note: '{args.a}' and '{args.b}' are the same version (v{ra['version']}): every delta is 0")
    elif args.action == "promote":
        decision = promotion.promote(client, name, args.version, Rules.from_config(cfg.registration), force=args.force)
        promotion.record_verdict(client, name, decision)
        print(verdict_text(decision))
        if decision.promoted:
            forced = " (forced past a failed gate)" if decision.forced else ""
            print(f"champion: v{decision.previous_champion or '-'} -> v{decision.champion_after}{forced}")
        else:
            print(
                f"champion stays v{decision.champion_after or '-'}"
                + ("" if decision.verdict.promote else "; use --force to override")
            )
            return 0 if decision.champion_after == str(args.version) else 1
    elif args.action == "card":
        print(promotion.read_model_card(client, name, args.version), end="")
    elif args.action == "rollback":
        old, new = promotion.rollback(client, name)
        print(f"champion: v{old} -> v{new} (its previous_champion)")
    return 0
