"""evaluate stage: test metrics of the adapted and the baseline model, and the gain from adaptation.

For every task, both fine-tuned models (``models/finetuned/``, ``models/baseline/``) are scored
on the test split with the task type's metric (scikit-learn for classification, seqeval strict
IOB2 for NER, SQuAD EM/F1 for QA), next to the task's trivial baseline (majority class, all-O,
most frequent answer). The DAPT-vs-baseline delta on the primary metric gets a paired bootstrap
confidence interval over test examples. Held-out MLM perplexity of the base and adapted models
comes from the pretrain stage (same fixed masks). Writes ``reports/metrics.json`` (read by DVC,
MLflow, Prefect and the README), ``reports/evaluation.md`` and PNG plots in ``reports/plots/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.config import Config
from pipeline.core.console import Progress
from pipeline.core.io import read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.reporting.curves import read_curves


def evaluate_tasks(cfg: Config, paths: Paths, precision: Precision) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-task test metrics of every available model; also the raw predictions for the plots."""
    from pipeline.tasks.metrics import bootstrap_delta
    from pipeline.training.data import load_contender
    from pipeline.training.multitask import score_task

    ec = cfg.evaluate
    baseline_dir = (
        paths.tokenized / "baseline" / "tasks" if (paths.tokenized / "baseline").exists() else paths.tokenized / "tasks"
    )
    models = {"adapted": load_contender(paths.finetuned, cfg, paths, paths.tokenized / "tasks")}
    if (paths.baseline / "tasks.json").exists():
        models["baseline"] = load_contender(paths.baseline, cfg, paths, baseline_dir)
    results: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    progress = Progress("evaluate: scoring", len(models["adapted"][2]), "tasks")  # a line every 10 s on large tests
    for done, (name, data) in enumerate(models["adapted"][2].items(), start=1):
        spec, kind = data.spec, data.spec.kind
        scored = {
            m: score_task(model, tasks[name], "test", tok.pad_token_id, ec.batch_size, precision)
            for m, (model, tok, tasks) in models.items()
        }
        gold = scored["adapted"].gold
        trivial = kind.score(gold, kind.trivial(data.rows["train"], data.rows["test"], spec), spec)
        entry: dict[str, Any] = {
            "type": spec.type,
            "primary": spec.primary,
            "test_examples": len(gold),
            "trivial_baseline": kind.trivial_name,
            "trivial": trivial,
        }
        entry.update({m: s.metrics for m, s in scored.items()})
        if "baseline" in scored:
            ci = bootstrap_delta(
                kind,
                spec,
                gold,
                scored["adapted"].pred,
                scored["baseline"].pred,
                ec.bootstrap_resamples,
                cfg.seed,
                ec.confidence,
            )
            entry.update(delta=ci["delta"], ci_low=ci["low"], ci_high=ci["high"])
        results[name] = entry
        extras[name] = {"labels": spec.labels}
        if ec.attention_examples:
            extras[name]["attention"] = attention_views(models, name, ec)
        matrices = {m: kind.confusion(gold, s.pred, spec) for m, s in scored.items()}
        if all(m is not None for m in matrices.values()):
            extras[name]["confusion"] = matrices
        progress.update(done, task=name)
    progress.close()
    return results, extras


def attention_views(models: dict[str, Any], task: str, ec: Any) -> list[dict[str, Any]]:
    """Each model's attention (``evaluate.attention_*``) on the first short test examples of ``task``."""
    from pipeline.reporting.attention import attention_map, first_window, pick_examples

    adapted = models["adapted"][2][task].splits["test"]
    views = []
    for i in pick_examples(adapted, ec.attention_examples, ec.attention_max_tokens):
        panels = []
        for name, (model, tok, tasks) in models.items():
            feature = tasks[task].splits["test"][i]
            ids = first_window(feature["input_ids"])
            types = first_window(feature["token_type_ids"]) if "token_type_ids" in feature else None
            matrix = attention_map(model, ids, types, ec.attention_layer, ec.attention_head)
            n = min(len(ids), ec.attention_max_tokens)  # a long example is drawn up to its first n tokens
            panels.append((name, tok.convert_ids_to_tokens(ids[:n]), matrix[:n, :n]))
        layers = int(models["adapted"][0].encoder.config.num_hidden_layers)
        views.append({"example": i, "panels": panels, "layer": f"layer {ec.attention_layer % layers + 1} of {layers}"})
    return views


