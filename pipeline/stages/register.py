"""register stage (the last of nine): log the fine-tuned model and its variants as MLflow pyfuncs, register them,
choose what to serve, run the promotion gate.

1. ``models/finetuned/`` and every servable variant under ``models/compressed/`` (compress's
   ``reports/compression.json``) become pyfuncs (``pipeline/serving/pyfunc_model.py``) with a
   signature, an input example (one test row per task) and the ``pipeline`` code, so
   ``mlflow models serve`` needs nothing from this checkout. Before registering, each logged
   model is loaded back and must answer its input example: a model that cannot serve is never
   registered.
2. A new version of ``register.model_name`` per model, tagged with lineage (git, ``dvc.lock``
   hashes, data hash, params hash), its own test metrics and, for a variant, what it is
   (``variant``, size, latency, metric delta) and ``parent_version`` (the full model's version); its model card
   (Hugging Face format, :mod:`pipeline.reporting.model_card`) is a run artifact and its description.
3. The serving rule (:func:`pipeline.tracking.gate.choose_served`, ``register.serve``) picks
   the full model or the fastest variant within it; alias ``challenger`` moves there.
4. The gate (:func:`pipeline.tracking.gate.should_promote`) of the challenger against the current
   ``champion``; on pass ``champion`` moves (:func:`pipeline.tracking.promotion.promote`), on fail it stays.
5. ``reports/promotion.json``: versions, the serving choice, the side-by-side table and the reason (a registry
   event: not versioned); ``reports/summary.json``: the run's headline metrics and decision (the DVC metric).

Any failure before step 2 leaves the registry as it was; the aliases only move in steps 3 and 4.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError, redact_secrets
from pipeline.core.io import read_report, read_report_if_any, require_inputs, sealed, write_json
from pipeline.core.paths import Paths
from pipeline.core.reports.compression import CompressionReport
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.reports.promotion import PromotionReport
from pipeline.reporting.headline import headline
from pipeline.serving.packaging import log_fill_mask, log_pyfunc
from pipeline.tracking.versions import compression_tags, serving_candidates, variant_scores, version_description


def read_metrics(paths: Paths) -> EvaluationReport:
    """``reports/metrics.json`` with the adapted model's test metrics for every task."""
    metrics = read_report(paths.metrics, EvaluationReport)
    for task, t in metrics.tasks.items():
        if t.score("adapted") is None:
            raise DataError(
                paths.metrics, None, "incomplete-metrics", f"task '{task}' has no adapted {t.primary} value"
            )
    if not metrics.tasks:
        raise DataError(paths.metrics, None, "incomplete-metrics", "no tasks were evaluated")
    return metrics


def params_hash(cfg: Config) -> str:
    return hashlib.sha256(json.dumps(cfg.model_dump(mode="json", by_alias=True), sort_keys=True).encode()).hexdigest()[
        :16
    ]


def read_compression(paths: Paths) -> CompressionReport:
    """``reports/compression.json``, or a report with compression off where compress never ran (a project without
    it)."""
    return read_report_if_any(paths.compression_report, CompressionReport) or CompressionReport(
        enabled=False, variants={}
    )


