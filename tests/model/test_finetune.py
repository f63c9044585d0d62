"""finetune + evaluate on the small demo with a tiny BERT: outputs, early stopping, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from pipeline.core.config import ConfigError
from pipeline.core.errors import DataError, ValidationFailed
from pipeline.core.io import read_report
from pipeline.core.reports.finetune import FinetuneReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.precision import resolve_precision
from pipeline.stages import evaluate, finetune, ingest, validate
from tests.conftest import ROOT, TINY_FINETUNE, TINY_PRETRAIN, copy_project, make_config


def test_finetune_writes_both_models_and_curves(finetuned) -> None:
    _cfg, paths, report, _ = finetuned
    for model_dir in (paths.finetuned, paths.baseline):
        for f in (
            "encoder/config.json",
            "encoder/model.safetensors",
            "heads.safetensors",
            "tasks.json",
            "tokenizer.json",
            "README.md",
        ):
            assert (model_dir / f).exists(), model_dir / f
    tasks = json.loads((paths.finetuned / "tasks.json").read_text())
    assert {t["name"]: t["type"] for t in tasks} == {
        "ner": "token_classification",
        "pair": "pair_classification",
        "qa": "extractive_qa",
        "role": "sequence_classification",
    }
    # the baseline keeps the base vocab; the adapted model has the mined domain tokens
    assert report.baseline is not None and report.adapted.vocab_size > report.baseline.vocab_size
    for name, model in (("adapted", report.adapted), ("baseline", report.baseline)):
        assert model.steps == 30 and model.best_step in (10, 20, 30)
        train_rows = (paths.finetune_curves / name / "train.csv").read_text().splitlines()
        assert train_rows[0] == "step,loss,learning_rate,grad_norm"
        dev_rows = (paths.finetune_curves / name / "dev.csv").read_text().splitlines()
        assert dev_rows[0].startswith("step,eval_mean_primary,eval_ner_f1")
        assert [r.split(",")[0] for r in dev_rows[1:]] == ["10", "20", "30"]  # dev evaluations, no empty cells


def test_evaluate_report_is_complete_and_consistent(finetuned) -> None:
    _cfg, paths, _, _ = finetuned
    on_disk = json.loads(paths.metrics.read_text())
    assert on_disk["tasks"].keys() == {"ner", "pair", "qa", "role"}
    for name, t in on_disk["tasks"].items():
        for model in ("adapted", "baseline", "trivial"):
            values = [v for v in t[model].values() if isinstance(v, float)]
            assert values and all(0.0 <= v <= 1.0 for v in values), (name, model)
        assert t["ci_low"] <= t["delta"] <= t["ci_high"]
        assert t["delta"] == pytest.approx(t["adapted"][t["primary"]] - t["baseline"][t["primary"]], abs=1e-4)
    assert set(on_disk["tasks"]["ner"]["adapted"]["per_type"]) == {"DISEASE", "DOSE", "DRUG", "TARGET"}
    s = on_disk["summary"]
    assert s["perplexity_base"] > 0 and s["perplexity_adapted"] > 0
    assert s["mean_primary_delta"] == pytest.approx(s["mean_primary_adapted"] - s["mean_primary_baseline"], abs=1e-4)
    md = paths.evaluation.read_text()
    assert "| role | sequence_classification | macro_f1 |" in md and "entities by type" in md
    for png in ("confusion_role.png", "confusion_pair.png", "entity_f1_ner.png", "learning_curves.png"):
        assert (paths.plots / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"plots/{png}" in md


def test_attention_views_show_both_models_on_a_short_test_example(finetuned) -> None:
    import numpy as np
    from PIL import Image

    _cfg, paths, _, _ = finetuned
    for task in ("ner", "pair", "qa", "role"):
        png = paths.plots / f"attention_{task}_1.png"
        pixels = np.asarray(Image.open(png).convert("L"))
        # the two models side by side in the first row: 2:1 alone, 1:1 with their difference below (two panels a
        # row keep the token labels legible at the page's width)
        assert pixels.shape[1] in (2 * pixels.shape[0], pixels.shape[0]) or pixels.shape[1] >= 2 * pixels.shape[0]
        assert pixels.std() > 20, task  # drawn heatmaps, not a blank canvas


def test_attention_map_rows_are_distributions_and_bad_layers_are_named(finetuned) -> None:
    import numpy as np

    from pipeline.core.config import ConfigError
    from pipeline.reporting.attention import attention_map
    from pipeline.training.multitask import load_multitask

    _cfg, paths, _, _ = finetuned
    model, tok = load_multitask(paths.finetuned)
    ids = tok("the drug lowered blood pressure")["input_ids"]
    last = attention_map(model, ids, None, -1, None)
    first_head = attention_map(model, ids, None, 0, 0)
    assert last.shape == first_head.shape == (len(ids), len(ids))
    assert np.allclose(last.sum(1), 1.0, atol=1e-4) and np.allclose(first_head.sum(1), 1.0, atol=1e-4)
    assert model.encoder.config._attn_implementation == "sdpa"  # put back after drawing
    with pytest.raises(ConfigError, match=r"evaluate\.attention_layer: 7 is not a layer of a 2-layer encoder"):
        attention_map(model, ids, None, 7, None)
    with pytest.raises(ConfigError, match=r"evaluate\.attention_head: 5 is not a head of a layer with 2 heads"):
        attention_map(model, ids, None, -1, 5)


def test_saved_model_reproduces_the_reported_metrics(finetuned) -> None:
    """What is saved is what was evaluated: reload, re-score, same numbers."""
    cfg, paths, _, metrics = finetuned
    from pipeline.training.multitask import load_multitask, score_task

    model, tok = load_multitask(paths.finetuned)
    tasks = finetune.load_tasks(cfg, paths, paths.task_features)
    for name in ("role", "ner"):
        tasks[name].spec = model.specs[name]
        scored = score_task(model, tasks[name], "test", tok.pad_token_id, 32, resolve_precision("auto"))
        assert scored.primary(tasks[name].spec) == pytest.approx(
            metrics.tasks[name].adapted[tasks[name].spec.primary], abs=1e-4
        )


def test_rerun_after_a_finished_run_resumes_without_training(finetuned, tmp_path: Path) -> None:
    cfg, src, report, _ = finetuned
    paths = copy_project(src, tmp_path)
    again = finetune.run(cfg, paths)
    assert again.adapted.resumed_from == "checkpoint-30"
    assert again.adapted.best_dev_mean_primary == report.adapted.best_dev_mean_primary
    again_heads, first_heads = (
        load_file(paths.finetuned / "heads.safetensors"),
        load_file(src.finetuned / "heads.safetensors"),
    )
    assert again_heads.keys() == first_heads.keys()
    assert all((again_heads[k] == first_heads[k]).all() for k in first_heads)  # the best weights, not a new training


def test_early_stopping_restores_the_best_checkpoint(
    pretrained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripted dev scores: best at the 2nd evaluation, then worse twice -> stop (patience 2), keep step 10."""
    _, src = pretrained
    paths = copy_project(src, tmp_path)
    cfg = make_config(
        **TINY_PRETRAIN,
        **{
            **TINY_FINETUNE,
            "finetune.baseline": False,
            "finetune.max_steps": 60,
            "finetune.eval_steps": 5,
            "finetune.early_stopping_patience": 2,
        },
    )
    script = iter([0.2, 0.6, 0.4, 0.3, 0.9, 0.9])
    from pipeline.training import trainer as training

    real = training.dev_scores

    def scripted(model, tasks, pad_id, batch_size, precision):
        scores = real(model, tasks, pad_id, batch_size, precision)
        return {**scores, "mean_primary": next(script)}

    monkeypatch.setattr(training, "dev_scores", scripted)
    report = finetune.run(cfg, paths).adapted
    assert report.steps == 20 and report.stopped_early
    assert report.best_step == 10 and report.best_dev_mean_primary == 0.6
    best = load_file(paths.finetune_checkpoints / "adapted" / "checkpoint-10" / "model.safetensors")
    saved = load_file(paths.finetuned / "heads.safetensors")
    for key, value in saved.items():
        assert (best[f"heads.{key}"] == value).all(), key
    last = load_file(paths.finetune_checkpoints / "adapted" / "checkpoint-20" / "model.safetensors")
    assert any((last[f"heads.{k}"] != v).any() for k, v in saved.items())  # training went on, and was rolled back
    # run again (dvc repro -f): the run had stopped early, so its best weights are restored and nothing is trained
    # (was: it resumed from checkpoint-20 and trained on past the stop, a different model from the same inputs)
    again = finetune.run(cfg, paths).adapted
    assert again.resumed_from == "checkpoint-20" and again.steps == 20 and again.stopped_early
    assert again.best_step == 10 and again.best_dev_mean_primary == 0.6
    assert next(script) == 0.9  # no evaluation ran: the scripted scores were not read
    restored = load_file(paths.finetuned / "heads.safetensors")
    assert all((restored[k] == v).all() for k, v in saved.items())
    reported = json.loads(paths.finetune_report.read_text())  # the versioned report does not say what was resumed
    assert "resumed_from" not in reported["adapted"] and read_report(paths.finetune_report)["adapted"]["resumed_from"]


