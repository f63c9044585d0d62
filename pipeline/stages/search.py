"""search stage: fine-tuning settings chosen on each model's dev split (``search``) -> ``data/search/chosen.json``.

Off by default (``search.enabled: false``): the stage then writes an empty choice and finetune uses
params.yaml as it is. On, it runs one Optuna study per model in ``search.models``
(:mod:`pipeline.training.search`): ``search.trials`` trials (the first params.yaml's settings) or
``search.budget_minutes`` each, in rounds of one trial per model (so every model gets as many), cheap
trials first through median pruning, each trial a nested MLflow run. Only dev splits are read; the
test split is scored once, by evaluate, after the choice.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.core.config import Config
from pipeline.core.io import require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.search import SearchReport
from pipeline.training.search import CHOSEN_FILE, describe_values, run_studies, write_chosen


def run(cfg: Config, paths: Paths) -> SearchReport:
    """Choose the fine-tuning settings of each model on dev; write ``data/search/`` and ``reports/search.json``."""
    sc = cfg.search
    studies: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    if sc.enabled:
        from pipeline.modelling.precision import resolve_precision

        precision = resolve_precision(cfg.precision)
        require_inputs(paths.dapt, paths.task_features, paths.tasks)
        # finetune trains no baseline without finetune.baseline: nothing to choose for it then
        models = [m for m in sc.models if m != "baseline" or cfg.finetune.baseline]
        studies = run_studies(cfg, paths, models, precision)
    found: dict[str, Any] = {"enabled": sc.enabled}
    if sc.enabled:
        found |= {
            "trials_per_model": sc.trials,
            "budget_minutes": sc.budget_minutes,
            "pruner": sc.pruner,
            "space": {k: r.model_dump() for k, r in sc.ranges().items()},
            "models": studies,
            "seconds": round(time.perf_counter() - start, 1),
        }
    report = SearchReport.model_validate(found)
    with transaction(paths.root, "search") as txn:
        out = txn.dir(paths.search)
        write_chosen(out / CHOSEN_FILE, cfg, studies)
        txn.write_report(paths.search_report, report)
    return report


def summary(r: SearchReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline search`` (what ``run`` returned, read for a person)."""
    if not r.enabled or r.models is None:
        return "search.enabled is false: finetune uses the settings of params.yaml"
    lines = []
    for model, s in r.models.items():
        states = [t.state for t in s.trials]
        values = describe_values(s.chosen)
        lines.append(
            f"{model}: trial {s.chosen_trial + 1} chosen ({values}): dev mean primary "
            f"{s.chosen_dev_mean_primary} (params.yaml's settings: {s.default_dev_mean_primary}); "
            f"{len(states)} trials ({states.count('pruned')} pruned, {states.count('failed')} failed) in {s.seconds} s"
        )
    return "\n".join(lines) + f"\nchosen: {paths.search / 'chosen.json'}; report: {paths.search_report}"
