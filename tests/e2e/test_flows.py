"""The Prefect wiring: task bodies on a real DVC repo, overrides, artifacts, serving refusals (fast)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows import stages as st
from pipeline.core.config import ConfigError, load_config
from pipeline.core.io import read_report
from pipeline.core.profiles import profile_overrides
from pipeline.core.reports.ingest import IngestReport
from pipeline.reporting import views
from tests.conftest import ROOT, free_port
from tests.unit import typed_reports as c


def _git_dvc_repo(path: Path, dvc_yaml: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "dvc.yaml").write_text(dvc_yaml)
    for cmd in (["git", "init", "-q"], [str(Path(sys.executable).with_name("dvc")), "init", "-q"]):
        subprocess.run(cmd, cwd=path, check=True)
    return path


def test_run_stage_reports_ran_then_skipped_and_names_failures(tmp_path: Path) -> None:
    from flows.pipeline import run_stage

    repo = _git_dvc_repo(
        tmp_path / "repo",
        "stages:\n  hello:\n    cmd: echo hi > out.txt\n    outs: [out.txt]\n"
        "  validate:\n    cmd: \"echo 'validate failed - 1 of 2 expectations failed' >&2; exit 3\"\n"
        "  slow:\n    cmd: sleep 30\n",
    )
    first = run_stage.fn(str(repo), "hello", False, 120, {})
    assert first["stage"] == "hello" and first["ran"] is True and (repo / "out.txt").read_text() == "hi\n"
    assert run_stage.fn(str(repo), "hello", False, 120, {})["ran"] is False  # DVC decides: unchanged
    assert run_stage.fn(str(repo), "hello", True, 120, {})["ran"] is True  # force
    with pytest.raises(
        st.ValidationStageFailure, match=r"(?s)stage 'validate' failed: .*validate failed - 1 of 2 expectations failed"
    ):
        run_stage.fn(str(repo), "validate", False, 120, {})
    with pytest.raises(st.StageFailed, match=r"stage 'slow' failed: timed out after 2 s \(schedule.timeout_s\)"):
        run_stage.fn(str(repo), "slow", False, 2, {})


def test_until_and_force_name_stages_of_the_pipeline(tmp_path: Path) -> None:
    from flows.pipeline import adaptbert_pipeline

    with pytest.raises(ValueError, match="until: unknown stage 'finetuning'; stages: \\['demo'"):
        adaptbert_pipeline.fn(root=str(tmp_path), until="finetuning")
    with pytest.raises(ValueError, match="force: unknown stage"):
        adaptbert_pipeline.fn(root=str(tmp_path), force=["nope"])


def test_only_transient_failures_are_retried() -> None:
    from prefect.states import Failed

    from flows.pipeline import retry_transient_only

    dvc = "ERROR: failed to reproduce '{0}': failed to run: python -m pipeline {0}, exited with {1}"
    transient = st.classify_failure(
        "finetune", "finetune failed: MLflow tracking store http://x is unreachable\n" + dvc.format("finetune", 4)
    )
    assert isinstance(transient, st.TransientStageFailure) and transient.exit_code == 4
    assert isinstance(st.classify_failure("validate", dvc.format("validate", 3)), st.ValidationStageFailure)
    assert isinstance(
        st.classify_failure("ingest", "ingest failed: a.csv:3: [invalid-utf8]\n" + dvc.format("ingest", 3)),
        st.ValidationStageFailure,
    )
    assert isinstance(st.classify_failure("pretrain", dvc.format("pretrain", 130)), st.InterruptedStageFailure)
    assert (
        type(st.classify_failure("pretrain", dvc.format("pretrain", 1))) is st.StageFailed
    )  # NaN loss, a bug: not retried
    # the text does not decide: a message that mentions a lock but exits 3 is bad data, not transient
    assert isinstance(
        st.classify_failure("ingest", "database is locked\n" + dvc.format("ingest", 3)), st.ValidationStageFailure
    )
    assert type(st.classify_failure("ingest", "ERROR: Unable to acquire lock")) is st.StageFailed  # DVC itself failed
    assert retry_transient_only(None, None, Failed(data=transient))
    assert not retry_transient_only(None, None, Failed(data=st.ValidationStageFailure("validate", "x")))
    assert not retry_transient_only(None, None, Failed(data=st.StageFailed("ingest", "x")))


def test_overrides_apply_for_the_run_and_the_params_file_comes_back(tmp_path: Path) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    original = (tmp_path / "params.yaml").read_bytes()
    with st.overridden_params(tmp_path, {"pretrain.max_steps": 7, "tokenize.extend_vocab.enabled": True}):
        text = (tmp_path / "params.yaml").read_text()
        assert "max_steps: 7 " in text and "# optimiser steps" in text  # DVC's round-trip YAML keeps the comments
    assert (tmp_path / "params.yaml").read_bytes() == original
    with pytest.raises(RuntimeError, match="stage failed"), st.overridden_params(tmp_path, {"pretrain.max_steps": 7}):
        raise RuntimeError("stage failed")
    assert (tmp_path / "params.yaml").read_bytes() == original  # a failed run leaves the user's file intact
    with (
        pytest.raises(ConfigError, match=r"pretrain\.max_stepz"),
        st.overridden_params(tmp_path, {"pretrain.max_stepz": 7}),
    ):
        pass
    assert (tmp_path / "params.yaml").read_bytes() == original
    # a run killed with its overrides applied: the next run puts the user's file back first
    cm = st.overridden_params(tmp_path, {"pretrain.max_steps": 7})
    cm.__enter__()  # ... and the process dies here, never reaching __exit__
    assert (tmp_path / "params.yaml").read_bytes() != original
    with st.overridden_params(tmp_path, {}):
        assert (tmp_path / "params.yaml").read_bytes() == original
    assert not st.params_backup(tmp_path).exists()


def test_profiles_are_overrides_that_parse() -> None:
    from pipeline.core.config import load_config

    smoke = profile_overrides(ROOT, "smoke")
    cfg = load_config(ROOT / "params.yaml", smoke)
    assert cfg.pretrain.base_model == "scratch"
    # a profile's runs stay out of the real registry: their own experiment and model name, tagged with the profile
    assert (cfg.tracking.profile, cfg.tracking.experiment, cfg.registration.model_name) == (
        "smoke",
        "adaptbert-smoke",
        "adaptbert-smoke",
    )
    with pytest.raises(ConfigError, match=r"profile 'nope': no file .* \(profiles: \['biomed', 'gpu', 'smoke', 'zh'\]"):
        profile_overrides(ROOT, "nope")
    with pytest.raises(ConfigError, match=r"profile '../params': a profile is named by letters"):
        profile_overrides(ROOT, "../params")  # was: params.yaml itself read as a profile (any YAML file, by path)


def test_a_profile_that_is_not_safe_yaml_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """Was: a raw ConstructorError traceback for a ``!!python/object`` tag (issue 61)."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "evil.yaml").write_text("seed: !!python/object/apply:os.system ['true']\n")
    (tmp_path / "profiles" / "broken.yaml").write_text("seed: [13\n")
    for name, reason in (("evil", "could not determine a constructor"), ("broken", "while parsing a flow sequence")):
        with pytest.raises(ConfigError, match=rf"profiles/{name}\.yaml: not valid YAML: .*{reason}"):
            profile_overrides(tmp_path, name)