# ----------------------------------------------------------------------------- bad input


def test_resuming_with_a_changed_label_count_names_the_head(finetuned, tmp_path: Path) -> None:
    cfg, src, _, _ = finetuned
    paths = copy_project(src, tmp_path)
    index = paths.task_features / "tasks.json"
    metas = json.loads(index.read_text())
    next(m for m in metas if m["name"] == "role")["labels"].append("DISCUSSION")
    index.write_text(json.dumps(metas))
    before = (paths.finetuned / "heads.safetensors").read_bytes()
    with pytest.raises(
        DataError,
        match=r"\[head-mismatch\] cannot resume from checkpoint-30: its head for task 'role' has 5 labels "
        r"but the task now has 6",
    ):
        finetune.run(cfg, paths)
    assert (paths.finetuned / "heads.safetensors").read_bytes() == before  # nothing replaced


def test_evaluate_refuses_a_model_whose_heads_do_not_fit_the_data(finetuned, tmp_path: Path) -> None:
    cfg, src, _, _ = finetuned
    paths = copy_project(src, tmp_path)
    index = paths.task_features / "tasks.json"
    metas = json.loads(index.read_text())
    next(m for m in metas if m["name"] == "pair")["labels"].reverse()
    index.write_text(json.dumps(metas))
    with pytest.raises(DataError, match=r"tasks.json: \[head-mismatch\] task 'pair': the model has labels"):
        evaluate.run(cfg, paths)


