"""Command line: ``python -m pipeline <stage>`` (also installed as ``adaptbert``).

Exit codes: 0 success, 1 the stage failed on its data (message names file, line and rule),
2 the configuration is invalid (message names the key).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.config import Config, ConfigError, dump_config, load_config
from pipeline.paths import Paths


def _demo(cfg: Config, paths: Paths) -> dict[str, Any]:
    from pipeline import demo

    return demo.run(cfg.demo, paths.demo)


def _ingest(cfg: Config, paths: Paths) -> dict[str, Any]:
    from pipeline import ingest

    report = ingest.run(cfg, paths)
    c = report["corpus"]
    return {"documents_read": c["documents_read"], "train_documents": c["train_documents"],
            "validation_documents": c["validation_documents"], "dropped": c["dropped"],
            "errors_skipped": c["errors_skipped"], "leakage_dropped": report["leakage"]["documents_dropped"],
            "tasks": {k: v["splits"] for k, v in report["tasks"].items()}, "seconds": report["seconds"]}


def _validate(cfg: Config, paths: Paths) -> dict[str, Any]:
    from pipeline import validate

    return validate.run(cfg, paths)


STAGES: dict[str, Callable[[Config, Paths], dict[str, Any]]] = {
    "demo": _demo,
    "ingest": _ingest,
    "validate": _validate,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptbert", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--root", default=".", help="project root that holds data/ and reports/ (default: .)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in STAGES:
        sub.add_parser(name, help=f"run the {name} stage")
    config = sub.add_parser("config", help="inspect the configuration")
    config.add_argument("action", choices=["show"], help="show: print the resolved, validated config")
    return parser


def main(argv: list[str] | None = None) -> int:
    from pipeline.errors import DataError, ValidationFailed

    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.params)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(dump_config(cfg), end="")
        return 0
    try:
        result = STAGES[args.command](cfg, Paths(Path(args.root)))
    except (DataError, ValidationFailed) as err:
        print(f"{args.command} failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps({args.command: result}, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
