"""adapt: the adaptation chosen on the dev splits by a tournament of arms at equal minutes, read by pretrain."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.core.config import ConfigError, load_config
from pipeline.core.errors import DataError
from pipeline.core.io import read_report, write_json
from pipeline.core.reports.adapt import AdaptReport
from pipeline.stages import adapt, pretrain
from pipeline.training import tournament
from pipeline.training.adaptation import CHOSEN_FILE, choice_digest, chosen_adaptation
from tests.conftest import ROOT, TINY_FINETUNE, TINY_PRETRAIN, copy_project, make_config

# a tournament in seconds: 2 s of masked-LM per adaptation arm in the first rung, 4 in the second (it continues the
# first's model), 12 / 24 fine-tuning steps; checkpoints rarely (the tiny model takes thousands of steps a minute)
AUTO: dict[str, Any] = {
    **TINY_PRETRAIN,
    **TINY_FINETUNE,
    "pretrain.save_steps": 500,
    "pretrain.eval_steps": 500,
    "adapt.strategy": "auto",
    "adapt.arms": ["none", "dapt", "contrastive"],  # tapt and dapt+tapt: pretrain settings, tested with pretrain below
    "adapt.budget_minutes": 5,
    "adapt.first_rung": {"pretrain_minutes": 0.03, "finetune_steps": 12},
    "adapt.rungs": 2,
    "adapt.keep": 0.5,
}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"adapt.budget_minutes": 2},
            r"adapt: .*budget_minutes \(2\) is below the adaptation minutes alone .* \(6\.00 min",
        ),
        ({"adapt.arms": ["none", "dapt", "dapt"]}, r"adapt\.arms: .*each arm once"),
        ({"adapt.arms": ["dapt", "tapt"]}, r"adapt\.arms: .*'none' must be an arm"),
        ({"adapt.arms": ["none", "electra"]}, r"adapt\.arms\[1\]: got .electra.; expected: .*.none., .dapt."),
        ({"adapt.rungs": 0}, r"adapt\.rungs"),
        ({"adapt.keep": 1}, r"adapt\.keep"),
        ({"adapt.first_rung": {"pretrain_minutes": 0, "finetune_steps": 100}}, r"adapt\.first_rung\.pretrain_minutes"),
        (
            {
                "adapt.arms": ["none", "nearest+tapt"],
                **{"pretrain.sentence_objective": "sop", "pretrain.masking": "token", "tokenize.sentence_pairs": True},
            },
            r"adapt\.arms: nearest\+tapt trains on selected masked-LM blocks, .*sentence_objective: sop",
        ),
    ],
)
def test_bad_adapt_settings_name_the_key(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(ROOT / "params.yaml", {"adapt.strategy": "auto", **overrides})


def test_a_schedule_over_budget_is_refused_only_when_the_tournament_runs() -> None:
    load_config(ROOT / "params.yaml", {"adapt.budget_minutes": 2})  # strategy fixed: the budget is not spent


def test_successive_halving_keeps_the_better_half_and_doubles_their_budgets() -> None:
    ac = make_config(**{"adapt.arms": ["none", "dapt", "tapt", "dapt+tapt"], "adapt.rungs": 3}).adapt
    assert ac.survivors() == [3, 2, 1]  # adaptation arms per rung; none runs in every rung besides them
    assert [ac.rung_pretrain_minutes(r) for r in range(3)] == [1.0, 2.0, 4.0]
    # by default the last rung fine-tunes what finetune will (600 steps here), the earlier ones keep x the next
    assert [ac.rung_finetune_steps(r, 600) for r in range(3)] == [150, 300, 600]
    fixed = make_config(**{"adapt.rungs": 3, "adapt.first_rung": {"pretrain_minutes": 1, "finetune_steps": 100}})
    assert [fixed.adapt.rung_finetune_steps(r, 600) for r in range(3)] == [100, 200, 400]
    assert ac.planned_pretrain_minutes() == pytest.approx(3 * 1 + 2 * 1 + 1 * 2)  # each rung extends the last


def test_tapt_trains_on_the_tasks_text_alone() -> None:
    with pytest.raises(ConfigError, match="corpus_text and task_text are both false"):
        make_config(**{"pretrain.corpus_text": False, "pretrain.task_text": False})
    with pytest.raises(ConfigError, match=r"corpus_text: false .* selection\.mode: nearest"):
        make_config(**{"pretrain.corpus_text": False, "pretrain.task_text": True, "pretrain.selection.mode": "nearest"})
    with pytest.raises(ConfigError, match=r"objective: simcse trains single texts in one process"):
        make_config(**{"pretrain.objective": "simcse", "pretrain.nproc": 2})


def test_simcse_pairs_each_text_with_its_own_second_view() -> None:
    """With dropout off the two views are equal: the diagonal is the positive, so the loss is far below chance
    (log n); pairing a text with another text's view instead (labels shifted) gives a loss above it."""
    import math

    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertModel

    from pipeline.training.contrastive import mean_pooled, simcse_loss

    torch.manual_seed(0)
    encoder = BertModel(
        BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).eval()
    ids = torch.randint(5, 50, (8, 12))
    mask = torch.ones_like(ids)
    assert simcse_loss(encoder, ids, mask, 0.05) < 0.5 * math.log(8)
    pooled = mean_pooled(encoder, ids, mask)
    similarity = F.cosine_similarity(pooled.unsqueeze(1), pooled.unsqueeze(0), dim=-1) / 0.05
    assert F.cross_entropy(similarity, torch.arange(8).roll(1)) > math.log(8)