def plot_attention_views(extras: dict[str, Any], ec: Any, out: Path) -> list[str]:
    """``attention_<task>_<k>.png``: the models' attention side by side, and their difference where both
    tokenize the example alike."""
    from pipeline.reporting.attention import plot_attention

    heads = "mean of the heads" if ec.attention_head is None else f"head {ec.attention_head}"
    written = []
    for name, e in extras.items():
        for k, view in enumerate(e.get("attention", []), start=1):
            panels = view["panels"]
            same = len(panels) == 2 and panels[0][1] == panels[1][1]
            diff = panels[0][2] - panels[1][2] if same else None
            title = f"{name}: test example {view['example'] + 1}, {view['layer']}, {heads}"
            written.append(plot_attention(title, panels, diff, out / f"attention_{name}_{k}.png"))
    return written


def summarise(results: dict[str, Any], pretrain_report: dict[str, Any]) -> dict[str, Any]:
    """Mean primary metrics, the mean delta, how many tasks improved, and the MLM perplexities."""
    summary: dict[str, Any] = {}
    for model in ("adapted", "baseline", "trivial"):
        values = [r[model][r["primary"]] for r in results.values() if model in r]
        if values:
            summary[f"mean_primary_{model}"] = float(np.mean(values))
    if "mean_primary_baseline" in summary:
        summary["mean_primary_delta"] = summary["mean_primary_adapted"] - summary["mean_primary_baseline"]
        summary["tasks_improved"] = sum(r["delta"] > 0 for r in results.values())
        summary["tasks_improved_significantly"] = sum(r["ci_low"] > 0 for r in results.values())
    summary["perplexity_base"] = pretrain_report.get("base_perplexity")
    summary["perplexity_adapted"] = pretrain_report.get("adapted_perplexity")
    return summary


def verdict(results: dict[str, Any], summary: dict[str, Any], pre: dict[str, Any], fine: dict[str, Any]) -> str | None:
    """Adapted vs baseline in one sentence, with each task's paired CI and what the baseline was given.

    Steps and tokens, not minutes: this sentence is versioned (metrics.json, evaluation.md); the console
    adds the minutes measured in this run."""
    if "mean_primary_delta" not in summary or not pre:
        return None
    per_task = ", ".join(
        f"{n} {100 * r['delta']:+.1f} [{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}]" for n, r in results.items()
    )
    what = "DAPT+TAPT" if pre.get("task_text_blocks") else "DAPT"
    spent = f"{pre.get('global_step')} pretraining steps ({pre.get('tokens_seen', 0):,} tokens)"
    budget = fine.get("baseline_budget", {"mode": "same_steps"})
    base = f"{100 * summary['mean_primary_baseline']:.1f}"
    searched = fine.get("search", {})  # settings chosen on dev per model: the budgets may differ
    own = (
        f"with the fine-tuning settings chosen on its own dev split ({fine['baseline']['steps']} steps; "
        f"the adapted model {fine['adapted']['steps']})"
        if searched and "baseline" in fine and "adapted" in fine
        else "with the same fine-tuning steps"
    )
    given = (
        f"the baseline, given the pretraining time as {budget['extra_steps']} more fine-tuning steps, reached {base}"
        if budget["mode"] == "same_compute"
        else f"the baseline reached {base} {own} and without that time "
        "(finetune.baseline_budget: same_compute gives it the time)"
    )
    significant = summary["tasks_improved_significantly"]
    return (
        f"{what} bought {100 * summary['mean_primary_delta']:+.1f} points of mean primary for {spent} "
        f"({per_task}; the whole CI above 0 on {significant} of {len(results)} task(s)); {given}."
    )


def rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    return x


# ----------------------------------------------------------------------------- plots


def save_figure(fig: Any, path: Path) -> str:
    """Write ``fig`` as PNG, close it, return the file name (for the report's links)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def plot_confusions(extras: dict[str, Any], out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    written = []
    for name, e in extras.items():
        if "confusion" not in e:
            continue
        fig, axes = plt.subplots(1, len(e["confusion"]), figsize=(5.5 * len(e["confusion"]), 5), squeeze=False)
        for ax, (model, matrix) in zip(axes[0], e["confusion"].items(), strict=True):
            m = np.array(matrix)
            ax.imshow(m, cmap="Blues")
            ax.set(
                title=f"{name}: {model}",
                xlabel="predicted",
                ylabel="gold",
                xticks=range(len(e["labels"])),
                yticks=range(len(e["labels"])),
            )
            ax.set_xticklabels(e["labels"], rotation=45, ha="right", fontsize=8)
            ax.set_yticklabels(e["labels"], fontsize=8)
            for (i, j), v in np.ndenumerate(m):
                ax.text(
                    j, i, str(v), ha="center", va="center", fontsize=8, color="white" if v > m.max() / 2 else "black"
                )
        written.append(save_figure(fig, out / f"confusion_{name}.png"))
    return written


BREAKDOWNS = {"per_type": "entity F1 by type", "per_label": "F1 by label"}  # metric keys a task type may report


def breakdown_of(r: dict[str, Any]) -> str | None:
    """The per-type / per-label F1 breakdown a task's metrics carry (NER, multi-label), if any."""
    return next((key for key in BREAKDOWNS if key in r["adapted"]), None)


