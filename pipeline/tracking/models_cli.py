"""``adaptbert models list | compare | promote | rollback``: the registry for people (tables on stdout)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.core.config import Config
from pipeline.core.paths import Paths


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


def list_text(rows: list[dict[str, Any]]) -> str:
    """One line per version: what it is (variant of which version), how good (mean primary, its drop against the
    full model it came from, each task's primary metric), what it costs (size, batch-1 latency), when and from what."""
    tasks = sorted({k for r in rows for k in r["primary"]})
    body = [
        [
            r["version"],
            ",".join(r["aliases"]) or "-",
            r["variant"] + (f" of v{r['parent_version']}" if r["parent_version"] else ""),
            fmt(r["mean_primary"]),
            fmt(r["delta_vs_full"], signed=True) if r["parent_version"] else "",
            "-" if r["size_mb"] is None else f"{r['size_mb']:.1f}",
            "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}",
            *(fmt(r["primary"].get(t)) for t in tasks),
            r["created"],
            r["git_commit"],
        ]
        for r in rows
    ]
    header = ["version", "aliases", "variant", "mean_primary", "vs_full", "MB", "p50_ms", *tasks, "created", "commit"]
    return table(header, body)


def compare_text(va: Any, vb: Any, rows: list[dict[str, Any]]) -> str:
    def label(v: Any) -> str:
        return f"v{v.version}" + (f" ({','.join(sorted(v.aliases))})" if v.aliases else "")

    body = [
        [("* " if r["primary"] else "  ") + r["metric"], fmt(r["a"]), fmt(r["b"]), fmt(r["delta"], signed=True)]
        for r in rows
    ]
    return table(["metric (* primary)", label(va), label(vb), "delta"], body)


def version_ref(v: Any) -> dict[str, Any]:
    return {"version": str(v.version), "aliases": sorted(v.aliases)}


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
    from pipeline.tracking.runs import connect

    client, _ = connect(cfg.tracking, paths)
    name = cfg.registration.model_name
    if args.action == "list":
        rows = promotion.list_versions(client, name)
        print(json.dumps(rows, indent=2) if args.json else list_text(rows))
    elif args.action == "compare":
        va, vb, rows = promotion.compare_versions(client, name, args.a, args.b)
        same = va.version == vb.version
        if args.json:
            print(
                json.dumps(
                    {"a": version_ref(va), "b": version_ref(vb), "same_version": same, "metrics": rows}, indent=2
                )
            )
        else:
            print(compare_text(va, vb, rows))
            if same:
                print(f"note: '{args.a}' and '{args.b}' are the same version (v{va.version}): every delta is 0")
    elif args.action == "promote":
        decision = promotion.promote(
            client, name, args.version, promotion.Rules.from_config(cfg.registration), force=args.force
        )
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
    elif args.action == "rollback":
        old, new = promotion.rollback(client, name)
        print(f"champion: v{old} -> v{new} (its previous_champion)")
    return 0
