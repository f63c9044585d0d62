"""A model card per registered version, in the Hugging Face format: YAML front matter (``base_model``, ``datasets``,
``tags``, ``model-index`` with the test metrics) and a markdown body (intended use, limitations, evaluation with the
95% CIs, budget and hardware, variant notes, lineage, how to reproduce).

Pure: built from the reports the register stage reads; ``huggingface_hub`` writes and parses the metadata (its
``ModelCardData`` and ``EvalResult``), so the card loads with ``huggingface_hub.ModelCard`` like a card on the Hub.
The README.md of each model folder a stage writes is in :mod:`pipeline.reporting.model_readmes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.core.base_model import HUB_IDS
from pipeline.core.reports.compression import ModelEntry, VariantEntry
from pipeline.core.reports.evaluation import EvaluationReport, VersionScores
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.reporting.headline import headline_text, md_text, summary_headline, verdict_and_watch
from pipeline.reporting.numbers import points
from pipeline.tasks.registry import REGISTRY


@dataclass(frozen=True)
class CardInputs:
    """What a version's card is written from (all of it in the register stage's inputs)."""

    model_name: str  # the registered model
    version: str
    variant: str  # "full" or a compression variant
    parent_version: str | None  # the full model's version, for a variant
    summary_line: str  # the version's one-line description
    shown: VersionScores  # this version's test scores
    metrics: EvaluationReport  # reports/metrics.json (the full model: baseline, gains with CIs, verdict)
    entry: ModelEntry | None  # what reports/compression.json says of it (None without compression)
    provenance: dict[str, str]  # git.commit, git.dirty, data_hash, params_hash, dvc.<stage>.<out> hashes
    pretrain: PretrainReport | None  # reports/pretrain.json (None when absent)
    base_model: str  # pretrain.base_model as params.yaml names it
    profile: str | None
    lineage_uri: str  # runs:/<register run>/lineage.json
    seed: int | None = None  # the run's seed (params.yaml seed)
    license: str = "other"  # register.card.license
    language: tuple[str, ...] = ()  # register.card.language


def model_card(c: CardInputs) -> str:
    """The card: Hub metadata between ``---`` lines, then the markdown body (:func:`card_body`)."""
    return f"---\n{card_data(c).to_yaml()}\n---\n\n{card_body(c)}"


def card_data(c: CardInputs) -> Any:
    """The Hub metadata: base model, license and language, tags, and ``model-index`` (one result per task: its
    primary test metric, named with the gain and its CI); the CIs again as numbers under ``adaptbert``."""
    from huggingface_hub import EvalResult, ModelCardData

    base = HUB_IDS.get(c.base_model, None if c.base_model == "scratch" else c.base_model)
    results = []
    for task, t in c.shown.tasks.items():
        gain = gain_of(c, task)
        notes = [text for text in (interval_text(c, task), gain_text(gain) if gain else "") if text]
        results.append(
            EvalResult(
                task_type=REGISTRY[c.metrics.tasks[task].type].hub_task,
                task_name=task,
                dataset_type=task,
                dataset_name=task,
                dataset_split="test",
                metric_type=t.primary,
                metric_value=round(t.score, 4),
                metric_name=f"{t.primary} ({'; '.join(notes)})" if notes else t.primary,
            )
        )
    return ModelCardData(
        model_name=f"{c.model_name} v{c.version}",
        base_model=base,
        library_name="transformers",
        license=c.license,
        language=list(c.language) or None,
        # no `datasets:`: it lists Hub dataset ids, and the tasks are the user's files (named in model-index)
        tags=["adaptbert", "bert", "domain-adaptation", "multi-task", c.variant, *([c.profile] if c.profile else [])],
        eval_results=results,
        adaptbert={
            "model": c.model_name,
            "version": c.version,
            "variant": c.variant,
            "parent_version": c.parent_version,
            "profile": c.profile,
            "mean_primary": round(c.shown.mean_primary, 4),
            "test_ci": {task: ci for task in c.shown.tasks if (ci := interval_of(c, task))},
            "gains": {task: gain for task in c.shown.tasks if (gain := gain_of(c, task))},
            "lineage": dict(c.provenance),
            "lineage_file": c.lineage_uri,
        },
    )


def gain_of(c: CardInputs, task: str) -> dict[str, Any] | None:
    """The primary metric's change with its CI: against the un-adapted baseline (the full model) or against the full
    model (a variant); None when it was not measured."""
    if c.variant == "full":
        gain = c.metrics.tasks[task].gain
    else:
        source = c.entry.tasks.get(task) if isinstance(c.entry, VariantEntry) else None
        gain = None if source is None else (source.delta, source.ci_low, source.ci_high)
    if gain is None:
        return None
    delta, low, high = gain
    return {
        "against": "un-adapted baseline" if c.variant == "full" else f"full model v{c.parent_version}",
        # as the reports hold them (5 decimals): rounding again here would round the points shown twice
        "delta": float(delta),
        "ci_low": float(low),
        "ci_high": float(high),
        "confidence": c.metrics.bootstrap.confidence,
    }


def interval_of(c: CardInputs, task: str) -> dict[str, float] | None:
    """This version's own test CI of the task's primary metric (a percentile bootstrap over the test examples, the
    same resamples as its gain's); None when it was not measured (a report from before, no resamples)."""
    ci = c.shown.tasks[task].interval
    if ci is None:
        return None
    return {"low": ci[0], "high": ci[1], "confidence": c.metrics.bootstrap.confidence}


def interval_text(c: CardInputs, task: str) -> str:
    ci = interval_of(c, task)
    return f"{ci['confidence']:.0%} CI [{points(ci['low'])}, {points(ci['high'])}]" if ci else ""


def gain_text(gain: dict[str, Any]) -> str:
    return (
        f"{points(gain['delta'], signed=True)} points vs {gain['against']}, {gain['confidence']:.0%} CI "
        f"[{points(gain['ci_low'], signed=True)}, {points(gain['ci_high'], signed=True)}]"
    )


def description(body: str, version: str, limit: int = 5000) -> str:
    """The card's body as the version's MLflow description: whole sections up to ``limit`` characters (MLflow's
    column size), then where the rest is."""
    if len(body) <= limit:
        return body
    more = f"\n\n(the whole card: `adaptbert models card {version}`)"
    kept = ""
    for section in body.split("\n\n## "):
        candidate = f"{kept}\n\n## {section}" if kept else section
        if len(candidate) + len(more) > limit:
            break
        kept = candidate
    return (kept or body[: limit - len(more)]) + more


def card_body(c: CardInputs) -> str:
    """The markdown a person reads."""
    return "\n\n".join(card_sections(c)) + "\n"


def registry_description(c: CardInputs) -> str:
    """The version's MLflow description: the one-line summary first (the registry's Description column shows the
    start: it was the card's ``# heading``), then the card's sections after its heading."""
    return description("\n\n".join([c.summary_line, *card_sections(c)[1:]]) + "\n", c.version)


def card_sections(c: CardInputs) -> list[str]:
    """The card's sections: its heading with the one-line summary, then intended use ... reproduce."""
    what = "full model" if c.variant == "full" else f"{c.variant} of version {c.parent_version}"
    return [
        f"# {c.model_name} v{c.version} ({what})\n\n{c.summary_line}",
        intended_use(c),
        limitations(c),
        evaluation(c),
        budget(c),
        *([variant_notes(c)] if c.variant != "full" else []),
        lineage(c),
        reproduce(c),
    ]


def intended_use(c: CardInputs) -> str:
    tasks = ", ".join(f"{task} ({c.metrics.tasks[task].type.replace('_', ' ')})" for task in c.shown.tasks)
    base = HUB_IDS.get(c.base_model, c.base_model)
    start = "a BERT trained from scratch" if c.base_model == "scratch" else f"`{base}`"
    electra = c.pretrain is not None and c.pretrain.objective == "electra"
    objective = "ELECTRA-style replaced-token detection" if electra else "masked-LM"
    return (
        "## Intended use\n\n"
        f"One shared encoder, {start} adapted to the domain of its corpus by continued {objective} pretraining, with "
        f"one head per task: {tasks}. For these tasks on text like the training data: serve it with "
        f"`mlflow models serve -m models:/{c.model_name}/{c.version}` or load it with `mlflow.pyfunc.load_model`."
    )


def limitations(c: CardInputs) -> str:
    sizes = ", ".join(f"{task} {t.test_examples}" for task, t in c.metrics.tasks.items())
    lines = [
        f"- Scored once on the test splits (examples: {sizes}); the CIs below say how much of a gain could be noise.",
        "- Trained and tested on one corpus and its task files: text from elsewhere may score lower. No robustness "
        "or fairness evaluation was run.",
        "- Inputs longer than the model's maximum sequence length are cut (QA reads long contexts in windows).",
    ]
    if c.profile:
        lines.insert(0, f"- A run of profile `{c.profile}`: registered under its own name, not the model you serve.")
    return "## Limitations\n\n" + "\n".join(lines)


def evaluation(c: CardInputs) -> str:
    full = c.variant == "full"
    against = "un-adapted baseline" if full else f"full model v{c.parent_version}"
    boot = c.metrics.bootstrap
    level = f"{boot.confidence:.0%} CI"
    rows = [
        f"| task | metric | this version [{level}] | {against} | change [{level}] | trivial |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    for task, t in c.shown.tasks.items():
        primary, whole = t.primary, c.metrics.tasks[task]
        other = whole.score("baseline" if full else "adapted")
        gain = gain_of(c, task)
        change = (
            f"{points(gain['delta'], signed=True)} [{points(gain['ci_low'], signed=True)}, {points(gain['ci_high'], signed=True)}]"
            if gain
            else "-"
        )
        ci = interval_of(c, task)
        this = f"{points(t.score)}" + (f" [{points(ci['low'])}, {points(ci['high'])}]" if ci else "")
        rows.append(
            f"| {task} | {primary} | {this} | "
            f"{'-' if other is None else f'{points(float(other))}'} | {change} | {points(t.trivial_score)} |"
        )
    how = (
        f"One run (seed {'-' if c.seed is None else c.seed}) scored once on the test splits; the CIs are percentile "
        f"bootstraps over the test examples ({boot.resamples} resamples, the change's paired between the "
        "two models): they cover the test sample's noise, not the seed's; the settings are params.yaml's or those "
        "the search stage chose on the dev splits."
    )
    text = (
        "## Evaluation (test splits, in points)\n\n"
        + "\n".join(rows)
        + f"\n\nMean primary test metric (points): {version_headline(c)}. {how}"
    )
    if full and (said := verdict_and_watch(c.metrics)):
        text += "\n\n" + "\n".join(f"- {md_text(line)}" for line in said)
    return text


def version_headline(c: CardInputs) -> str:
    """The headline of the full model (adapted, baseline, gain and CI) as the run report says it; a variant's score."""
    return summary_headline(c.metrics.summary) if c.variant == "full" else headline_text(c.shown.mean_primary)


def budget(c: CardInputs) -> str:
    p = c.pretrain
    if not p:
        return "## Budget and hardware\n\nNo pretraining report was found for this run."
    precisions = ", ".join(f"{stage} {value}" for stage, value in c.metrics.precision.model_dump().items()) or "-"
    return (
        "## Budget and hardware\n\n"
        f"- Domain-adaptive pretraining: {p.global_step} steps of {p.global_batch} blocks of "
        f"{p.block_length} tokens ({p.tokens_seen:,} tokens) on {p.device} x{p.world_size}, "
        f"{p.precision}: {p.precision_reason}\n"
        f"- Precision per stage: {precisions}"
    )


def variant_notes(c: CardInputs) -> str:
    e = c.entry
    parts = [f"{c.variant} of version {c.parent_version}"]
    if e is not None:
        parts.append(f"{e.size_mb:.1f} MB on disk")
        if (speed := e.served_speed()) is not None:
            parts.append(f"batch-1 p50 {speed.p50_ms:.1f} ms ({e.served_in}, on the machine that built it)")
    if isinstance(e, VariantEntry):
        parts.append(f"mean primary {points(e.mean_primary_delta, signed=True)} points against the full model")
    return "## Variant\n\n" + "; ".join(parts) + "."


def lineage(c: CardInputs) -> str:
    p = c.provenance
    outputs = sum(k.startswith("dvc.") for k in p)
    return (
        "## Lineage\n\n"
        f"- git commit `{p.get('git.commit', 'unknown')}` (uncommitted changes: {p.get('git.dirty', 'unknown')})\n"
        f"- data hash `{p.get('data_hash', '-')}`, params hash `{p.get('params_hash', '-')}`\n"
        f"- the `dvc.lock` hash of each of {outputs} stage outputs: in this card's metadata (`adaptbert.lineage`) and "
        f"in `{c.lineage_uri}`"
    )


def reproduce(c: CardInputs) -> str:
    commit = c.provenance.get("git.commit", "<commit>")
    run = "dvc repro" if not c.profile else f"python -m flows.profile {c.profile} --run"
    return (
        "## Reproduce\n\n```bash\n"
        f"git checkout {commit}\n"
        f"{run}    # rebuilds what this version was built from (dvc pull fetches it from the DVC remote instead)\n"
        f"adaptbert models card {c.version}{f' --profile {c.profile}' if c.profile else ''}\n```"
    )