def test_a_profile_may_name_its_own_registered_model(tmp_path: Path) -> None:
    from pipeline.core.config import load_config

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "legal.yaml").write_text("register.model_name: legal-bert\n")
    cfg = load_config(tmp_path / "params.yaml", profile_overrides(tmp_path, "legal"))
    assert (cfg.tracking.profile, cfg.tracking.experiment, cfg.registration.model_name) == (
        "legal",
        "adaptbert-legal",
        "legal-bert",
    )


def test_artifact_tables_come_from_the_reports(finetuned) -> None:
    _, paths, _, metrics = finetuned
    dapt = {r["task"]: r for r in views.dapt_table(metrics)}
    assert set(dapt) == {"role", "pair", "ner", "qa", "mean"}
    assert dapt["mean"]["adapted"] == metrics.summary.mean_primary_adapted
    assert (
        dapt["ner"]["adapted"] == metrics.tasks["ner"].adapted["f1"]
        and dapt["ner"]["delta"] == metrics.tasks["ner"].delta
    )
    rows = views.metrics_table(metrics)
    assert {(r["task"], r["metric"]) for r in rows if r["primary"]} == {
        ("role", "macro_f1"),
        ("pair", "macro_f1"),
        ("ner", "f1"),
        ("qa", "f1"),
    }
    ingest = views.ingest_table(read_report(paths.ingest_report, IngestReport))
    assert ingest[0]["dataset"] == "corpus" and {r["dataset"].split()[1] for r in ingest[1:]} == {
        "role",
        "pair",
        "ner",
        "qa",
    }


