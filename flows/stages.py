"""The flow's work without Prefect: run one DVC stage, apply overrides, turn reports into artifacts.

Kept free of Prefect so it can be tested directly; :mod:`flows.pipeline` wraps these functions
in tasks. DVC stays the single owner of caching, outputs and ``dvc.lock``: every stage runs as
``dvc repro --single-item <stage>``, and DVC decides whether it runs or is skipped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.config import ConfigError, load_config, set_dotted, yaml_load
from pipeline.core.errors import EXIT_DATA, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_TERMINATED
from pipeline.tracking.runs import file_lock


class StageFailed(RuntimeError):
    """A stage exited non-zero (or timed out); the message ends with the stage's own error lines."""

    def __init__(self, stage: str, detail: str, exit_code: int | None = None) -> None:
        self.stage, self.detail, self.exit_code = stage, detail, exit_code
        super().__init__(f"stage '{stage}' failed: {detail}")


class TransientStageFailure(StageFailed):
    """Exit code 4 (environment: tracking store down, database locked, disk full): a retry may cure it."""


class ValidationStageFailure(StageFailed):
    """Exit code 3 (bad data): validation rejected it or a reader did. Never retried."""


class InterruptedStageFailure(StageFailed):
    """Exit code 130/143: the stage was interrupted (Ctrl-C, SIGTERM). Never retried."""


_EXIT_CODE = re.compile(r"exited with (-?\d+)")  # DVC's "failed to run: <cmd>, exited with N"
FAILURES_BY_EXIT_CODE: dict[int, type[StageFailed]] = {
    EXIT_DATA: ValidationStageFailure,
    EXIT_ENVIRONMENT: TransientStageFailure,
    EXIT_INTERRUPTED: InterruptedStageFailure,
    EXIT_TERMINATED: InterruptedStageFailure,
}


