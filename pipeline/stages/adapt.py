"""adapt stage: the adaptation chosen on the dev splits (``adapt``) -> ``data/adapt/chosen.json``, ``reports/adapt.json``.

Under ``adapt.strategy: fixed`` (the default) the stage records that pretrain trains as its section says. Under
``auto`` it runs the tournament of :mod:`pipeline.training.tournament`: ``none``, ``dapt``, ``tapt``,
``dapt+tapt`` and ``contrastive`` each given the same minutes, successive halving over ``adapt.rungs``, dev splits
only; the chosen
arm is what pretrain then trains in full, and the un-adapted baseline is fine-tuned beside it as always, so the
verdict on test is read once, by evaluate.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.core.config import Config
from pipeline.core.io import require_inputs, transaction, write_json
from pipeline.core.paths import Paths
from pipeline.core.reports.adapt import AdaptReport
from pipeline.core.sections.adapt import ARM_NAMES
from pipeline.modelling.shards import MANIFEST
from pipeline.reporting.numbers import points
from pipeline.training.adaptation import ARM_PRETRAIN, CHOSEN_FILE, choice_digest
from pipeline.training.tournament import run_tournament


def run(cfg: Config, paths: Paths) -> AdaptReport:
    """Choose the adaptation (or record the fixed one); write ``data/adapt/`` and ``reports/adapt.json``."""
    start = time.perf_counter()
    report = AdaptReport(strategy=cfg.adapt.strategy)
    chosen: dict[str, Any] = {"strategy": cfg.adapt.strategy}
    if cfg.adapt.strategy == "auto":
        from pipeline.modelling.precision import resolve_precision

        precision = resolve_precision(cfg.precision)
        require_inputs(paths.pretrain_blocks / MANIFEST, paths.tokenizer, paths.task_features)
        played = run_tournament(cfg, paths, precision) | {"seconds": round(time.perf_counter() - start, 1)}
        report = AdaptReport.model_validate(played)
        arm = played["chosen"]
        chosen |= {
            "arm": arm,
            "settings": ARM_PRETRAIN.get(arm, {}),  # pretrain.<key>: value
            "reason": played["reason"],
            "digest": choice_digest(cfg, paths),
        }
    paths.adapt_checkpoints.mkdir(parents=True, exist_ok=True)  # a declared output (DVC checks it), empty when fixed
    with transaction(paths.root, "adapt") as txn:
        write_json(txn.dir(paths.adapt) / CHOSEN_FILE, chosen)
        txn.write_report(paths.adapt_report, report)
    return report


def summary(r: AdaptReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline adapt`` (what ``run`` returned, read for a person)."""
    if not r.played or r.rungs is None or r.chosen is None:
        return "adapt.strategy is fixed: pretrain trains as the pretrain section says"
    lines = []
    for rung in r.rungs:
        scores = ", ".join(
            f"{ARM_NAMES[a]} {points(e.dev_mean)} ({e.minutes or 0:.1f} min)" for a, e in rung.arms.items()
        )
        lines.append(f"rung {rung.rung + 1}: dev mean primary: {scores}")
    if r.stopped_early:
        lines.append(r.stopped_early)
    lines.append(f"chosen: {ARM_NAMES[r.chosen]}: {r.reason}")
    return "\n".join(lines) + f"\n{r.minutes_used or 0:.1f} min; report: {paths.adapt_report}"