def test_the_compression_artifact_is_the_front_table() -> None:
    full = c.full(0.8, size_mb=90.0, speed=c.speed(fp32=c.timing(10.0), bf16=c.timing(12.0)))
    report = c.report(full, int8=c.variant(0.79, delta=-0.01, speed=c.speed(fp32=c.timing(5.0))))
    rows = views.compression_table(report)
    assert rows is not None and [r["model"] for r in rows] == ["full (fp32)", "full (bf16)", "int8 (fp32)"]
    assert rows[1]["p50_ms"] == 12.0 and rows[2]["p50_ms"] == 5.0 and rows[2]["delta"] == -0.01
    off = report.model_copy(update={"enabled": False})
    assert views.compression_table(off) is None  # compression off: no artifact


def test_validation_summary_lists_failed_expectations_first() -> None:
    report = {
        "success": False,
        "expectations": 3,
        "failed_expectations": 1,
        "suites": [
            {
                "suite": "corpus.summary",
                "expectations": [
                    {"success": True, "rule": "ok rule", "expectation": "e1", "observed": {}, "offending": []}
                ],
            },
            {
                "suite": "task.role.test",
                "expectations": [
                    {
                        "success": False,
                        "rule": "labels within the label set",
                        "expectation": "in_set",
                        "observed": {"unexpected_count": 1},
                        "offending": [{"file": "data/raw/role/test.csv", "line": 5, "values": {"label": "DISCUSSION"}}],
                    }
                ],
            },
        ],
    }
    md = views.validation_markdown(report)
    assert md.startswith("# Validation: FAILED") and "2 of 3 expectations passed" in md
    assert (
        "| task.role.test | labels within the label set |" in md
        and "`data/raw/role/test.csv:5`" in md
        and "ok rule" not in md
    )


