"""Command line: ``python -m pipeline <stage>`` (also installed as ``adaptbert``).

Exit codes: 0 success, 1 the stage failed (NaN loss, refused registry request, a bug),
2 the configuration is invalid (message names the key), 3 bad or missing input data (names
file, line and rule), 4 environment (disk full, permission, read-only, tracking store down),
130/143 interrupted; see ``pipeline.errors``. Never a traceback: an unexpected error is one
line, with the traceback saved under ``.adaptbert/logs/``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline.config import Config, ConfigError, dump_config, load_config
from pipeline.paths import Paths


def _demo(cfg: Config, paths: Paths) -> str:
    from pipeline import demo

    n = demo.run(cfg.demo, paths.demo)
    tasks = sorted({k.rsplit("_", 1)[0] for k in n if k != "corpus_docs"})
    return f"wrote {n['corpus_docs']} synthetic trial reports and tasks {tasks} to {paths.demo}/"


def _ingest(cfg: Config, paths: Paths) -> str:
    from pipeline import ingest

    r = ingest.run(cfg, paths)
    c = r["corpus"]
    dropped = ", ".join(f"{k} {v}" for k, v in c["dropped"].items()) or "none"
    skipped = ", ".join(f"{k} {v}" for k, v in c["errors_skipped"].items())
    tasks = "; ".join(f"{name} {'/'.join(str(s['examples']) for s in t['splits'].values())}" for name, t in r["tasks"].items())
    task_skips = ", ".join(f"{k} {v}" for k, v in r["task_errors_skipped"].items())
    empty = c["empty_sources"]
    warning = f"\nwarning: {len(empty)} source(s) contributed no document: {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}" if empty else ""
    return (f"{c['documents_read']} documents read from {len(c['sources'])} source(s) -> {c['train_documents']} train + "
            f"{c['validation_documents']} validation (dropped: {dropped}{'; bad records skipped: ' + skipped if skipped else ''})\n"
            f"tasks (train/validation/test): {tasks or 'none'}{'; bad task records skipped: ' + task_skips if task_skips else ''}"
            f"{warning}\n{r['seconds']} s; report: {paths.ingest_report}")


def _validate(cfg: Config, paths: Paths) -> str:
    from pipeline import validate

    r = validate.run(cfg, paths)
    return (f"all {r['expectations']} expectations in {r['suites']} suites passed; "
            f"report: {paths.validation_report}; Data Docs: {paths.data_docs / 'index.html'}")


def _tokenize(cfg: Config, paths: Paths) -> str:
    from pipeline import tokenize

    r = tokenize.run(cfg, paths)
    f = r["fragmentation"]
    return (f"{r['mode']} vocab of {r['vocab_size']} ({r['new_tokens']} new tokens){', word ids' if r['whole_word'] else ''}; "
            f"{r['tokens']} tokens -> {r['blocks']} blocks of <= {cfg.tokenize.max_seq_length}; [UNK] share {r['unk_share']:.4%}\n"
            f"pieces per word {f['pieces_per_word_base']} -> {f['pieces_per_word_final']}, "
            f"per domain-term word {f['pieces_per_domain_word_base']} -> {f['pieces_per_domain_word_final']}\n"
            f"{r['pack_tokens_per_s']} tokens/s; report: {paths.tokenize_report}")


def _pretrain(cfg: Config, paths: Paths) -> str:
    from pipeline import pretrain

    r = pretrain.run(cfg, paths)
    resumed = f"resumed from {r['resumed_from']}; " if r["resumed_from"] else ""
    warm = f", {r['warm_tokens_per_s']} after {r['warmup_seconds']} s of warm-up" if r.get("warm_tokens_per_s") else ""
    return (f"{resumed}{r['global_step']} steps, {r['tokens_seen']} tokens in {r['train_seconds']} s ({r['tokens_per_s']} tokens/s{warm}; "
            f"{r['device']} x{r['world_size']}, {r['mlm_head']} MLM head)\n{r['precision_reason']}\n"
            f"held-out perplexity {r['base_perplexity']} (base) -> {r['adapted_perplexity']} (adapted); "
            f"model: {paths.dapt}; report: {paths.pretrain_report}")


def _finetune(cfg: Config, paths: Paths) -> str:
    from pipeline import finetune

    r = finetune.run(cfg, paths)
    lines = []
    for name in ("adapted", "baseline"):
        if name in r:
            m = r[name]
            stop = "stopped early" if m["stopped_early"] else "ran to max_steps"
            speed = f"{m['train_examples_per_s']} examples/s" if m["train_examples_per_s"] else f"resumed finished run {m['resumed_from']}"
            lines.append(f"{name}: {m['steps']} steps ({stop}), best dev mean primary {m['best_dev_mean_primary']} at step {m['best_step']}, "
                         f"{speed}")
    return "\n".join(lines) + f"\n{r['precision_reason']}\nmodels: {paths.finetuned}, {paths.baseline}; report: {paths.finetune_report}"


def _evaluate(cfg: Config, paths: Paths) -> str:
    from pipeline import evaluate

    m = evaluate.run(cfg, paths)
    rows = []
    for name, t in m["tasks"].items():
        p = t["primary"]
        base = f"baseline {t['baseline'][p]:.3f} -> " if "baseline" in t else ""
        ci = f" (delta {t['delta']:+.3f}, {m['bootstrap']['confidence']:.0%} CI [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}])" if "delta" in t else ""
        rows.append(f"  {name} {p}: trivial {t['trivial'][p]:.3f}, {base}adapted {t['adapted'][p]:.3f}{ci}")
    s = m["summary"]
    mean = f"mean primary: baseline {s['mean_primary_baseline']:.3f} -> adapted {s['mean_primary_adapted']:.3f}" if "mean_primary_baseline" in s \
        else f"mean primary: adapted {s['mean_primary_adapted']:.3f}"
    return "test metrics\n" + "\n".join(rows) + f"\n{mean}; report: {paths.evaluation}, metrics: {paths.metrics}"


def _register(cfg: Config, paths: Paths) -> str:
    from pipeline import register

    r = register.run(cfg, paths)
    champion = (f"champion moved {r['champion_before'] or '(none)'} -> {r['champion_after']}" if r["promoted"]
                else f"champion stays {r['champion_after'] or '(none)'}")
    return (f"{r['model_name']} version {r['version']} registered (alias challenger); {champion}\n{r['reason']}\n"
            f"report: {paths.promotion_report}")


STAGES: dict[str, Callable[[Config, Paths], str]] = {
    "demo": _demo,
    "ingest": _ingest,
    "validate": _validate,
    "tokenize": _tokenize,
    "pretrain": _pretrain,
    "finetune": _finetune,
    "evaluate": _evaluate,
    "register": _register,
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
    models = sub.add_parser("models", help="the MLflow registry: list, compare, promote, rollback")
    msub = models.add_subparsers(dest="action", required=True)
    msub.add_parser("list", help="versions with their aliases and primary metrics")
    compare = msub.add_parser("compare", help="per-task metrics of A and B side by side (default: challenger vs champion)")
    compare.add_argument("a", nargs="?", default="challenger", help="version number or alias (default: challenger)")
    compare.add_argument("b", nargs="?", default="champion", help="version number or alias (default: champion)")
    promote = msub.add_parser("promote", help="make version N the champion if the gate passes (--force: even if not)")
    promote.add_argument("version", help="version number")
    promote.add_argument("--force", action="store_true", help="promote even when the gate fails (the verdict is still recorded)")
    msub.add_parser("rollback", help="point champion back at the current champion's previous_champion")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; every failure becomes one line on stderr and an exit code (``pipeline.errors``)."""
    from pipeline import errors

    args = build_parser().parse_args(argv)
    errors.raise_on_sigterm()
    try:
        return run_command(args)
    except BaseException as err:  # the one error boundary of every stage
        if isinstance(err, SystemExit):
            raise
        code, message = errors.classify(err, {ConfigError: errors.EXIT_CONFIG, errors.SourceUnavailable: errors.EXIT_ENVIRONMENT,
                                               errors.DataError: errors.EXIT_DATA,
                                               errors.ValidationFailed: errors.EXIT_DATA, errors.NonFiniteLoss: errors.EXIT_FAILED,
                                               errors.RegistryError: errors.EXIT_FAILED, errors.TrackingUnavailable: errors.EXIT_ENVIRONMENT})
        if not message:
            if errors.show_tracebacks():
                raise
            saved = errors.save_traceback(err, Path(args.root), args.command)
            message = f"internal error {type(err).__name__}: {str(err)[:300]} (a bug in adaptbert; traceback saved to {saved})"
        elif isinstance(err, ConfigError):
            message = f"error: {message}"
        print(f"{args.command} failed: {message}", file=sys.stderr)
        return code


def run_command(args: argparse.Namespace) -> int:
    """Load the config, finish any commit a killed run left half done, run the command."""
    cfg = load_config(args.params)
    if args.command == "config":
        print(dump_config(cfg), end="")
        return 0
    paths = Paths(Path(args.root))
    if args.command == "models":
        from pipeline.models_cli import run_models_command

        return run_models_command(cfg, paths, args)
    from pipeline.io import recover
    from pipeline.tracking import stage_run

    for stage in recover(paths.root):
        print(f"{args.command}: finished the commit of '{stage}' outputs that a killed run had started", file=sys.stderr)
    with stage_run(cfg, paths, args.command, required=args.command == "register"):
        result = STAGES[args.command](cfg, paths)
    print(f"{args.command}: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
