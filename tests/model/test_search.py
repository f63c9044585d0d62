"""search: fine-tuning settings chosen on each model's dev split (Optuna), read by finetune; pruning; stale choices."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeline.core.config import ConfigError, load_config
from pipeline.core.errors import DataError
from pipeline.stages import finetune, search
from pipeline.training.search import apply_values, chosen_config, dev_pruning_callback
from tests.conftest import ROOT, TINY_FINETUNE, TINY_PRETRAIN, copy_project, make_config

SEARCH = {
    "search.enabled": True,
    "search.trials": 3,
    "search.pruner": "none",
    "search.space": {
        "learning_rate": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
        "max_steps": {"low": 10, "high": 30},
    },
    "search.task_space": {},
}


def test_apply_values_sets_run_and_task_settings_and_validates_them() -> None:
    fc = make_config().finetune
    out = apply_values(fc, {"finetune.learning_rate": 5e-4, "finetune.tasks.ner.sampling_weight": 2.0})
    assert out.learning_rate == 5e-4 and out.task("ner").sampling_weight == 2.0 and out.max_steps == fc.max_steps
    with pytest.raises(ValueError, match="layer_lr_decay"):
        apply_values(fc, {"finetune.layer_lr_decay": 1.5})


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        ({"search.space": {"batch_size": {"low": 8, "high": 32}}}, r"search: .*space\.batch_size: not a searchable"),
        ({"search.space": {"learning_rate": {"low": 1e-3, "high": 1e-4}}}, r"low \(0\.001\) must be below high"),
        ({"search.space": {"dropout": {"low": 0.0, "high": 0.3, "log": True}}}, r"log: true needs low > 0"),
        ({"search.task_space": {"ner": {"loss_weight": {"low": 0.5, "high": 2}}}}, r"task_space\.ner\.loss_weight"),
        ({"search.task_space": {"nope": {"sampling_weight": {"low": 0.5, "high": 2}}}}, r"search\.task_space\.nope"),
        ({"search.space": {}, "search.task_space": {}}, r"nothing to search"),
    ],
)
def test_bad_search_settings_name_the_key(space: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(ROOT / "params.yaml", space)
    with pytest.raises(ConfigError, match=r"search\.trials: got 0"):
        load_config(ROOT / "params.yaml", {"search.trials": 0})


def test_pruning_stops_a_trial_below_the_median_of_the_earlier_ones() -> None:
    import optuna
    from transformers import TrainerControl, TrainerState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
    for value in (0.8, 0.9):  # two finished trials that were good at step 10
        t = study.ask()
        t.report(value, 10)
        study.tell(t, value)
    control, state = TrainerControl(), TrainerState()
    state.global_step = 10
    good = dev_pruning_callback(study.ask(), warmup_evaluations=0)
    good.on_evaluate(None, state, control, metrics={"eval_mean_primary": 0.95})
    assert good.pruned_at is None and not control.should_training_stop
    bad, patient = dev_pruning_callback(study.ask(), 0), dev_pruning_callback(study.ask(), 1)
    bad.on_evaluate(None, state, control, metrics={"eval_mean_primary": 0.1})
    assert bad.pruned_at == 10 and control.should_training_stop
    control = TrainerControl()
    patient.on_evaluate(None, state, control, metrics={"eval_mean_primary": 0.1})  # still in its warm-up evaluations
    assert patient.pruned_at is None and not control.should_training_stop


def test_a_time_budget_gives_every_model_the_same_number_of_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds of one trial per model: a slow adapted model and a fast baseline get as many trials each
    (one study after the other, the fast one would run ~15 trials in its minutes and the slow one 2)."""
    import time

    import optuna

    from pipeline.training import search as search_lib

    seconds = {"adapted": 0.25, "baseline": 0.02}  # a trial's cost per model

    def fake_study(cfg, paths, model, precision):
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
        rows: list[dict] = []

        def objective(trial):
            time.sleep(seconds[model])
            values = search_lib.suggest(trial, cfg.search)  # the search's own values, no training
            rows.append({"trial": trial.number, "values": values, "state": "complete", "dev_mean_primary": 0.5})
            return 0.5

        return search_lib.Study(model, study, objective, rows)

    monkeypatch.setattr(search_lib, "open_study", fake_study)
    cfg = make_config(**{**SEARCH, "search.trials": 20, "search.budget_minutes": 0.005})  # 0.3 s per model
    result = search_lib.run_studies(cfg, None, ["adapted", "baseline"], None)
    counts = {m: len(r["trials"]) for m, r in result.items()}
    assert counts["adapted"] == counts["baseline"]
    assert 1 <= counts["adapted"] < 20  # the budget (0.6 s for both) stopped the rounds, not search.trials
    assert result["adapted"]["seconds"] >= counts["adapted"] * 0.25


