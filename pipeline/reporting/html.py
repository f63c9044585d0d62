"""``reports/index.html``: one page about a whole run that opens offline (no CDN, every image embedded).

Sections, each present when its stage has run: the headline, the data that went in and what
validation said, tokenization (fragmentation before/after), the pretraining curve, the evaluation
table with confidence intervals and its plots, the compression front, the registry's decision, and
links to the Data Docs and the MLflow run. Built from the stage reports only: no model is loaded.
"""

from __future__ import annotations

import base64
import io
import time
from html import escape
from pathlib import Path
from typing import Any

from pipeline.core.base_model import NO_MLM_HEAD
from pipeline.core.mlflow_ui import LOCAL_UI, mlflow_ui_page
from pipeline.core.reports.adapt import AdaptReport
from pipeline.core.reports.compression import CompressionReport
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.ingest import IngestReport
from pipeline.core.reports.pretrain import Electra, PretrainReport, Selection
from pipeline.core.reports.promotion import PromotionReport
from pipeline.core.reports.search import SearchReport
from pipeline.core.reports.tokenize import TokenizeReport
from pipeline.core.sections.adapt import ARM_NAMES
from pipeline.reporting.curves import column
from pipeline.reporting.evaluation import confidence_text, errors_heading, seen_unseen_line
from pipeline.reporting.figures import use_headless
from pipeline.reporting.headline import execution_headline, perplexity_name, summary_headline, verdict
from pipeline.reporting.numbers import points_interval
from pipeline.reporting.tables import Table, adaptation_view, dapt_view, front_view
from pipeline.reporting.tables import cell as cell_text

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2b4f;color:#fff;padding:24px 40px}header h1{margin:0 0 6px;font-size:26px}
header p{margin:2px 0;opacity:.85}main{max-width:1100px;margin:0 auto;padding:12px 40px 40px}
section{background:#fff;border-radius:8px;padding:18px 24px;margin:18px 0;box-shadow:0 1px 3px rgba(0,0,0,.08)}
h2{margin:0 0 12px;font-size:19px}table{border-collapse:collapse;margin:8px 0;font-size:14px}
th,td{padding:5px 12px;border-bottom:1px solid #e3e6eb;text-align:right}th{background:#f0f2f5}
td:first-child,th:first-child{text-align:left}.good{color:#137333;font-weight:600}.bad{color:#b3261e;font-weight:600}
.cards{display:flex;gap:14px;flex-wrap:wrap}.card{background:#f0f4ff;border-radius:8px;padding:10px 16px;min-width:150px}
.card b{display:block;font-size:24px}.card span{font-size:13px;color:#4a5568}img{max-width:100%;margin:8px 0}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots figure{margin:0;flex:1 1 420px}.wide figure{flex-basis:100%}figcaption{font-size:13px;color:#4a5568}
code{background:#f0f2f5;padding:1px 4px;border-radius:3px}.muted{color:#6b7280;font-size:13px}
"""

# Marks the page once every image has decoded: the browser test reads it from the rendered DOM.
IMAGE_CHECK = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images', ok + '/' + imgs.length);
});
"""


def pct(value: Any, signed: bool = False) -> str:
    """``0.8391`` -> ``83.9`` (``+4.9`` when ``signed``); ``-`` for a missing value."""
    return cell_text(value, "points" if signed else "pct")


def table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table; cells are escaped unless they are already markup (``Markup``)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def view_table(view: Table) -> str:
    """A report's view (:mod:`pipeline.reporting.tables`) as an HTML table; styled cells get their class."""
    rows = []
    for k, row in enumerate(view.rows):
        style = view.styles[k] if k < len(view.styles) else {}
        rows.append(
            [
                Markup(f'<span class="{style[c.key]}">{escape(cell_text(row.get(c.key), c.kind))}</span>')
                if c.key in style
                else cell_text(row.get(c.key), c.kind)
                for c in view.columns
            ]
        )
    return table([c.title for c in view.columns], rows)


class Markup(str):
    """A string that is already HTML."""


def cell(value: Any) -> str:
    return value if isinstance(value, Markup) else escape(str(value))


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def figure(path: Path, caption: str) -> str:
    return f"<figure>{image(path.read_bytes(), caption)}<figcaption>{escape(caption)}</figcaption></figure>"


def pretraining_plot(curves: Path) -> bytes | None:
    """Training loss and held-out perplexity per step, as a PNG; ``None`` without curves."""
    steps, loss = column(curves / "train.csv", "loss")
    eval_steps, ppl = column(curves / "eval.csv", "eval_perplexity")
    if not steps and not eval_steps:
        return None
    use_headless()
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    a.plot(steps, loss, color="#3056d3")
    a.set(title="masked-LM training loss", xlabel="step", ylabel="loss")
    b.plot(eval_steps, ppl, marker="o", color="#c2410c")
    b.set(title="held-out perplexity", xlabel="step", ylabel="perplexity", yscale="log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=90)
    plt.close(fig)
    return out.getvalue()


def headline_section(
    metrics: EvaluationReport | None,
    promotion: PromotionReport | None = None,
    pretrain: PretrainReport | None = None,
) -> str:
    if metrics is None:
        return "<section><h2>Headline</h2><p>evaluate has not run yet.</p></section>"
    s = metrics.summary
    interval = s.gain_interval
    cards = [
        (pct(s.mean_primary_adapted), "mean primary test metric, adapted"),
        (pct(s.mean_primary_baseline), "the same, un-adapted baseline"),
        (
            pct(s.mean_primary_delta, signed=True),
            "points bought by domain adaptation"
            + (f", {metrics.bootstrap.confidence:.0%} CI {points_interval(*interval)}" if interval else ""),
        ),
        (f"{s.perplexity_adapted:.3g}" if s.perplexity_adapted else "-", "held-out perplexity, adapted"),
    ]
    if promotion:
        cards.append((escape(promotion.serving.choice), "served" + (" (champion)" if promotion.promoted else "")))
    html = "".join(f'<div class="card"><b>{v}</b><span>{escape(label)}</span></div>' for v, label in cards)
    said = "".join(f"<p>{escape(line)}</p>" for line in verdict(metrics, promotion, pretrain))
    shown = f'<p class="headline">Mean primary test metric (points): {escape(summary_headline(s))}</p>'
    return f'<section><h2>Headline</h2><div class="cards">{html}</div>{shown}{said}</section>'


def data_section(ingest: IngestReport | None, validation: dict[str, Any] | None) -> str:
    if ingest is None:
        return ""
    c = ingest.corpus
    dropped = ", ".join(f"{k} {v}" for k, v in c.dropped.items() if v) or "none"
    rows = [
        [name, t.type, *(t.splits[s].examples for s in ("train", "validation", "test")), t.labels or "-"]
        for name, t in ingest.tasks.items()
    ]
    parts = [
        "<section><h2>Data</h2>",
        f"<p>Corpus: {c.documents_read} documents read, {c.train_documents} for training and "
        f"{c.validation_documents} held out; dropped: {escape(dropped)}; {c.words:,} words.</p>",
        table(["task", "type", "train", "validation", "test", "labels"], rows),
        decontamination_part(ingest),
    ]
    if validation is not None:
        ok = validation["failed_expectations"] == 0
        verdict = "all passed" if ok else f"{validation['failed_expectations']} failed"
        parts.append(
            f"<p>Validation (Great Expectations): {validation['expectations']} expectations, "
            f'<span class="{"good" if ok else "bad"}">{verdict}</span>. '
            '<a href="data_docs/index.html">Data Docs</a></p>'
        )
    return "".join(parts) + "</section>"


def decontamination_part(ingest: IngestReport) -> str:
    """What decontamination and near-duplicate removal dropped, per task and source, with examples (escaped)."""
    dc, nd = ingest.decontamination, ingest.near_duplicates
    if not dc.enabled:
        return ""
    parts = [
        f"<h3>Decontamination</h3><p>{dc.documents_dropped} corpus documents held a copy "
        f"({dc.exact_copies}) or near-copy ({dc.near_copies}) of a validation or "
        f"test text (near: Jaccard &ge; {dc.threshold} over {dc.shingle_words}-word shingles, "
        f"{dc.evaluation_sentences_indexed} evaluation sentences searched) and were dropped before tokenize"
        + (
            f"; {nd.documents_dropped} more near-copied an earlier document (Jaccard &ge; {nd.threshold})."
            if nd.enabled
            else "."
        )
        + "</p>",
        table(["task", "documents dropped"], [[t, n] for t, n in dc.by_task.items()]),
        table(["source", "documents dropped"], [[s, n] for s, n in dc.by_source.items()]),
    ]
    rows = [
        [task, e.split, e.evaluation_sentence, f"{e.source}:{e.line}", e.corpus_sentence, e.containment]
        for task, examples in dc.examples.items()
        for e in examples
    ]
    if rows:  # collapsed: long sentences would push the rest of the run down the page
        parts.append(
            f"<details><summary>Examples ({len(rows)})</summary>"
            + table(["task", "split", "evaluation sentence", "corpus document", "its sentence", "containment"], rows)
            + "</details>"
        )
    return "".join(parts)


def tokenize_section(tok: TokenizeReport | None) -> str:
    if tok is None:
        return ""
    f = tok.fragmentation
    rows = [
        ["pieces per word", f.pieces_per_word_base, f.pieces_per_word_final],
        ["pieces per domain-term word", f.pieces_per_domain_word_base, f.pieces_per_domain_word_final],
    ]
    new = ", ".join(t.token for t in tok.top_new_tokens[:12])
    return (
        "<section><h2>Tokenization</h2>"
        f"<p>{escape(tok.mode)} vocabulary of {tok.vocab_size:,} ({tok.new_tokens} new tokens"
        f"{': ' + escape(new) if new else ''}); {tok.tokens:,} corpus tokens in {tok.blocks:,} blocks; "
        f"[UNK] share {100 * tok.unk_share:.4f}%.</p>"
        + (f'<p><span class="bad">Warning:</span> {escape(tok.warning)}.</p>' if tok.warning else "")
        + table(["fragmentation", "base vocabulary", "final vocabulary"], rows)
        + "</section>"
    )


def selection_sentence(sel: Selection | None) -> str:
    """What ``pretrain.selection: nearest`` chose, in one sentence (nothing when every block was used)."""
    if not sel:
        return ""
    return (
        f"<p>Corpus selection: the {sel.k} blocks nearest to each train input, {sel.selected_blocks:,} of "
        f"{sel.corpus_blocks:,} blocks ({100 * sel.selected_blocks / max(sel.corpus_blocks, 1):.0f}%; "
        "<code>reports/select.json</code> has the tokens and the nearness per task).</p>"
    )


def perplexity_text(pre: PretrainReport) -> str:
    """Held-out perplexity, compared with the base model's only where the base model has a trained MLM head."""
    what = escape(perplexity_name(pre)) if pre.objective == "electra" else "perplexity"
    if pre.base_model in NO_MLM_HEAD:
        return (
            f"held-out {what} of the adapted model <b>{pre.adapted_perplexity:,.3f}</b> (the base model ships no "
            f"MLM head: its {pre.base_perplexity:,.0f} is that of a freshly initialised one, not a baseline)."
        )
    return f"held-out {what} {pre.base_perplexity:,.1f} &rarr; <b>{pre.adapted_perplexity:,.3f}</b>."


def detection_text(electra: Electra | None) -> str:
    """ELECTRA's held-out replaced-token detection, base pair -> adapted pair (empty for masked-LM pretraining)."""
    if not electra:
        return ""
    base, adapted = electra.base, electra.adapted
    return (
        f" The encoder was trained as ELECTRA's discriminator (a {electra.generator_layers}-layer generator replaced "
        f"masked tokens): held-out replaced-token detection accuracy {base.accuracy:.3f} &rarr; "
        f"<b>{adapted.accuracy:.3f}</b>, ROC AUC {base.auc} &rarr; <b>{adapted.auc}</b>."
    )


def pretrain_section(pre: PretrainReport | None, curves: Path) -> str:
    if pre is None:
        return ""
    png = pretraining_plot(curves)
    masking = f", {escape(pre.masking)} masking" if pre.masking else ""
    return (
        "<section><h2>Continued pretraining</h2>"
        f"<p>{pre.global_step} steps of {pre.global_batch} blocks of {pre.block_length} tokens from "
        f"<code>{escape(pre.base_model)}</code> ({escape(pre.precision)}{masking}); "
        + perplexity_text(pre)
        + detection_text(pre.electra)
        + "</p>"
        + selection_sentence(pre.selection)
        + (image(png, "pretraining loss and held-out perplexity") if png else "")
        + "</section>"
    )


def evaluation_section(metrics: EvaluationReport | None, plots: Path) -> str:
    if metrics is None:
        return ""
    figures = (
        "".join(
            figure(png, png.stem.replace("_", " "))
            for png in sorted(plots.glob("*.png"))
            if not png.name.startswith("attention_")
        )
        if plots.is_dir()
        else ""
    )
    return (
        "<section><h2>Evaluation (test split)</h2>"
        + view_table(dapt_view(metrics))
        + '<p class="muted">Delta: adapted minus baseline; the CI is a paired bootstrap over test examples. '
        "Green or red: the interval excludes zero.</p>" + f'<div class="plots">{figures}</div></section>'
    )


def errors_section(errors: dict[str, Any] | None) -> str:
    """Per task the adapted model's top confusions and most confident mistakes (texts from the data, escaped)."""
    if not errors:
        return ""
    parts = []
    for name, e in errors.items():
        a = e["adapted"]
        parts.append(f"<h3>{escape(errors_heading(name, e).removeprefix('### '))}</h3>")
        parts += [f"<p>{escape(line)}</p>" for line in seen_unseen_line(e) if line]
        if a["confusions"]:
            parts.append(
                table(["gold", "predicted", "count"], [[c["gold"], c["pred"], c["count"]] for c in a["confusions"]])
            )
        if a["mistakes"]:
            rows = [[m["text"], m["gold"], m["pred"], confidence_text(m["confidence"])] for m in a["mistakes"]]
            parts.append(table(["input", "gold", "predicted", "confidence"], rows))
    return (
        "<section><h2>Error analysis (adapted model)</h2>"
        '<p class="muted">Most frequent confusions (gold, predicted; for NER <code>O</code> is no entity) and the '
        "mistakes the model was most sure of. Every answer of both models: <code>reports/predictions/</code>; "
        "both models' analysis: <code>reports/errors.json</code>.</p>" + "".join(parts) + "</section>"
    )


def adaptation_section(adapt: AdaptReport | None) -> str:
    """The adaptation the tournament chose on dev: every arm's dev score and minutes per rung, the choice and why
    (nothing under ``adapt.strategy: fixed``)."""
    if adapt is None or not adapt.played or adapt.chosen is None or adapt.reason is None or adapt.keep is None:
        return ""
    stopped = f"<p>{escape(adapt.stopped_early)}</p>" if adapt.stopped_early else ""
    return (
        f"<section><h2>Adaptation chosen on dev: {escape(ARM_NAMES.get(adapt.chosen, adapt.chosen))}</h2>"
        f"<p>{escape(adapt.reason)}</p>{stopped}"
        '<p class="muted">Every arm spent the same minutes (fine-tuning alone: all of them on fine-tuning); each '
        f"rung kept the better {100 * adapt.keep:.0f}% of the adaptation arms and grew their budgets "
        f"x{1 / adapt.keep:g}; dev splits only (reports/adapt.json), test is scored once, above.</p>"
        + view_table(adaptation_view(adapt))
        + "</section>"
    )


def search_section(search: SearchReport | None) -> str:
    """The fine-tuning settings the search stage chose per model on dev, with every trial (nothing when off)."""
    if not search or not search.enabled or search.models is None:
        return ""
    parts = []
    for model, s in search.models.items():
        rows = [
            [
                t.trial + 1,
                t.state + (" (chosen)" if t.trial == s.chosen_trial else ""),
                ", ".join(
                    f"{k.removeprefix('finetune.')}={v if isinstance(v, int) else format(v, '.3g')}"
                    for k, v in t.values.items()
                ),
                "-" if t.steps is None else t.steps,
                pct(t.dev_mean_primary),
                "-" if t.seconds is None else t.seconds,
            ]
            for t in s.trials
        ]
        took = "" if s.seconds is None else f" in {s.seconds:.0f} s"
        parts.append(
            f"<h3>{escape(model)}</h3><p>Dev mean primary {pct(s.chosen_dev_mean_primary)} with the chosen "
            f"settings, {pct(s.default_dev_mean_primary)} with params.yaml's (trial 1); {len(rows)} trials{took}.</p>"
            + table(["trial", "state", "values", "steps", "dev mean primary", "seconds"], rows)
        )
    return (
        "<section><h2>Fine-tuning settings chosen on dev</h2>"
        '<p class="muted">One Optuna study per model (reports/search.json); only dev splits were read, '
        "test is scored once, above.</p>" + "".join(parts) + "</section>"
    )


def attention_section(plots: Path) -> str:
    """The attention maps evaluate drew (``evaluate.attention_*``), one figure per task and example."""
    pngs = sorted(plots.glob("attention_*.png")) if plots.is_dir() else []
    if not pngs:
        return ""
    figures = "".join(figure(png, png.stem.removeprefix("attention_").replace("_", " example ")) for png in pngs)
    return (
        "<section><h2>What the models attend to</h2>"
        "<p>Attention probabilities of one layer on test examples (rows: each token, columns: what it attends "
        "to), the adapted model beside the baseline, and their difference (red: the adapted model attends more). "
        "A hint of what adaptation changed, not an explanation of a prediction.</p>"
        f'<div class="plots wide">{figures}</div></section>'  # one per row: three heatmaps side by side each
    )


def compression_section(comp: CompressionReport | None, front: Path) -> str:
    if comp is None or not comp.enabled:
        return ""
    img = figure(front, "accuracy / latency front") if front.exists() else ""
    importance = front.with_name("head_importance.png")
    if importance.exists():
        img += figure(importance, "attention-head importance on the dev sets: the pruned variant removed the x heads")
    return "<section><h2>Compression</h2>" + view_table(front_view(comp)) + img + "</section>"


def registry_section(promotion: PromotionReport | None) -> str:
    if promotion is None:
        return ""
    link = mlflow_link(promotion)
    versions = ", ".join(f"{n} v{v}" for n, v in promotion.versions.items())
    gate = "promoted to champion" if promotion.promoted else "not promoted"
    return (
        "<section><h2>Registry</h2>"
        f"<p>Registered <code>{escape(promotion.model_name)}</code>: {escape(versions)}.</p>"
        f"<p>Serving rule: {escape(promotion.serving.reason)}.</p>"
        f"<p>Gate: <b>{gate}</b> &mdash; {escape(promotion.reason)}</p>"
        f"<p>MLflow run: {link}</p></section>"
    )


def mlflow_link(promotion: PromotionReport, run: str | None = None, page: str | None = None, text: str = "") -> str:
    """A link to an MLflow UI page (default: the register stage's run) on a server's UI, or how to open it for the
    local sqlite store (``mlflow ui`` from the project root)."""
    uri, exp = promotion.tracking_uri, promotion.experiment_id
    run = run or promotion.run_id
    page = mlflow_ui_page(page or (f"experiments/{exp}/runs/{run}" if exp else f"runs/{run}"))
    text = text or run
    if uri.startswith("http"):
        return f'<a href="{escape(uri.rstrip("/"))}/{page}">{escape(text)}</a>'
    store = "sqlite:///mlflow.db" if uri.startswith("sqlite:") and uri.endswith("/mlflow.db") else uri
    return (
        f"<code>{escape(text)}</code> (from the project root: <code>mlflow ui --backend-store-uri {escape(store)}</code>, "
        f'then <a href="http://127.0.0.1:5000/{page}">open it</a>)'
    )


def run_section(
    execution: dict[str, Any] | None,
    promotion: PromotionReport | None,
    pretrain: PretrainReport | None,
    compression: CompressionReport | None,
) -> str:
    """This run in context: its profile, the hardware and precision it ran on, the time of each stage that ran and
    the total, links to its MLflow parent run and model version."""
    profile = promotion.profile if promotion else None
    facts = [
        f"Profile: <b>{escape(profile)}</b> (its own MLflow experiment and registered model; your served model is "
        "untouched)"
        if profile
        else "Profile: none (params.yaml as it is)"
    ]
    if pretrain:
        facts.append(f"Pretraining: {escape(pretrain.precision_reason)}")
    if compression and compression.enabled and (m := compression.machine):
        threads = f", {m.threads} threads" if m.threads else ""
        facts.append(f"Serving timed on {escape(m.cpu)}{threads} ({escape(str(compression.serving_precision))})")
    html = "<section><h2>This run</h2>" + "".join(f"<p>{f}</p>" for f in facts)
    if execution and execution["stages"]:
        rows: list[list[Any]] = [[s["stage"], duration(s["seconds"]), s["status"].lower()] for s in execution["stages"]]
        total = sum(s["seconds"] or 0 for s in execution["stages"])
        rows.append([Markup("<b>total</b>"), Markup(f"<b>{duration(total)}</b>"), ""])
        html += table(["stage", "time (m:s)", "status"], rows)
        html += (
            '<p class="muted">Stages not listed were unchanged: DVC skipped them (they ran in an earlier run). '
            "Times include each stage's start (imports, MLflow); the report stage is still running.</p>"
        )
    else:
        html += '<p class="muted">Time per stage: in MLflow\'s stage runs, which this run did not log (tracking.enabled: false).</p>'
    if promotion:
        parent = (execution or {}).get("parent_run_id") or promotion.parent_run_id
        if parent:
            html += f"<p>MLflow parent run: {mlflow_link(promotion, run=parent)}</p>"
        name, version = promotion.model_name, promotion.version
        page = f"models/{name}/versions/{version}"
        html += f"<p>Model version: {mlflow_link(promotion, page=page, text=f'{name} v{version}')}</p>"
    return html + "</section>"


def duration(seconds: float | None) -> str:
    """``1:05`` (minutes:seconds), ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def next_steps(promotion: PromotionReport | None, metrics: EvaluationReport | None) -> str:
    """What to do after this run, from what it found: serve or compare, read the card, where the gain is unclear."""
    if promotion is None:
        return ""
    name, version, profile = promotion.model_name, promotion.version, promotion.profile
    scope = f" --profile {profile}" if profile else ""
    steps = [f"Read the model card: <code>adaptbert models card {version}{scope}</code>."]
    if promotion.promoted:
        steps.append(
            f'Serve the champion: <code>mlflow models serve -m "models:/{escape(name)}@champion" --env-manager local '
            "-p 5001</code> (docs/serving.md)."
        )
    else:
        steps.append(
            f"v{version} was not promoted: <code>adaptbert models compare</code> shows it beside the champion; "
            f"<code>adaptbert models promote {version} --force</code> if you accept it anyway."
        )
    if metrics and (significant := metrics.summary.tasks_improved_significantly) is not None:
        unclear = len(metrics.tasks) - significant
        if unclear:
            steps.append(
                f"The gain's CI includes 0 on {unclear} of {len(metrics.tasks)} tasks: more pretraining "
                "(<code>pretrain.max_steps</code> or a time budget), a corpus closer to the tasks "
                "(<code>pretrain.selection</code>, TAPT) or more test examples narrow it (docs/real-data.md)."
            )
    if profile:
        steps.append(
            f"This was a <code>{escape(profile)}</code> run: its versions are in "
            f"<code>{escape(name)}</code>; <code>adaptbert models list{scope}</code> lists them."
        )
    items = "".join(f"<li>{s}</li>" for s in steps)
    return f'<section class="next"><h2>What next</h2><ul>{items}</ul></section>'


def render(
    reports: dict[str, Any],
    dirs: dict[str, Path],
    commit: str,
    execution: dict[str, Any] | None = None,
) -> str:
    """The whole page from the stage reports, keyed by their ``Paths`` attribute (``None`` for a stage that
    has not run; a typed report as its type), the plot folders, and this pipeline execution's MLflow run and stage
    times (None untracked)."""
    body = "".join(
        [
            headline_section(reports["metrics"], reports["promotion_report"], reports["pretrain_report"]),
            run_section(
                execution, reports["promotion_report"], reports["pretrain_report"], reports["compression_report"]
            ),
            data_section(reports["ingest_report"], reports["validation_report"]),
            tokenize_section(reports["tokenize_report"]),
            adaptation_section(reports.get("adapt_report")),
            pretrain_section(reports["pretrain_report"], dirs["pretrain_curves"]),
            evaluation_section(reports["metrics"], dirs["plots"]),
            errors_section(reports.get("errors")),
            search_section(reports.get("search_report")),
            attention_section(dirs["plots"]),
            compression_section(reports["compression_report"], dirs["compression"] / "front.png"),
            registry_section(reports["promotion_report"]),
            next_steps(reports["promotion_report"], reports["metrics"]),
        ]
    )
    made = time.strftime("%Y-%m-%d %H:%M")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>adaptbert run report</title>"
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{STYLE}</style>'
        f"<script>{IMAGE_CHECK}</script></head><body>"
        f"<header><h1>adaptbert run report</h1><p>generated {made} &middot; git {escape(commit[:10])}</p></header>"
        f"<main>{body}</main></body></html>\n"
    )


def dvc_experiments_section(experiments: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The DVC experiments of the commit (``dvc exp show``): headline, the params each set, its MLflow execution."""
    if not experiments:
        return ""
    runs = {r["dvc_exp"]: r["name"] for r in rows if r["dvc_exp"]}
    body = table(
        ["experiment", "created", "adapted", "gain", "served", "params set (vs the commit)", "MLflow run"],
        [
            [
                e["name"],
                e["created"],
                pct(e["adapted"]),
                pct(e["gain"], signed=True),
                e["served"] or "-",
                "; ".join(f"{k} = {v}" for k, v in e["set"].items()) or "-",
                runs.get(e["name"], "-"),
            ]
            for e in experiments
        ],
    )
    return (
        f"<section><h2>DVC experiments of {escape(experiments[0]['commit'])}</h2><p>From <code>dvc exp show</code> "
        "(<code>dvc exp run</code>, e.g. <code>python -m flows.profile NAME --run</code>): each experiment's headline "
        "from its <code>reports/summary.json</code>, the params it set to another value than the commit, and its "
        f"pipeline run above.</p>{body}</section>"
    )


def history_page(
    rows: list[dict[str, Any]],
    differing: list[str],
    timeline: list[dict[str, Any]],
    experiments: list[dict[str, Any]],
    experiment: str,
    model: str,
    ui: str = LOCAL_UI,
) -> str:
    """``reports/history.html``: every pipeline execution of ``experiment`` (newest first) with its headline, the
    params that differ between them, the champion timeline of ``model`` and the DVC experiments of the commit
    (rows from :mod:`pipeline.tracking.history`); runs and versions link to their pages in the MLflow UI at ``ui``."""

    def link(route: str, text: str) -> Markup:
        return Markup(f'<a href="{escape(mlflow_ui_page(route, ui))}">{escape(text)}</a>')

    runs = table(
        ["started", "trigger", "status", "commit", "mean primary (points)", "CI above 0", "served", "run"],
        [
            [
                r["started"],
                r["trigger"] + (f" ({r['profile']})" if r["profile"] else ""),
                r["status"].lower(),
                r["commit"],
                execution_headline(r),
                "-" if r["ci_above_0"] is None else f"{r['ci_above_0']} of {r['tasks']} tasks",
                r["served"] or "-",
                link(f"runs/{r['run_id']}", r["name"]),
            ]
            for r in rows
        ],
    )
    params = (
        table(
            ["param", *(r["started"] for r in rows)], [[k, *(r["params"].get(k, "-") for r in rows)] for k in differing]
        )
        if differing
        else "<p>Every execution listed ran with the same params.</p>"
    )
    moves = (
        table(
            ["champion", "since", "replaced", "how"],
            [
                [
                    link(f"models/{model}/versions/{m['version']}", f"v{m['version']}"),
                    m["at"],
                    link(f"models/{model}/versions/{m['replaced']}", f"v{m['replaced']}") if m["replaced"] else "-",
                    "rollback"
                    if m["rolled_back_from"]
                    else ("forced past the gate" if m["forced"] else "passed the gate"),
                ]
                for m in timeline
            ],
        )
        if timeline
        else "<p>No version has been champion yet.</p>"
    )
    body = (
        f"<section><h2>Pipeline runs</h2><p>Experiment <code>{escape(experiment)}</code>, newest first; gain: mean "
        "primary of the adapted model minus the un-adapted baseline's, in points, with its paired bootstrap CI; CI above 0: tasks whose bootstrap "
        f"CI of the gain lies above 0. Runs and versions link to the MLflow UI at {escape(ui)}"
        + (" (start it with <code>mlflow ui --backend-store-uri sqlite:///mlflow.db</code>)" if ui == LOCAL_UI else "")
        + f".</p>{runs}</section>"
        f"<section><h2>Params that differ</h2>{params}</section>"
        f"<section><h2>Champion timeline of <code>{escape(model)}</code></h2>{moves}</section>"
        f"{dvc_experiments_section(experiments, rows)}"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>adaptbert history</title>'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{STYLE}</style></head><body>'
        f"<header><h1>adaptbert history</h1><p>generated {time.strftime('%Y-%m-%d %H:%M')} from MLflow</p></header>"
        f"<main>{body}</main></body></html>\n"
    )