def plot_entity_f1(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    written = []
    for name, r in results.items():
        key = breakdown_of(r)
        if key is None:
            continue
        models = [m for m in ("adapted", "baseline") if m in r]
        types = sorted(r["adapted"][key])
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(types) + 2), 4))
        width = 0.8 / len(models)
        for k, model in enumerate(models):
            ax.bar(
                np.arange(len(types)) + k * width,
                [r[model][key].get(t, {}).get("f1", 0.0) for t in types],
                width,
                label=model,
            )
        ax.set(
            title=f"{name}: {BREAKDOWNS[key]} (test)",
            ylim=(0, 1),
            ylabel="F1",
            xticks=np.arange(len(types)) + width * (len(models) - 1) / 2,
        )
        ax.set_xticklabels(types)
        ax.legend()
        prefix = "entity" if key == "per_type" else "label"
        written.append(save_figure(fig, out / f"{prefix}_f1_{name}.png"))
    return written


def plot_learning_curves(curves_dir: Path, out: Path) -> list[str]:
    """Train loss and dev mean primary metric of every model under ``curves_dir`` (a folder per model)."""
    import matplotlib.pyplot as plt

    fig, (loss_ax, dev_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for model_dir in sorted(p for p in curves_dir.iterdir() if p.is_dir()) if curves_dir.is_dir() else []:
        for ax, file, key in ((loss_ax, "train.csv", "loss"), (dev_ax, "dev.csv", "eval_mean_primary")):
            series = read_curves(model_dir / file)
            if key in series:
                steps, values = zip(*series[key], strict=True)
                ax.plot(steps, values, marker="o" if key != "loss" else None, label=model_dir.name)
    loss_ax.set(title="train loss (task-weighted)", xlabel="step", ylabel="loss")
    dev_ax.set(title="dev: mean primary metric", xlabel="step", ylabel="mean primary metric")
    for ax in (loss_ax, dev_ax):
        if ax.lines:  # a run too short to log has no curve
            ax.legend()
        ax.grid(alpha=0.3)
    return [save_figure(fig, out / "learning_curves.png")]


# ----------------------------------------------------------------------------- report


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def evaluation_markdown(metrics: dict[str, Any], plots: list[str]) -> str:  # noqa: C901  # to move into reporting/ as one view per report (issue 29, part 3)
    """The human report: the DAPT-vs-baseline table, every metric, perplexity and the plots."""
    s, tasks = metrics["summary"], metrics["tasks"]
    conf = metrics["bootstrap"]["confidence"]
    has_base = "mean_primary_baseline" in s
    lines = [
        "# Evaluation: domain-adapted vs un-adapted",
        "",
        "All metrics on the test splits, in percent. Delta = adapted - baseline on the task's primary metric; "
        f"the interval is a paired bootstrap {conf:.0%} CI over test examples ({metrics['bootstrap']['resamples']} resamples).",
        "",
    ]
    if has_base:
        lines += [
            "| task | type | primary | trivial | baseline | adapted | delta | CI |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, r in tasks.items():
            p = r["primary"]
            lines.append(
                f"| {name} | {r['type']} | {p} | {pct(r['trivial'][p])} ({r['trivial_baseline']}) | {pct(r['baseline'][p])} | "
                f"{pct(r['adapted'][p])} | {100 * r['delta']:+.1f} | [{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}] |"
            )
        lines += [
            f"| **mean** | | | {pct(s.get('mean_primary_trivial'))} | {pct(s['mean_primary_baseline'])} | {pct(s['mean_primary_adapted'])} | "
            f"{100 * s['mean_primary_delta']:+.1f} | |",
            "",
            f"Tasks improved: {s['tasks_improved']} of {len(tasks)} ({s['tasks_improved_significantly']} with the whole CI above 0).",
            "",
        ]
        if metrics.get("verdict"):
            lines += [f"**Verdict.** {metrics['verdict']}", ""]
    lines += ["## All metrics", "", "| task | model | metrics |", "|---|---|---|"]
    for name, r in tasks.items():
        for model in ("adapted", "baseline", "trivial"):
            if model in r:
                shown = ", ".join(f"{k} {pct(v)}" for k, v in r[model].items() if isinstance(v, float))
                lines.append(f"| {name} | {model} | {shown} |")
    for name, r in tasks.items():
        key = breakdown_of(r)
        if key is None:
            continue
        title = "entities by type (seqeval, strict IOB2)" if key == "per_type" else "F1 by label"
        lines += [
            "",
            f"### {name}: {title}",
            "",
            f"| {'type' if key == 'per_type' else 'label'} | support | baseline F1 | adapted F1 |",
            "|---|---|---|---|",
        ]
        for t, v in r["adapted"][key].items():
            base = r.get("baseline", {}).get(key, {}).get(t, {}).get("f1")
            lines.append(f"| {t} | {v['support']} | {pct(base)} | {pct(v['f1'])} |")
    if s.get("perplexity_base") is not None:
        lines += [
            "",
            "## Held-out domain MLM perplexity",
            "",
            f"Base model {s['perplexity_base']:.2f} -> adapted {s['perplexity_adapted']:.2f} "
            "(pretrain stage, validation corpus, same masked positions).",
        ]
    if metrics.get("single_task"):
        lines += [
            "",
            "## Multi-task vs single-task (adapted encoder, same budget)",
            "",
            "| task | primary | single-task | multi-task |",
            "|---|---|---|---|",
        ]
        for name, st in metrics["single_task"].items():
            p = st["primary"]
            lines.append(f"| {name} | {p} | {pct(st['test'][p])} | {pct(tasks[name]['adapted'][p])} |")
    if metrics.get("precision"):
        lines += [
            "",
            "Precision: "
            + ", ".join(f"{stage} {p}" for stage, p in metrics["precision"].items() if p)
            + " (`precision` in params.yaml; bf16 is autocast with fp32 weights and losses).",
        ]
    lines += ["", "## Plots", ""] + [f"![{p}](plots/{p})" for p in plots]
    return "\n".join(lines) + "\n"


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Score both models on every test split; write metrics.json, evaluation.md and the plots."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    start = time.perf_counter()
    precision = resolve_precision(cfg.precision)  # a config error before a missing input
    require_inputs(
        {
            paths.finetuned: "finetune",
            paths.baseline: "finetune",
            paths.tokenized / "tasks": "tokenize",
            paths.tasks: "ingest",
        }
    )
    results, extras = evaluate_tasks(cfg, paths, precision)
    pretrain_report = read_report(paths.pretrain_report, "pretrain") if paths.pretrain_report.exists() else {}
    finetune_report = read_report(paths.finetune_report, "finetune") if paths.finetune_report.exists() else {}
    metrics: dict[str, Any] = {
        "summary": summarise(results, pretrain_report),
        "tasks": results,
        "bootstrap": {"resamples": cfg.evaluate.bootstrap_resamples, "confidence": cfg.evaluate.confidence},
        "precision": {
            stage: report.get("precision")
            for stage, report in (("pretrain", pretrain_report), ("finetune", finetune_report))
        }
        | {"evaluate": precision.name},
    }
    if (sentence := verdict(results, metrics["summary"], pretrain_report, finetune_report)) is not None:
        metrics["verdict"] = sentence
    if "single_task" in finetune_report:
        metrics["single_task"] = {
            n: {"primary": v["primary"], "test": v["test"]} for n, v in finetune_report["single_task"].items()
        }
    metrics = rounded(metrics)
    with transaction(paths.root, "evaluate") as txn:
        out = txn.dir(paths.plots)
        plots = (
            plot_confusions(extras, out)
            + plot_entity_f1(results, out)
            + plot_learning_curves(paths.finetune_curves, out)
            + plot_attention_views(extras, cfg.evaluate, out)
        )
        metrics["seconds"] = round(time.perf_counter() - start, 1)
        txn.write_text(paths.evaluation, evaluation_markdown(metrics, plots))
        txn.write_report(paths.metrics, metrics)
    return metrics


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline evaluate`` (what ``run`` returned, read for a person)."""
    rows = []
    for name, t in r["tasks"].items():
        p = t["primary"]
        base = f"baseline {t['baseline'][p]:.3f} -> " if "baseline" in t else ""
        ci = (
            f" (delta {t['delta']:+.3f}, {r['bootstrap']['confidence']:.0%} CI [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}])"
            if "delta" in t
            else ""
        )
        rows.append(f"  {name} {p}: trivial {t['trivial'][p]:.3f}, {base}adapted {t['adapted'][p]:.3f}{ci}")
    s = r["summary"]
    mean = (
        f"mean primary: baseline {s['mean_primary_baseline']:.3f} -> adapted {s['mean_primary_adapted']:.3f}"
        if "mean_primary_baseline" in s
        else f"mean primary: adapted {s['mean_primary_adapted']:.3f}"
    )
    said = ""
    if r.get("verdict"):
        pre = read_report(paths.pretrain_report, "pretrain") if paths.pretrain_report.exists() else {}
        minutes = (
            f" (pretraining took {pre['train_seconds'] / 60:.1f} min this run)" if pre.get("train_seconds") else ""
        )
        said = f"\nverdict: {r['verdict']}{minutes}"
    return "test metrics\n" + "\n".join(rows) + f"\n{mean}; report: {paths.evaluation}, metrics: {paths.metrics}{said}"