def run(cfg: Config, paths: Paths) -> PromotionReport:
    """Register ``models/finetuned`` and its servable variants, point ``challenger`` at the one the serving rule
    picks, gate ``champion``; write the report."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from requests.exceptions import RequestException

    from pipeline.tracking.gate import Rules, choose_served
    from pipeline.tracking.promotion import CHALLENGER, promote, record_verdict
    from pipeline.tracking.registry_lock import ensure_registered_model, point_alias
    from pipeline.tracking.runs import store_errors

    rc = cfg.registration
    require_inputs(paths.finetuned)
    metrics = read_metrics(paths)
    compression = read_compression(paths)
    full, variants = serving_candidates(metrics, compression)
    # every servable variant's files, before anything is logged (was: MLflow's "No such artifact" for the variant)
    require_inputs(*(paths.compressed / v.name for v in variants))
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("register needs an active MLflow run (use pipeline.tracking.runs.stage_run)")
    start = time.perf_counter()
    choice, serve_reason, serve_rows = choose_served(
        full, variants, rc.serve.rule, rc.serve.max_mean_drop, rc.serve.max_task_drop
    )
    # the uploads: a server whose artifact store refuses them is the store's failure (exit 4, named), not a bug
    with store_errors(paths, (MlflowException, RequestException)):
        logged = {"full": log_pyfunc(cfg, paths, paths.finetuned, f"{rc.model_name}-full")}
        for v in variants:  # every servable variant is registered: the registry can compare and serve any of them
            logged[v.name] = log_pyfunc(cfg, paths, paths.compressed / v.name, f"{rc.model_name}-{v.name}")
        fill_mask = log_fill_mask(paths) if rc.log_fill_mask else None
    client = MlflowClient()
    ensure_registered_model(client, rc.model_name)
    versions = create_versions(client, cfg, paths, run, logged, metrics, compression)
    version = versions[choice]
    point_alias(client, rc.model_name, CHALLENGER, version)
    decision = promote(client, rc.model_name, version, Rules.from_config(rc))
    record_verdict(client, rc.model_name, decision)
    v = decision.verdict
    skipped = compression.not_servable()
    report = PromotionReport.model_validate(
        {
            "model_name": rc.model_name,
            "profile": run.data.tags.get("adaptbert.profile"),  # the stage run's tag (tracking is no input of register)
            "version": version,
            "model_uri": f"models:/{rc.model_name}/{version}",
            "run_id": run.info.run_id,
            "parent_run_id": run.data.tags.get("mlflow.parentRunId"),  # the pipeline execution's run
            "experiment_id": run.info.experiment_id,
            "tracking_uri": redact_secrets(mlflow.get_tracking_uri()),  # a link base: no password in a report
            "fill_mask_model_uri": fill_mask,
            "versions": versions,
            "serving": {
                "choice": choice,
                "reason": serve_reason,
                "rule": rc.serve.model_dump(),
                "candidates": serve_rows,
            },
            "not_registered": skipped,
            "promoted": decision.promoted,
            "reason": v.reason,
            "champion_before": decision.previous_champion,
            "champion_after": decision.champion_after,
            "mean_primary_challenger": v.mean_challenger,
            "mean_primary_champion": v.mean_champion,
            "table": v.rows,
            "rules": rc.model_dump(),
            "seconds": round(time.perf_counter() - start, 1),
        }
    )
    write_json(paths.promotion_report, sealed(report.as_json()))  # read by the report stage, which checks its seal
    write_json(paths.summary, headline(metrics, report))  # dvc metrics show's file: no seal column; no stage reads it
    return report


def create_versions(
    client: Any,
    cfg: Config,
    paths: Paths,
    run: Any,
    logged: dict[str, Any],
    metrics: EvaluationReport,
    compression: CompressionReport,
) -> dict[str, str]:
    """A new version per logged model (the full model first), tagged with lineage, its test metrics and, for a
    variant, what it is; returns model name -> version."""
    import mlflow

    from pipeline.reporting.model_card import CardInputs
    from pipeline.tracking.lineage import lineage_tags
    from pipeline.tracking.promotion import version_tags_from_metrics

    shown = {
        name: metrics.version_scores() if name == "full" else variant_scores(metrics, compression, name)
        for name in logged
    }
    # a version carries the lineage and metrics a person filters on; the full record (every dvc.lock hash, every
    # test metric of each version) is the run's artifact lineage.json, named by the version's ``lineage`` tag
    provenance = {**lineage_tags(paths), "params_hash": params_hash(cfg)}
    mlflow.log_dict({**provenance, "test_metrics": {n: m.metric_values() for n, m in shown.items()}}, "lineage.json")
    lineage = {k: v for k, v in provenance.items() if not k.startswith("dvc.")}
    lineage["lineage"] = f"runs:/{run.info.run_id}/lineage.json"
    if profile := run.data.tags.get("adaptbert.profile"):  # a profile's versions say so (own model name too)
        lineage["profile"] = profile
    pretrain = read_report_if_any(paths.pretrain_report, PretrainReport)
    model_name = cfg.registration.model_name
    versions: dict[str, str] = {}
    for name, info in logged.items():
        entry = compression.model(name)
        tags = {
            **lineage,
            **version_tags_from_metrics(shown[name]),
            **compression_tags(entry, name, versions.get("full")),
        }
        line = version_description(name, shown[name], entry, versions.get("full"))
        mv = client.create_model_version(
            model_name,
            source=info.model_uri,
            run_id=run.info.run_id,
            tags=tags,
            description=line,
            model_id=info.model_id,
        )
        version = str(mv.version)
        card = CardInputs(
            model_name=model_name,
            version=version,
            variant=name,
            parent_version=versions.get("full"),
            summary_line=line,
            shown=shown[name],
            metrics=metrics,
            entry=entry,
            provenance=provenance,
            pretrain=pretrain,
            base_model=cfg.pretrain.base_model,
            profile=profile,
            lineage_uri=lineage["lineage"],
            seed=cfg.seed,
            license=cfg.registration.card.license,
            language=tuple(cfg.registration.card.language),
        )
        log_model_card(client, run, card)
        versions[name] = version
    return versions


def log_model_card(client: Any, run: Any, card: Any) -> None:
    """The version's model card as the run artifact ``model_cards/<variant>.md`` (its ``model_card`` tag names it)
    and, its one-line summary first, as the version's description; written once the version number is known."""
    import mlflow

    from pipeline.reporting.model_card import model_card, registry_description

    mlflow.log_text(model_card(card), f"model_cards/{card.variant}.md")
    uri = f"runs:/{run.info.run_id}/model_cards/{card.variant}.md"
    client.set_model_version_tag(card.model_name, card.version, "model_card", uri)
    client.update_model_version(card.model_name, card.version, description=registry_description(card))


def summary(r: PromotionReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline register`` (what ``run`` returned, read for a person): every version
    registered, once; where ``challenger`` points and why; whether ``champion`` moved and why."""
    champion = (
        f"champion moved {r.champion_before or '(none)'} -> {r.champion_after}"
        if r.promoted
        else f"champion stays {r.champion_after or '(none)'}"
    )
    rule = f"serving rule: {r.serving.reason}\n" if len(r.versions) > 1 else ""
    return (
        f"{r.model_name} {r.registered()} registered; challenger -> v{r.version} ({r.serving.choice}); {champion}\n"
        f"{rule}{r.reason}\nreport: {paths.promotion_report}"
    )
