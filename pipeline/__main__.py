"""Command line: ``python -m pipeline <stage>`` (also installed as ``adaptbert``).

Exit codes: 0 success, 1 the stage failed (NaN loss, refused registry request, a bug),
2 the configuration is invalid (message names the key), 3 bad or missing input data (names
file, line and rule), 4 environment (disk full, permission, read-only, tracking store down),
130/143 interrupted; see ``pipeline.core.errors``. Never a traceback: an unexpected error is one
line, with the traceback saved under ``.adaptbert/logs/``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from pipeline.core.config import Config, dump_config, load_config
from pipeline.core.console import plain
from pipeline.core.paths import Paths
from pipeline.core.stages import NAMES, stage_record


def run_stage(name: str, cfg: Config, paths: Paths) -> str:
    """Check the seals of the inputs of ``pipeline.stages.<name>``, run it and return its console summary."""
    from pipeline.core.seals import check_inputs

    check_inputs(stage_record(name), paths)  # before the stage reads anything or touches its outputs
    stage = importlib.import_module(
        f"pipeline.stages.{name}"
    )  # lazily: a stage's imports are heavy (torch, GX, MLflow)
    return stage.summary(stage.run(cfg, paths), cfg, paths)


def stage_help(name: str) -> str:
    """A stage's ``--help``: its module's docstring (read, not imported: help stays instant) and the files it reads
    and writes (the stage table)."""
    import ast

    source = Path(__file__).parent / "stages" / f"{name}.py"
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or f"The {name} stage."
    record, paths = stage_record(name), Paths(Path("."))
    reads = ", ".join(str(getattr(paths, a)) for a in record.inputs) or "params.yaml only"
    writes = ", ".join(str(getattr(paths, a)) for a in record.outputs)
    sections = {field.alias or key for key, field in Config.model_fields.items()}
    settings = f"settings: adaptbert config show {name}\n" if name in sections else ""
    return f"{plain(doc)}\n\nreads:  {reads}\nwrites: {writes}\n{settings}dvc repro {name} runs it after what it needs"


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("adaptbert")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


ALIASES = ("champion", "challenger")  # the registry aliases adaptbert moves


def version_or_alias(text: str) -> str:
    """A model version for ``models promote|compare``: a number (``3``, ``v3``) or an alias adaptbert sets; anything
    else is a usage error (exit 2) before the registry is opened."""
    number = text.removeprefix("v")
    if number.isdecimal() and int(number) > 0:
        return str(int(number))
    if text in ALIASES:
        return text
    raise argparse.ArgumentTypeError(f"'{text}' is neither a version number (e.g. 3) nor one of {', '.join(ALIASES)}")


class Parser(argparse.ArgumentParser):
    """argparse with a suggestion for a mistyped command or action (``modles``: did you mean 'models'?)."""

    def error(self, message: str) -> NoReturn:
        if wrong := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
            from pipeline.core.errors import closest

            if close := closest(wrong.group(1), re.findall(r"'([^']*)'", wrong.group(2))):
                message = f"invalid choice: '{wrong.group(1)}'; did you mean '{close}'? ({wrong.group(2)})"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="adaptbert",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"adaptbert {installed_version()}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--root", default=".", help="project root that holds data/ and reports/ (default: .)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in NAMES:
        sub.add_parser(
            name,
            help=f"run the {name} stage",
            description=stage_help(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    config = sub.add_parser("config", help="inspect the configuration", description="Inspect the configuration.")
    csub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = csub.add_parser(
        "show", help="print the resolved, validated config", description="Print the resolved, validated config as YAML."
    )
    show.add_argument("section", nargs="?", help="only this section (e.g. pretrain); default: every section")
    models = sub.add_parser(
        "models",
        help="the MLflow registry: list, compare, promote, card, rollback",
        description="The MLflow model registry.",
    )
    msub = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    scope = argparse.ArgumentParser(add_help=False)  # every action: which registered model
    scope.add_argument(
        "--profile",
        metavar="NAME",
        help="the registered model of profile NAME's runs (<model_name>-NAME, profiles/NAME.yaml), e.g. smoke",
    )
    listing = msub.add_parser("list", parents=[scope], help="versions with their aliases and primary metrics")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    compare = msub.add_parser(
        "compare", parents=[scope], help="per-task metrics of A and B side by side (default: challenger vs champion)"
    )
    compare.add_argument(
        "a",
        nargs="?",
        default="challenger",
        type=version_or_alias,
        help="version number or alias (default: challenger)",
    )
    compare.add_argument(
        "b", nargs="?", default="champion", type=version_or_alias, help="version number or alias (default: champion)"
    )
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    promote = msub.add_parser(
        "promote", parents=[scope], help="make version N the champion if the gate passes (--force: even if not)"
    )
    promote.add_argument("version", type=version_or_alias, help="version number (or challenger)")
    promote.add_argument(
        "--force", action="store_true", help="promote even when the gate fails (the verdict is still recorded)"
    )
    card = msub.add_parser("card", parents=[scope], help="print version N's model card (Hugging Face format)")
    card.add_argument("version", type=version_or_alias, help="version number or alias (champion, challenger)")
    sub.add_parser(
        "history",
        parents=[scope],
        help="every pipeline run side by side (headline, CIs, params that differ, champion timeline)",
        description="Every pipeline run of the experiment from MLflow: a table here and reports/history.html.",
    )
    msub.add_parser("rollback", parents=[scope], help="point champion back at the current champion's previous_champion")
    serve = sub.add_parser(
        "serve",
        parents=[scope],
        help="serve a registered version over HTTP (MLflow's scoring app behind register.serve's request limits)",
        description="Serve a registered version over HTTP: MLflow's scoring app (/invocations, /ping), with request "
        "bodies and JSON depth bounded by register.serve. Stop it with Ctrl-C.",
    )
    serve.add_argument(
        "model", nargs="?", default="champion", type=version_or_alias, help="version number or alias (champion)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=5001, help="port to listen on (default: 5001)")
    predict = sub.add_parser(
        "predict",
        parents=[scope],
        help="one answer of a registered version, in this process (JSON on stdout)",
        description="Ask a registered version (default: champion) one request row, in this process: the answer as "
        "JSON, with the model, version and variant that gave it. The fields are those of the task's type "
        "(docs/serving.md).",
    )
    predict.add_argument("task", help="the task's name, e.g. ner")
    predict.add_argument("--model", default="champion", type=version_or_alias, help="version or alias (champion)")
    for field in ("text", "text-pair", "question", "context"):
        predict.add_argument(f"--{field}", help=f"the row's {field.replace('-', '_')} field")
    plots = sub.add_parser(
        "plots",
        help="dvc plots show, as a page that opens offline (Vega inline instead of from a CDN)",
        description="The page of `dvc plots show` with Vega, Vega-Lite and vega-embed inline: it opens offline.",
    )
    plots.add_argument("-o", "--out", type=Path, default=Path("dvc_plots"), help="folder of the page (dvc_plots)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; every failure becomes one line on stderr and an exit code (``pipeline.core.errors``)."""
    from pipeline.core import errors

    args = build_parser().parse_args(argv)
    errors.raise_on_sigterm()
    try:
        return run_command(args)
    except BaseException as err:  # the one error boundary of every stage
        if isinstance(err, SystemExit):
            raise
        if isinstance(err, BrokenPipeError) and args.command in ("config", "models", "history"):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # `... | head` closed it: nothing to say
            return 0
        code, message = errors.classify(err)
        if not message:
            if errors.show_tracebacks():
                raise
            saved = errors.save_traceback(err, Path(args.root), args.command)
            message = f"internal error {type(err).__name__}: {str(err)[:300]} (a bug in adaptbert; traceback saved to {saved})"
        if isinstance(err, KeyboardInterrupt):
            errors.exit_at_next_stop(code)
        print(f"{args.command} failed: {errors.redact_secrets(message)}", file=sys.stderr)
        return code