def dag_stages(root: Path) -> list[str]:
    """The stage names of ``dvc.yaml`` in file order (the DAG is declared in execution order)."""
    return list((yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages", {}))


def stage_exit_code(output: str) -> int | None:
    """The stage command's exit code, as DVC reports it (``None`` when DVC itself failed)."""
    codes = _EXIT_CODE.findall(output)
    return int(codes[-1]) if codes else None


def classify_failure(stage: str, output: str) -> StageFailed:
    """The exception for a failed stage, by the stage's exit code (``pipeline.core.errors``): 3 data, 4 transient, 130/143 interrupted."""
    tail = "\n".join(line for line in output.strip().splitlines()[-15:] if line.strip())
    code = stage_exit_code(output)
    return (
        FAILURES_BY_EXIT_CODE.get(code, StageFailed)(stage, tail, code)
        if code is not None
        else StageFailed(stage, tail)
    )


@contextmanager
def repo_lock(root: Path) -> Iterator[None]:
    """One pipeline run at a time per repository (DVC allows one process per repo)."""
    with file_lock(root / ".adaptbert" / "flow.lock"):
        yield


def run_dvc_stage(
    root: Path, stage: str, force: bool, timeout_s: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``dvc repro -s [-f] <stage>`` in ``root``; whether DVC ran it, how long it took, its output.

    The process group is killed at ``timeout_s``; a non-zero exit raises the matching
    :class:`StageFailed` subclass.
    """
    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.exists() else "dvc", "repro", "--single-item", *(["--force"] if force else []), stage]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise StageFailed(stage, f"timed out after {timeout_s} s (schedule.timeout_s)") from None
    seconds = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        raise classify_failure(stage, output)
    return {"stage": stage, "ran": f"Running stage '{stage}'" in output, "seconds": seconds, "output": output[-4000:]}


# ----------------------------------------------------------------------------- overrides


def profile_overrides(root: Path, profile: str | None) -> dict[str, Any]:
    """The ``{"section.key": value}`` overrides of ``profiles/<profile>.yaml`` (none for ``None``)."""
    if not profile:
        return {}
    path = root / "profiles" / f"{profile}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (root / "profiles").glob("*.yaml"))
        raise ConfigError(f"profile '{profile}': no file {path} (profiles: {known})")
    data = yaml_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of 'section.key: value' overrides")
    return data


def params_backup(root: Path) -> Path:
    return root / ".adaptbert" / "params.yaml.before-run"


def restore_interrupted_run(root: Path) -> bool:
    """Put back the ``params.yaml`` of a run that was killed with its overrides applied; True if there was one."""
    backup = params_backup(root)
    if not backup.exists():
        return False
    (root / "params.yaml").write_bytes(backup.read_bytes())
    backup.unlink()
    return True


@contextmanager
def overridden_params(root: Path, overrides: dict[str, Any]) -> Iterator[None]:
    """``params.yaml`` with ``overrides`` applied for the duration of a run, then restored byte for byte.

    The overrides are validated first (a bad key fails before anything runs) and written the way
    ``dvc exp run -S`` writes them (DVC's round-trip YAML: comments kept). The user's file is kept
    in ``.adaptbert/params.yaml.before-run`` while the run lasts and comes back whatever happens;
    if the process is killed, the next run restores it before doing anything else.
    """
    params = root / "params.yaml"
    restore_interrupted_run(root)
    if not overrides:
        yield
        return
    load_config(params, overrides)  # raises ConfigError naming the key
    from dvc.utils.serialize import modify_yaml

    backup = params_backup(root)
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.write_bytes(params.read_bytes())
    try:
        with modify_yaml(params) as data:
            for dotted, value in overrides.items():
                set_dotted(data, dotted, value)
        yield
    finally:
        restore_interrupted_run(root)


# ----------------------------------------------------------------------------- artifact content


def read_report(path: Path, stage: str) -> dict[str, Any] | None:
    """``stage``'s report with its measurements merged back (``None`` before the stage has run)."""
    from pipeline.core.io import read_report as read_stage_report

    return read_stage_report(path, stage) if path.exists() else None


def validation_markdown(report: dict[str, Any]) -> str:
    """The validation summary: failed expectations first (with offending records), then the passed count."""
    failed = [(s["suite"], e) for s in report["suites"] for e in s["expectations"] if not e["success"]]
    head = (
        f"# Validation: {'passed' if report['success'] else 'FAILED'}\n\n{report['expectations'] - report['failed_expectations']} "
        f"of {report['expectations']} expectations passed in {len(report['suites'])} suites.\n"
    )
    if not failed:
        return head
    lines = [
        head,
        "## Failed expectations\n",
        "| suite | rule | expectation | observed | offending records |",
        "|---|---|---|---|---|",
    ]
    for suite, e in failed:
        offending = "<br>".join(
            f"`{o['file']}{'' if o['line'] is None else ':' + str(o['line'])}` "
            f"{json.dumps(o['values'], ensure_ascii=False)[:120]}"
            for o in e.get("offending", [])[:5]
        )
        observed = json.dumps(e.get("observed", {}), ensure_ascii=False)[:200]
        lines.append(f"| {suite} | {e['rule']} | `{e['expectation']}` | {observed} | {offending} |")
    return "\n".join(lines) + "\n"


def ingest_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    c = report["corpus"]
    rows = [
        {
            "dataset": "corpus",
            "read": c["documents_read"],
            "kept": c["documents_kept"],
            "train": c["train_documents"],
            "validation": c["validation_documents"],
            "test": "",
            "dropped": json.dumps(c["dropped"]),
        }
    ]
    for name, t in report["tasks"].items():
        sp = t["splits"]
        rows.append(
            {
                "dataset": f"task {name} ({t['type']})",
                "read": sum(s["examples"] + s["skipped"] for s in sp.values()),
                "kept": sum(s["examples"] for s in sp.values()),
                "train": sp["train"]["examples"],
                "validation": sp["validation"]["examples"],
                "test": sp["test"]["examples"],
                "dropped": json.dumps({k: s["skipped"] for k, s in sp.items() if s["skipped"]}),
            }
        )
    return rows


def tokenize_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    f = report["fragmentation"]
    return [
        {
            "mode": report["mode"],
            "vocab": report["vocab_size"],
            "new_tokens": report["new_tokens"],
            "tokens": report["tokens"],
            "blocks": report["blocks"],
            "unk_share": report["unk_share"],
            "pieces_per_word": f"{f['pieces_per_word_base']} -> {f['pieces_per_word_final']}",
            "tokens_per_s": report["pack_tokens_per_s"],
        }
    ]


def compression_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model on the accuracy/latency front (reports/compression.json), the full model first."""
    full = report["full"]
    rows = [
        {
            "model": f"full ({p})",
            "size_mb": full["size_mb"],
            "p50_ms": full["speed"][p]["p50_ms"],
            "p95_ms": full["speed"][p]["p95_ms"],
            "rows_per_s": full["speed"][p]["throughput_rows_per_s"],
            "mean_primary": full["mean_primary"],
            "delta": 0.0,
            "servable": True,
        }
        for p in ("fp32", "bf16")
        if p in full["speed"]
    ]
    for name, v in report["variants"].items():
        speed = v["speed"][v["served_in"]]
        rows.append(
            {
                "model": f"{name} ({v['served_in']})",
                "size_mb": v["size_mb"],
                "p50_ms": speed["p50_ms"],
                "p95_ms": speed["p95_ms"],
                "rows_per_s": speed["throughput_rows_per_s"],
                "mean_primary": v["mean_primary"],
                "delta": v["mean_primary_delta"],
                "servable": v["servable"],
            }
        )
    return rows


def metrics_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Every scalar test metric of the adapted model (and the baseline), a row per task and metric."""
    rows = []
    for task, t in metrics["tasks"].items():
        for name, value in t["adapted"].items():
            if isinstance(value, int | float):
                rows.append(
                    {
                        "task": task,
                        "metric": name,
                        "primary": name == t["primary"],
                        "adapted": value,
                        "baseline": t.get("baseline", {}).get(name),
                        "trivial": t["trivial"].get(name),
                    }
                )
    return rows


def dapt_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The DAPT-vs-baseline table: primary metric, delta and its bootstrap CI per task."""
    return [
        {
            "task": task,
            "primary": t["primary"],
            "trivial": t["trivial"][t["primary"]],
            "baseline": t.get("baseline", {}).get(t["primary"]),
            "adapted": t["adapted"][t["primary"]],
            "delta": t.get("delta"),
            "ci_low": t.get("ci_low"),
            "ci_high": t.get("ci_high"),
        }
        for task, t in metrics["tasks"].items()
    ]


def mlflow_links(tracking_uri: str, run_id: str, model: str, version: str) -> tuple[str, str]:
    """UI addresses of a run and a model version (a local sqlite store: as shown by ``mlflow server`` on :5000)."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith("http") else "http://127.0.0.1:5000"
    return f"{base}/#/runs/{run_id}", f"{base}/#/models/{model}/versions/{version}"


def promotion_markdown(report: dict[str, Any]) -> str:
    run_url, version_url = mlflow_links(
        report["tracking_uri"], report["run_id"], report["model_name"], report["version"]
    )
    verdict = "**promoted**" if report["promoted"] else "**not promoted**"
    lines = [
        f"# {report['model_name']} v{report['version']}: {verdict}\n",
        report["reason"] + "\n",
        f"champion: v{report['champion_before'] or '-'} -> v{report['champion_after'] or '-'}\n",
        *(
            [f"serving rule: challenger is {report['serving']['choice']} ({report['serving']['reason']})\n"]
            if "serving" in report
            else []
        ),
        f"- MLflow run: [{report['run_id']}]({run_url})",
        f"- model version: [{report['model_name']} v{report['version']}]({version_url})",
        "",
        "| metric | challenger | champion | delta | rule | ok |",
        "|---|---:|---:|---:|---|---|",
    ]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.4f}"

    for r in report["table"]:
        lines.append(
            f"| {r['metric']} | {fmt(r['challenger'])} | {fmt(r['champion'])} | {fmt(r['delta'])} | {r['check']} | "
            f"{'yes' if r['ok'] else 'NO'} |"
        )
    if not report["tracking_uri"].startswith("http"):
        lines.append(
            f"\nThe store is `{report['tracking_uri']}`: the links work with `mlflow server --backend-store-uri "
            f"{report['tracking_uri']} --port 5000`."
        )
    return "\n".join(lines) + "\n"