def test_a_contrastive_run_trains_the_encoder_and_reports_like_dapt(ready) -> None:
    from pipeline.training.multitask import load_encoder

    cfg = make_config(**{**TINY_PRETRAIN, "pretrain.objective": "simcse", "pretrain.max_steps": 3})
    report = pretrain.run(cfg, ready)
    assert report.objective == "simcse" and report.global_step == 3 and report.tokens_seen > 0
    assert report.adapted_perplexity != report.base_perplexity  # the encoder under the head moved
    assert load_encoder(ready.dapt).config.hidden_size == 32
    assert "SimCSE" in (ready.dapt / "README.md").read_text() and ready.pretrain_checkpoints.is_dir()


@pytest.fixture(scope="module")
def played(tokenized_demo, tmp_path_factory):
    """The adapt stage's tournament on the tiny project, once."""
    paths = copy_project(tokenized_demo, tmp_path_factory.mktemp("adapt"))
    cfg = make_config(**AUTO)
    return cfg, paths, adapt.run(cfg, paths)


def test_the_tournament_plays_every_arm_then_the_better_half_against_none_at_equal_minutes(played) -> None:
    cfg, paths, report = played
    assert report.rungs is not None and report.dev_delta is not None and report.reason is not None
    first, second = report.rungs
    assert set(first.arms) == {"none", "dapt", "contrastive"}
    assert set(second.arms) == {*first.kept, "none"} and len(first.kept) == 1
    ranked = sorted((a for a in first.arms if a != "none"), key=lambda a: -first.arms[a].dev_mean)
    assert first.kept == ranked[:1]  # the better half on dev
    assert (second.pretrain_minutes, second.finetune_steps) == (0.06, 24)
    for rung in (first, second):
        none = rung.arms["none"]
        adapting = [e for a, e in rung.arms.items() if a != "none"]
        # none fine-tunes longer by the adaptation minutes, at the speed measured on the others
        assert none.extra_steps is not None and none.extra_steps > 0
        assert none.runs[0].finetune_steps == rung.finetune_steps + none.extra_steps
        assert all(e.runs[0].finetune_steps == rung.finetune_steps for e in adapting)
        assert all((e.pretrain_seconds or 0) > 0 for e in adapting)
        for e in rung.arms.values():
            assert set(e.dev) == {"role", "pair", "ner", "qa"} and 0 <= e.dev_mean <= 1
    # a later rung continues its arm's model: its pretraining seconds add up
    for arm in first.kept:
        assert (second.arms[arm].pretrain_seconds or 0) > (first.arms[arm].pretrain_seconds or 0)
    arms = second.arms
    best = max((a for a in arms if a != "none"), key=lambda a: arms[a].dev_mean)
    assert report.chosen == (best if arms[best].dev_mean > arms["none"].dev_mean else "none")
    d = report.dev_delta
    assert d.low <= d.delta <= d.high
    assert d.delta == pytest.approx(arms[best].dev_mean - arms["none"].dev_mean, abs=1e-5)
    chosen = read_report(paths.adapt / CHOSEN_FILE)
    assert chosen["arm"] == report.chosen and chosen["digest"] == choice_digest(cfg, paths)
    assert "at equal minutes" in report.reason
    # what was written reads back as the same report (its measured half merged back)
    assert read_report(paths.adapt_report, AdaptReport) == report
    assert "adapt.strategy" not in adapt.summary(report, cfg, paths) and "chosen:" in adapt.summary(report, cfg, paths)