def test_a_diverged_trial_is_one_line_without_a_traceback_and_never_chosen(monkeypatch, capfd, tmp_path) -> None:
    """Was: Optuna logged the caught NonFiniteLoss with its traceback (issue 61)."""
    from pipeline.core.errors import NonFiniteLoss
    from pipeline.core.paths import Paths
    from pipeline.training import search as search_lib

    def fake_train(trial_cfg, paths, contender, tasks, precision, place):
        if place.run_name.endswith("trial-1"):
            raise NonFiniteLoss("the training loss is nan at step 7: lower finetune.learning_rate")
        return None, {"steps": 10, "best_dev_mean_primary": 0.5}

    monkeypatch.setattr(search_lib, "make_contender", lambda *a: SimpleNamespace(tokenized=None))
    monkeypatch.setattr(search_lib, "load_tasks", lambda *a: {})
    monkeypatch.setattr(search_lib, "train_contender", fake_train)
    cfg = make_config(**{**SEARCH, "search.trials": 3})
    s = search_lib.open_study(cfg, Paths(tmp_path), "adapted", None)
    for _ in range(3):
        search_lib.run_trial(s)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "trial 2/3 diverged (the training loss is nan at step 7" in err
    result = search_lib.study_result(s, cfg, Paths(tmp_path))
    assert [r["state"] for r in result["trials"]] == ["complete", "diverged", "complete"]
    assert result["chosen_trial"] != 1


@pytest.fixture(scope="module")
def searched(pretrained, tmp_path_factory):
    _, src = pretrained
    paths = copy_project(src, tmp_path_factory.mktemp("searched"))
    cfg = make_config(**TINY_PRETRAIN, **TINY_FINETUNE, **SEARCH)
    return cfg, paths, search.run(cfg, paths)


def test_each_model_gets_the_best_dev_trial_and_the_first_is_params_yaml(searched) -> None:
    _, paths, report = searched
    assert set(report.models) == {"adapted", "baseline"}
    for model, s in report.models.items():
        trials = s.trials
        assert len(trials) == 3 and all(t.state == "complete" for t in trials), model
        assert trials[0].values == {"finetune.learning_rate": 1e-3, "finetune.max_steps": 30}  # params.yaml's
        assert s.default_dev_mean_primary == trials[0].dev_mean_primary
        best = max(trials, key=lambda t: t.dev_mean_primary or 0.0)
        assert s.chosen_dev_mean_primary == pytest.approx(best.dev_mean_primary, abs=1e-5)
        assert s.chosen == best.values and s.chosen_dev_mean_primary >= s.default_dev_mean_primary
        assert all(1e-4 <= t.values["finetune.learning_rate"] <= 3e-3 for t in trials)
        assert all(isinstance(t.values["finetune.max_steps"], int) for t in trials)
    record = json.loads((paths.search / "chosen.json").read_text())
    assert record["models"] == {m: s.chosen for m, s in report.models.items()}
    assert not (paths.search_checkpoints / "adapted").exists() or not any(
        (paths.search_checkpoints / "adapted").iterdir()
    )


def test_finetune_trains_each_model_with_its_choice_and_refuses_a_stale_one(searched, tmp_path) -> None:
    cfg, src, report = searched
    paths = copy_project(src, tmp_path)
    (paths.search).mkdir(parents=True, exist_ok=True)
    (paths.search / "chosen.json").write_text((src.search / "chosen.json").read_text())
    trained = finetune.run(cfg, paths)
    for model in ("adapted", "baseline"):
        chosen = report.models[model].chosen
        summary = trained.model(model)
        assert trained.search is not None and trained.search[model] == chosen
        assert summary is not None and summary.steps <= chosen["finetune.max_steps"]
    changed = make_config(**TINY_PRETRAIN, **{**TINY_FINETUNE, "finetune.dropout": 0.2}, **SEARCH)
    with pytest.raises(DataError, match=r"stale-search.*dvc repro search"):
        chosen_config(changed, paths, "adapted")
    off = make_config(**TINY_PRETRAIN, **TINY_FINETUNE)
    assert chosen_config(off, paths, "adapted") == (off, None)  # search off: params.yaml as it is


def test_search_off_writes_an_empty_choice_quickly(pretrained, tmp_path) -> None:
    cfg, src = pretrained
    paths = copy_project(src, tmp_path)
    assert search.run(cfg, paths).as_json() == {"enabled": False}
    assert json.loads((paths.search / "chosen.json").read_text())["models"] == {}


def test_a_truncated_or_wrong_choice_is_an_error_naming_the_file(tmp_path) -> None:
    from pipeline.core.paths import Paths
    from pipeline.training.search import write_chosen

    cfg = make_config(**TINY_FINETUNE, **SEARCH)
    paths = Paths(tmp_path)
    paths.search.mkdir(parents=True)
    chosen = paths.search / "chosen.json"
    write_chosen(chosen, cfg, {"adapted": {"chosen": {"finetune.learning_rate": -1.0}}})
    with pytest.raises(DataError, match=r"chosen\.json: \[bad-search-choice\] models\.adapted: .*learning_rate"):
        chosen_config(cfg, paths, "adapted")
    write_chosen(chosen, cfg, {"adapted": {"chosen": {"finetune.bogus": 1}}})
    with pytest.raises(
        DataError, match=r"\[bad-search-choice\] models\.adapted: \['finetune\.bogus'\] are not searched"
    ):
        chosen_config(cfg, paths, "adapted")
    chosen.write_text(chosen.read_text()[:40])  # cut mid-write
    with pytest.raises(
        DataError, match=r"chosen\.json: \[missing-input\] not a complete JSON report.*dvc repro search"
    ):
        chosen_config(cfg, paths, "adapted")