def run_command(args: argparse.Namespace) -> int:
    """Load the config, finish any commit a killed run left half done, run the command."""
    overrides = {}
    if getattr(args, "profile", None):  # models --profile NAME: that profile's registered model (never a stage's)
        from pipeline.core.profiles import profile_overrides

        overrides = profile_overrides(Path(args.root), args.profile, Path(args.params))
    cfg = load_config(args.params, overrides)
    if args.command == "config":
        print(dump_config(cfg, args.section), end="")
        return 0
    paths = Paths(Path(args.root))
    if args.command == "models":
        from pipeline.tracking.models_cli import run_models_command

        return run_models_command(cfg, paths, args)
    if args.command == "predict":
        from pipeline.serving.server import predict

        fields = {k: getattr(args, k) for k in ("text", "text_pair", "question", "context") if getattr(args, k)}
        print(json.dumps(predict(cfg, paths, str(args.model), {"task": args.task, **fields}), ensure_ascii=False))
        return 0
    if args.command == "serve":
        from pipeline.serving.server import serve

        return serve(cfg, paths, str(args.model), args.host, args.port)
    if args.command == "history":
        from pipeline.tracking.history import write_history

        return write_history(cfg, paths)
    if args.command == "plots":
        from pipeline.reporting.offline_plots import write_offline_plots

        page, missing = write_offline_plots(paths, paths.root / args.out)
        lacking = f"; without {', '.join(missing)} (not written yet)" if missing else ""
        print(f"plots: {page} (opens offline: Vega inline){lacking}")
        return 0
    from pipeline.core.base_model import check_against_base_model
    from pipeline.core.console import quiet_libraries
    from pipeline.core.io import recover
    from pipeline.tracking.runs import stage_run

    check_against_base_model(cfg)  # before any stage works: a bad value fails the first stage, not compress
    quiet_libraries()

    for stage in recover(paths.root):
        print(
            f"{args.command}: finished the commit of '{stage}' outputs that a killed run had started", file=sys.stderr
        )
    with stage_run(cfg, paths, args.command, required=stage_record(args.command).always_tracked):
        result = run_stage(args.command, cfg, paths)
    print(f"{args.command}: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