def test_a_killed_tournament_resumes_from_its_finished_arms(played, monkeypatch) -> None:
    cfg, paths, report = played

    def no_training(*args, **kwargs):
        raise AssertionError("a finished arm was trained again")

    monkeypatch.setattr(tournament, "finetune_arm", no_training)
    monkeypatch.setattr("pipeline.training.pretraining.run.run_pretraining", no_training)
    again = adapt.run(cfg, paths)
    assert again.rungs is not None and report.rungs is not None and again.digest is not None
    assert again.chosen == report.chosen and again.rungs[1].arms.keys() == report.rungs[1].arms.keys()
    # a result damaged on disk is trained again, not trusted
    result = tournament.Arena(cfg, paths, paths.adapt_checkpoints / again.digest, None).folder("none", 1)
    file = result / "seed-13" / "result.json"
    whole = file.read_text()
    assert tournament.finished_result(file) is not None
    file.write_text(whole[: len(whole) // 2])
    assert tournament.finished_result(file) is None
    file.write_text(whole)
    (result / "seed-13" / "dev_stats.npz").write_bytes(b"garbage")
    assert tournament.finished_result(file) is None
    # a changed setting is another tournament (another work folder), not a resume
    other = make_config(**{**AUTO, "finetune.learning_rate": 5e-4})
    assert tournament.tournament_digest(other, paths) != tournament.tournament_digest(cfg, paths)
    assert choice_digest(other, paths) == choice_digest(cfg, paths)  # pretrain's check: fine-tuning is not its concern


def test_pretrain_trains_the_chosen_arm_and_refuses_a_stale_choice(played, tmp_path) -> None:
    cfg, src, _ = played
    paths = copy_project(src, tmp_path)
    record = read_report(paths.adapt / CHOSEN_FILE)
    write_json(paths.adapt / CHOSEN_FILE, {**record, "arm": "tapt", "settings": {}})
    run_cfg, arm = chosen_adaptation(cfg, paths)
    assert arm.name == "tapt" and not run_cfg.pretrain.corpus_text and run_cfg.pretrain.task_text
    report = pretrain.run(cfg, paths)
    assert report.global_step == cfg.pretrain.max_steps
    assert report.train_blocks == report.task_text_blocks > 0  # the tasks' text alone

    write_json(paths.adapt / CHOSEN_FILE, {**record, "arm": "none", "reason": "fine-tuning alone won on dev"})
    report = pretrain.run(cfg, paths)
    assert report.global_step == 0 and report.adapted_perplexity == report.base_perplexity
    assert (paths.dapt / "model.safetensors").exists() and "no adaptation" in pretrain.summary(report, cfg, paths)
    assert paths.pretrain_checkpoints.is_dir() and paths.pretrain_curves.is_dir()  # declared outputs DVC checks

    stale = make_config(**{**AUTO, "pretrain.learning_rate": 7e-4})
    with pytest.raises(DataError, match=r"chosen.json: \[stale-adaptation\] .*dvc repro adapt"):
        pretrain.run(stale, paths)
    json.loads((paths.adapt / CHOSEN_FILE).read_text())  # untouched


def test_fixed_strategy_records_it_and_pretrain_ignores_the_stage(tokenized_demo, tmp_path) -> None:
    paths = copy_project(tokenized_demo, tmp_path)
    cfg = make_config(**TINY_PRETRAIN)
    report = adapt.run(cfg, paths)
    assert report.as_json() == {"strategy": "fixed"} and "fixed" in adapt.summary(report, cfg, paths)
    assert chosen_adaptation(cfg, paths) == (cfg, None)


def test_the_decision_reads_the_same_in_the_run_report_and_the_prefect_view(played) -> None:
    from pipeline.core.sections.adapt import ARM_NAMES
    from pipeline.reporting.html import adaptation_section
    from pipeline.reporting.numbers import points
    from pipeline.reporting.views import adaptation_markdown

    _, _, report = played
    page, view = adaptation_section(report), adaptation_markdown(report)
    assert report.chosen is not None and report.rungs is not None and view is not None
    chosen = ARM_NAMES[report.chosen]
    assert f"Adaptation chosen on dev: {chosen}" in page and f"Adaptation chosen on dev: {chosen}" in view
    none = report.rungs[-1].arms["none"]
    assert f"<td>{points(none.dev_mean)}</td>" in page and f"| {points(none.dev_mean)} |" in view
    assert view.count("\n| ") == 1 + sum(len(r.arms) for r in report.rungs)  # header + a row per arm and rung
    fixed = AdaptReport(strategy="fixed")
    assert adaptation_section(fixed) == "" and adaptation_markdown(fixed) is None


def test_a_rung_that_would_end_past_the_budget_is_not_started() -> None:
    ac = make_config(**{"adapt.budget_minutes": 20, "adapt.rungs": 2}).adapt
    last = {"rung": 0, "arms": {a: {"minutes": 3.0} for a in ("none", "dapt", "tapt", "dapt+tapt")}, "kept": ["dapt"]}
    assert tournament.over_budget(ac, last, elapsed=60.0) is None  # 1 + (12 x 2 x 2/4 = 12) <= 20
    said = tournament.over_budget(ac, last, elapsed=10 * 60.0)  # 10 + 12 > 20
    assert (
        said
        == "rung 2 not started: it would take ~12.0 min after 10.0, past adapt.budget_minutes (20); decided on rung 1"
    )