def test_empty_split_is_named(finetuned, tmp_path: Path) -> None:
    cfg, src, _, _ = finetuned
    paths = copy_project(src, tmp_path)
    empty = paths.task_features / "role" / "test.arrow"
    table = pa.table({"input_ids": pa.array([], pa.list_(pa.int32()))})
    with pa.OSFile(str(empty), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(DataError, match=r"role/test.arrow: \[empty-split\] task 'role' has no test examples"):
        finetune.run(cfg, paths)


def test_unknown_task_type_lists_the_known_types(finetuned, tmp_path: Path) -> None:
    cfg, src, _, _ = finetuned
    paths = copy_project(src, tmp_path)
    index = paths.task_features / "tasks.json"
    metas = json.loads(index.read_text())
    metas[0]["type"] = "summarization"
    index.write_text(json.dumps(metas))
    with pytest.raises(
        DataError, match=r"\[unknown-task-type\] unknown task type 'summarization'; known types: \['extractive_qa', "
    ):
        finetune.run(cfg, paths)
    with pytest.raises(
        ConfigError,
        match=r"ingest.tasks\[0\].type: got 'summarization'; expected: .*'extractive_qa'.*'sequence_classification'",
    ):
        make_config(
            **{
                "ingest.tasks": [
                    {"name": "x", "type": "summarization", "files": {"train": "a", "validation": "b", "test": "c"}}
                ]
            }
        )


def test_finetune_settings_for_an_undeclared_task_or_a_wrong_metric_fail() -> None:
    with pytest.raises(ConfigError, match=r"finetune.tasks.rol: no task 'rol' is declared in ingest.tasks"):
        make_config(**{"finetune.tasks": {"rol": {"pooling": "mean"}}})
    with pytest.raises(
        ConfigError, match=r"finetune.tasks.ner.metric: 'macro_f1' is not a metric of token_classification"
    ):
        make_config(**{"finetune.tasks": {"ner": {"metric": "macro_f1"}}})


@pytest.mark.parametrize(
    ("task", "edit", "expected"),
    [
        (
            "role",
            lambda line: line.rsplit(",", 1)[0] + ",DISCUSSION",
            r"(?s)labels within the label set .*\"label\": \"DISCUSSION\"",
        ),
        ("ner", None, r"(?s)tags within the tag set .*B-GENE"),
    ],
)
def test_dev_labels_missing_from_the_train_label_map_are_named(project, task: str, edit, expected: str) -> None:
    cfg, paths = project
    if task == "role":
        f = paths.demo / "tasks" / "role" / "validation.csv"
        lines = f.read_text().splitlines()
        lines[2] = edit(lines[2])  # line 3 of the file
        f.write_text("\n".join(lines) + "\n")
        where = "validation.csv:3"
    else:
        f = paths.demo / "tasks" / "ner" / "validation.conll"
        lines = f.read_text().splitlines()
        lines[0] = lines[0].split()[0] + " B-GENE"
        f.write_text("\n".join(lines) + "\n")
        where = "validation.conll:1"
    ingest.run(cfg, paths)
    with pytest.raises(ValidationFailed, match=expected) as err:
        validate.run(cfg, paths)
    assert where in str(err.value)


def test_finetune_without_baseline_writes_a_placeholder(pretrained, tmp_path: Path) -> None:
    _, src = pretrained
    paths = copy_project(src, tmp_path)
    cfg = make_config(**TINY_PRETRAIN, **{**TINY_FINETUNE, "finetune.max_steps": 10, "finetune.baseline": False})
    report = finetune.run(cfg, paths)
    assert "baseline" not in report and "finetune.baseline is false" in (paths.baseline / "README.md").read_text()
    metrics = evaluate.run(cfg, paths)
    role = metrics.as_json()["tasks"]["role"]
    assert "baseline" not in role and "delta" not in role and not metrics.has_baseline
    assert (
        "mean_primary_baseline" not in metrics.as_json()["summary"] and "| delta |" not in paths.evaluation.read_text()
    )


def test_single_task_runs_are_reported_next_to_the_multi_task_model(pretrained, tmp_path: Path) -> None:
    _, src = pretrained
    paths = copy_project(src, tmp_path)
    cfg = make_config(
        **TINY_PRETRAIN,
        **{**TINY_FINETUNE, "finetune.max_steps": 10, "finetune.baseline": False, "finetune.single_task": True},
    )
    report = finetune.run(cfg, paths)
    assert report.single_task is not None and set(report.single_task) == {"ner", "pair", "qa", "role"}
    for name, run in report.single_task.items():
        assert run.steps == 10 and 0.0 <= run.test[run.primary] <= 1.0, name
        assert (paths.finetune_checkpoints / f"single-{name}").is_dir()
    metrics = evaluate.run(cfg, paths)
    assert metrics.single_task is not None
    assert metrics.single_task["role"].test == pytest.approx(report.single_task["role"].test, abs=1e-4)
    assert "## Multi-task vs single-task" in paths.evaluation.read_text()


def test_same_compute_gives_the_baseline_the_pretraining_time_as_extra_steps(pretrained, tmp_path: Path) -> None:
    _, src = pretrained
    paths = copy_project(src, tmp_path)
    settings = {**TINY_PRETRAIN, **TINY_FINETUNE, "finetune.early_stopping_patience": 1000}
    cfg = make_config(**settings, **{"finetune.baseline_budget": "same_compute"})
    report = finetune.run(cfg, paths)
    budget, adapted, baseline = report.baseline_budget, report.adapted, report.baseline
    assert budget is not None and baseline is not None and adapted.train_seconds
    pre_seconds = read_report(paths.pretrain_report, PretrainReport).train_seconds
    assert pre_seconds is not None and budget.mode == "same_compute" and budget.pretrain_seconds == pre_seconds
    assert budget.adapted_steps_per_s == round(adapted.steps / adapted.train_seconds, 3)
    assert budget.extra_steps == round(pre_seconds * adapted.steps / adapted.train_seconds) > 0
    assert adapted.steps == cfg.finetune.max_steps
    assert baseline.steps == cfg.finetune.max_steps + budget.extra_steps
    metrics = evaluate.run(cfg, paths)
    assert metrics.verdict and f"given that time as {budget.extra_steps} more fine-tuning steps" in metrics.verdict[0]
    assert "**Verdict.**" in paths.evaluation.read_text()
    assert "pretraining took" in evaluate.summary(metrics, cfg, paths)
    # the default leaves the report as it was, and the verdict says what the baseline was not given
    same = make_config(**settings)
    assert "baseline_budget" not in finetune.run(same, copy_project(src, tmp_path / "steps")).as_json()
    assert same.finetune.baseline_budget == "same_steps"
    with pytest.raises(ConfigError, match=r"finetune\.baseline_budget"):
        make_config(**{"finetune.baseline_budget": "same_time"})


def test_the_verdict_names_each_model_s_steps_when_search_chose_them() -> None:
    """With search on, each model trains with the budget its dev split chose: the sentence must not say
    'the same fine-tuning steps' (a zh run compared 439 adapted steps with 1,436 baseline ones)."""
    from pipeline.core.reports.evaluation import EvaluationSummary, TaskEvaluation
    from pipeline.stages.evaluate import verdict

    t = {"type": "sequence_classification", "primary": "macro_f1", "test_examples": 10, "trivial_baseline": "-"}
    scores = {"trivial": {"macro_f1": 0.1}, "adapted": {"macro_f1": 0.168}, "baseline": {"macro_f1": 0.268}}
    gain = {"primary_ci": {}, "delta": -0.1, "ci_low": -0.15, "ci_high": -0.05}
    results = {"t": TaskEvaluation.model_validate({**t, **scores, **gain})}
    summary = EvaluationSummary(
        mean_primary_adapted=0.168,
        mean_primary_delta=-0.1,
        mean_primary_baseline=0.268,
        tasks_improved_significantly=0,
        perplexity_base=None,
        perplexity_adapted=None,
    )
    committed = read_report(ROOT / "reports" / "pretrain.json", PretrainReport)
    pre = committed.model_copy(update={"global_step": 200, "tokens_seen": 409556, "task_text_blocks": 0})
    fine = read_report(ROOT / "reports" / "finetune.json", FinetuneReport)
    assert fine.baseline is not None

    def trained(adapted: int, baseline: int, **more: object) -> FinetuneReport:
        steps = {"adapted": fine.adapted.model_copy(update={"steps": adapted})}
        return fine.model_copy(
            update={**steps, "baseline": fine.baseline.model_copy(update={"steps": baseline}), **more}
        )

    plain = trained(600, 600)
    assert "with the same fine-tuning steps" in " ".join(verdict(results, summary, pre, plain) or [])
    searched = trained(439, 1436, search={"adapted": {}, "baseline": {}})
    said = " ".join(verdict(results, summary, pre, searched) or [])
    assert "same fine-tuning steps" not in said
    assert "reached 26.8 with settings chosen on its own dev split (1436 steps; the adapted model 439)" in said


def test_a_run_that_dies_mid_training_leaves_the_last_good_curves(
    finetuned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Curves are logged beside the checkpoints and swapped in by the commit: pretraining or fine-tuning that dies
    after logging some rows (here: the third row raises) leaves reports/pretrain and reports/finetune as they were."""
    from pipeline.stages import pretrain
    from pipeline.training import callbacks

    _, src, *_ = finetuned
    paths = copy_project(src, tmp_path)
    good = {p: p.read_bytes() for d in (paths.pretrain_curves, paths.finetune_curves) for p in d.rglob("*.csv")}
    assert len(good) >= 4
    original, rows = callbacks.append_row, []

    def dies_on_the_third_row(path: Path, header: list[str], row: list) -> None:
        original(path, header, row)
        rows.append(row)
        if len(rows) % 3 == 0:
            raise RuntimeError("killed while training")

    monkeypatch.setattr(callbacks, "append_row", dies_on_the_third_row)
    changed = make_config(
        **{**TINY_PRETRAIN, **TINY_FINETUNE, "pretrain.max_steps": 7, "finetune.max_steps": 31},
        **{"finetune.side_by_side": "never"},  # the patch lives in this process: no model may train in another
    )
    for stage in (pretrain, finetune):
        with pytest.raises(RuntimeError, match="killed while training"):
            stage.run(changed, paths)
    now = {p: p.read_bytes() for d in (paths.pretrain_curves, paths.finetune_curves) for p in d.rglob("*.csv")}
    assert now == good
    assert (
        paths.pretrain_curves_in_progress / "train.csv"
    ).exists()  # what the dead run logged, beside its checkpoints


def test_training_runs_with_the_heap_frozen_and_unfreezes_it_even_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Trainer.train`` opens with a full ``gc.collect()`` (Accelerate's ``free_memory``): both trainers run it with
    what was alive before frozen out of the collector's sweeps, and give it back afterwards, also when training fails;
    on a CPU the loop trains with eager attention and NumPy-drawn dropout, and the model gets its own kernel and
    dropout modules back after it."""
    import gc

    from transformers import BertConfig, BertModel, Trainer

    from pipeline.modelling.dropout import CpuDropout
    from pipeline.modelling.precision import EAGER_CPU_DROPOUT, Precision
    from pipeline.training.callbacks import frozen_heap
    from pipeline.training.trainer import fit

    seen: list[int] = []
    kernels: list[str] = []
    dropouts: list[int] = []

    def train(self, resume_from_checkpoint=None):
        seen.append(gc.get_freeze_count())
        kernels.append(self.model.config._attn_implementation)
        dropouts.append(sum(isinstance(m, CpuDropout) for m in self.model.modules()))
        raise RuntimeError("boom")

    monkeypatch.setattr(Trainer, "train", train)
    trainer = Trainer.__new__(Trainer)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    trainer.model = BertModel(config)
    trainer.model.set_attn_implementation("sdpa")
    trainer.precision = Precision("bf16", "cpu", "test")  # training on a CPU: eager attention, then restored
    with pytest.raises(RuntimeError, match="boom"):
        fit(trainer, None, {"global_step": 0}, Path("unused"), max_steps=10)
    assert seen and seen[0] > 10_000  # torch's and transformers' objects among them
    assert gc.get_freeze_count() == 0
    assert kernels == [EAGER_CPU_DROPOUT] and trainer.model.config._attn_implementation == "sdpa"
    assert dropouts == [4]  # embeddings, attention probabilities (the module holding p), two hidden dropouts
    assert not any(isinstance(m, CpuDropout) for m in trainer.model.modules())
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(
    ("mode", "device", "models", "sequential", "threads", "expected"),
    [
        ("auto", "cpu", 2, False, 2, 1),  # the default run on 2 cores: two processes of one thread
        ("auto", "cpu", 2, False, 16, 8),
        ("auto", "cpu", 2, False, 1, None),  # one thread (a test worker, a 1-core machine): one after the other
        ("always", "cpu", 2, False, 1, 1),
        ("auto", "cpu", 1, False, 2, None),  # no baseline: nothing to train beside
        ("auto", "cpu", 2, True, 2, None),  # same_compute: the baseline's budget needs the adapted run's speed
        ("auto", "cuda", 2, False, 16, None),  # one GPU: its models train one after the other
        ("never", "cpu", 2, False, 2, None),
    ],
)
def test_side_by_side_rule(mode, device, models, sequential, threads, expected) -> None:
    from pipeline.training.side_by_side import side_by_side_threads

    assert side_by_side_threads(mode, device, models, sequential, threads) == expected


def test_side_by_side_trains_the_same_models_as_one_after_the_other(pretrained, tmp_path: Path, capfd) -> None:
    """With the same threads per model, the two processes give the weights the sequential loop gives, bit for bit;
    the report says how they trained and each model's progress lines name it; the children exit on their own (a
    SIGTERM in their clean-up printed "Exception ignored in ... Terminated" into the stage's output)."""
    _, src = pretrained
    settings = {**TINY_PRETRAIN, **TINY_FINETUNE, "finetune.max_steps": 10}
    seq_paths, par_paths = copy_project(src, tmp_path / "seq"), copy_project(src, tmp_path / "par")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a test worker: one thread here, so one per child process too
    try:
        sequential = finetune.run(make_config(**settings, **{"finetune.side_by_side": "never"}), seq_paths)
        capfd.readouterr()
        parallel = finetune.run(make_config(**settings, **{"finetune.side_by_side": "always"}), par_paths)
    finally:
        torch.set_num_threads(threads)
    printed = capfd.readouterr()
    assert "Exception ignored" not in printed.err and "Terminated" not in printed.err, printed.err[-2000:]
    assert "finetune adapted:" in printed.err + printed.out  # the children's lines were captured
    assert sequential.side_by_side is None and parallel.side_by_side is not None
    assert parallel.side_by_side.as_json() == {"processes": 2, "threads_each": 1}
    cfg = make_config(**settings)
    assert "trained side by side: 2 processes of 1 thread(s) each" in finetune.summary(parallel, cfg, par_paths)
    for name, folder in (("adapted", "finetuned"), ("baseline", "baseline")):
        one, other = parallel.model(name), sequential.model(name)
        assert one is not None and other is not None and one.steps == other.steps == 10
        assert one.best_dev_mean_primary == other.best_dev_mean_primary
        for weights in ("heads.safetensors", "encoder/model.safetensors"):
            a, b = (
                load_file(str(seq_paths.root / "models" / folder / weights)),
                load_file(str(par_paths.root / "models" / folder / weights)),
            )
            assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), (name, weights)
        assert (par_paths.finetune_curves / name / "dev.csv").read_text() == (
            seq_paths.finetune_curves / name / "dev.csv"
        ).read_text()
    assert not list((par_paths.root / ".adaptbert").glob("finetune-side-by-side-*"))  # its hand-over folder is gone


def test_side_by_side_raises_a_child_s_error_as_itself_and_replaces_nothing(finetuned, tmp_path: Path) -> None:
    _, src, _, _ = finetuned
    paths = copy_project(src, tmp_path)
    index = paths.task_features / "tasks.json"
    metas = json.loads(index.read_text())
    next(m for m in metas if m["name"] == "role")["labels"].append("DISCUSSION")  # the checkpoints' heads no longer fit
    index.write_text(json.dumps(metas))
    before = (paths.finetuned / "heads.safetensors").read_bytes()
    cfg = make_config(**TINY_PRETRAIN, **{**TINY_FINETUNE, "finetune.side_by_side": "always"})
    with pytest.raises(
        DataError, match=r"\[head-mismatch\] cannot resume from checkpoint-30: its head for task 'role'"
    ):
        finetune.run(cfg, paths)  # raised in a child process, re-raised here with its file, rule and message
    assert (paths.finetuned / "heads.safetensors").read_bytes() == before
    assert not list((paths.root / ".adaptbert").glob("finetune-side-by-side-*"))


def test_a_side_by_side_process_that_dies_without_a_word_is_named_as_an_environment_failure() -> None:
    import multiprocessing
    import os

    from pipeline.core.errors import EXIT_ENVIRONMENT, WorkersFailed
    from pipeline.training.side_by_side import collect

    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=os._exit, args=(9,))  # as a kill or the OOM killer would end it: nothing sent
    proc.start()
    writer.close()
    with pytest.raises(WorkersFailed, match=r"the baseline model ended without a result \(exit code 9\)") as err:
        collect({reader: ("baseline", proc, Path("unused"))})
    assert err.value.exit_code == EXIT_ENVIRONMENT