def test_serve_refuses_without_a_server_and_names_an_unreachable_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "prefect")}
    none = subprocess.run(
        [sys.executable, "-m", "flows.serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert none.returncode == 2 and "no Prefect server configured: schedules need one" in none.stderr
    url = f"http://127.0.0.1:{free_port()}/api"
    away = subprocess.run(
        [sys.executable, "-m", "flows.serve"],
        cwd=ROOT,
        env={**env, "PREFECT_API_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert away.returncode == 2 and f"Prefect server at {url} is unreachable" in away.stderr


def test_an_invalid_cron_is_named(tmp_path: Path) -> None:
    from flows.serve import ServeError, check_cron
    from pipeline.core.config import load_config

    sc = load_config(ROOT / "params.yaml").schedule
    with pytest.raises(
        ServeError, match=r"schedule.cron '61 \* \* \* \*' \(timezone 'UTC'\) is not a valid schedule: .*Invalid cron"
    ):
        check_cron(sc.model_copy(update={"cron": "61 * * * *"}))
    check_cron(sc)  # the default is valid


@pytest.mark.parametrize("name", ["smoke", "biomed", "zh", "gpu"])
def test_a_profile_through_dvc_set_param_gives_the_flow_s_config(tmp_path: Path, name: str) -> None:
    """`python -m flows.profile NAME --run` passes Hydra `-S` args; DVC's own parser must produce exactly the
    config the Prefect flow gets from the same profile (mappings replaced, not merged into the demo's)."""
    from dvc.utils.hydra import apply_overrides

    from flows.profile import set_param_args
    from pipeline.core.config import load_config

    overrides = profile_overrides(ROOT, name)
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    args = set_param_args(overrides)
    assert args[::2] == ["-S"] * (len(args) // 2)
    apply_overrides(str(params), args[1::2])
    via_dvc = load_config(params)
    assert via_dvc == load_config(ROOT / "params.yaml", overrides)
    if name in ("biomed", "zh"):
        assert set(via_dvc.finetune.tasks) == {t.name for t in via_dvc.ingest.tasks}  # the demo tasks' entries are gone
        assert all("../shared/data/" in f for t in via_dvc.ingest.tasks for f in t.files.values())  # read in place


def test_the_recipes_documented_dvc_exp_run_lines_give_the_flow_s_config(tmp_path: Path) -> None:
    """Each `dvc exp run -S` line of docs/recipes.md, applied by DVC's own parser, gives the config the Prefect
    flow's `overrides` parameter gives (Hydra's -S needs every key to exist in params.yaml)."""
    import shlex

    from dvc.utils.hydra import apply_overrides

    lines = [x.split("#")[0] for x in (ROOT / "docs" / "recipes.md").read_text().splitlines()]
    commands = [shlex.split(x)[3:] for x in lines if x.startswith("dvc exp run -S")]
    assert len(commands) == 3
    for args in commands:
        assert args[::2] == ["-S"] * (len(args) // 2)
        settings = [a.split("=", 1) for a in args[1::2]]
        params = tmp_path / "params.yaml"
        shutil.copy(ROOT / "params.yaml", params)
        apply_overrides(str(params), args[1::2])
        via_dvc = load_config(params)
        overrides = {k: yaml.safe_load(v) for k, v in settings}
        assert via_dvc == load_config(ROOT / "params.yaml", overrides)
        assert via_dvc != load_config(ROOT / "params.yaml")  # each line changes a setting


# issue 28's options, each as a user sets it for one experiment (docs/pretraining.md, finetuning.md, real-data.md)
ISSUE_28_SETTINGS = [
    ["ingest.decontamination.threshold=0.7", "ingest.decontamination.shingle_words=3"],
    ["pretrain.selection.mode=nearest", "pretrain.selection.k=2"],
    ["pretrain.task_text=true"],
    ["pretrain.budget_minutes=60"],
    ["finetune.baseline_budget=same_compute"],
    ["search.enabled=true", "search.trials=4", "search.budget_minutes=30"],
]


@pytest.mark.parametrize("settings", ISSUE_28_SETTINGS, ids=lambda s: s[0].split("=")[0])
def test_issue_28_options_through_dvc_exp_run_give_the_flow_s_config(tmp_path: Path, settings: list[str]) -> None:
    """`dvc exp run -S key=value` (DVC's own parser on params.yaml) gives the config that the Prefect flow's
    `overrides` parameter gives, and a different one from the defaults (the key exists, so Hydra can set it)."""
    from dvc.utils.hydra import apply_overrides

    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    apply_overrides(str(params), settings)
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in settings)}
    via_dvc = load_config(params)
    assert via_dvc == load_config(ROOT / "params.yaml", overrides) != load_config(ROOT / "params.yaml")


def test_profile_cli_prints_runs_and_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    from flows import profile

    (tmp_path / "profiles").mkdir()
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "profiles" / "mine.yaml").write_text(
        'pretrain.max_steps: 7\ntokenize.domain_terms: "it\'s \\\\ odd"\nfinetune.tasks: {role: {metric: accuracy}}\n'
    )
    monkeypatch.chdir(tmp_path)
    assert profile.main(["mine"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed[:3] == ["dvc", "exp", "run"]
    assert printed[3:] == [
        "-S",
        '++tracking.profile="mine"',
        "-S",
        '++tracking.experiment="adaptbert-mine"',
        "-S",
        '++register.model_name="adaptbert-mine"',
        "-S",
        "++pretrain.max_steps=7",
        "-S",
        '++tokenize.domain_terms="it\'s \\\\ odd"',
        "-S",
        "~finetune.tasks",
        "-S",
        '++finetune.tasks={role:{metric:"accuracy"}}',
    ]
    before = (tmp_path / "params.yaml").read_text()
    assert profile.main(["mine", "--apply"]) == 0
    after = (tmp_path / "params.yaml").read_text()
    import re

    assert re.search(
        r"\n  max_steps: 7 +# optimiser steps\n", after
    )  # comments kept (those inside a replaced mapping go with it)
    assert after.splitlines()[:5] == before.splitlines()[:5]
    from pipeline.core.config import load_config

    cfg = load_config(tmp_path / "params.yaml")
    assert cfg.tokenize.domain_terms == "it's \\ odd" and set(cfg.finetune.tasks) == {"role"}
    assert (cfg.tracking.profile, cfg.registration.model_name) == ("mine", "adaptbert-mine")
    (tmp_path / "profiles" / "bad.yaml").write_text("pretrain.max_stepz: 7\n")
    assert profile.main(["bad"]) == 2
    assert "max_stepz" in capsys.readouterr().err
    assert profile.main(["nope"]) == 2
    # --run hands everything after -- to `dvc exp run` unchanged
    ran = []
    monkeypatch.setattr(
        profile.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    assert profile.main(["mine", "--run", "--", "-n", "trial", "-S", "++seed=3"]) == 0
    assert (
        ran[0][:3] == ["dvc", "exp", "run"]
        and ran[0][-4:] == ["-n", "trial", "-S", "++seed=3"]
        and "~finetune.tasks" in ran[0]
    )


def test_prefect_yaml_schedule_is_the_params_schedule() -> None:
    """The work-pool route (prefect.yaml) and `python -m flows.serve` (params.yaml) schedule the same runs."""
    sc = load_config(ROOT / "params.yaml").schedule
    deployment = next(
        d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"] if d["name"] == "scheduled"
    )
    assert [(s["cron"], s["timezone"]) for s in deployment["schedules"]] == [(sc.cron, sc.timezone)]
