"""The real thing: `dvc repro` in a temporary git repository (marked slow; runs in CI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.stages import NAMES as PIPELINE_STAGES
from tests.conftest import TINY_COMPRESS, TINY_FINETUNE, TINY_PRETRAIN, environment_skip, make_repo

pytestmark = pytest.mark.slow
STAGES = list(PIPELINE_STAGES)


SECRET = "S3cr3t-pw-61"
RAY_WITH_SECRET = f"ray://alice:{SECRET}@10.0.0.5:10001"  # never contacted: the stages run on the local engines


def _sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _ran(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage")]


def _edit_params(repo: Path, fn) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    fn(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def _point_role_at_raw(params: dict) -> None:
    role = next(t for t in params["ingest"]["tasks"] if t["name"] == "role")
    role["files"] = {s: f"data/raw/role/{s}.csv" for s in ("train", "validation", "test")}


@pytest.fixture(scope="module")
def repo(built_demo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh git + DVC repository holding the project's tracked files, pipeline already run once; the role task is
    read from the user's own files (``data/raw/role/``: the demo's, same sizes), as a user's data is."""
    repo = make_repo(
        tmp_path_factory.mktemp("repo"),
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        **TINY_COMPRESS,
        # two variants, one quantised and one trained, carry what this file checks through DVC, MLflow and the
        # registry (registering is the same pyfunc for every variant); all four are built, scored, timed and loaded
        # by the serving code in tests/model/test_compress_stage.py
        **{"tracking.enabled": True, "compress.variants": ["int8", "distilled"], "ray.address": RAY_WITH_SECRET},
    )
    shutil.copytree(built_demo[1].demo / "tasks" / "role", repo / "data" / "raw" / "role")
    _edit_params(repo, _point_role_at_raw)
    _sh(["git", "add", "-A"], repo)
    _sh(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "role from data/raw"], repo)
    first = _sh(["dvc", "repro"], repo)
    (repo.parent / "repro-output.txt").write_text(first.stdout + first.stderr, encoding="utf-8")
    assert _ran(first) == STAGES
    assert (repo / "models" / "dapt" / "model.safetensors").exists()
    assert (repo / "models" / "finetuned" / "heads.safetensors").exists()
    return repo


def test_a_secret_in_a_uri_setting_is_in_no_output(repo: Path) -> None:
    """Issue 61 (3): a password in a URI-capable setting (``ray.address``; the tracking URI's own test is
    tests/e2e/test_register.py) reaches no file the pipeline, ``history`` or ``models card`` writes, no MLflow
    param or tag (``mlflow.db``, ``mlartifacts/``) and no console line."""
    outputs = [(repo.parent / "repro-output.txt").read_bytes()]
    for command in (["history"], ["models", "card", "1"]):
        proc = _sh([sys.executable, "-m", "pipeline", *command], repo)
        outputs.append((proc.stdout + proc.stderr).encode())
    files = [p for top in ("reports", "models", "mlartifacts") for p in (repo / top).rglob("*") if p.is_file()]
    files.append(repo / "mlflow.db")
    assert len(files) > 50 and (repo / "reports" / "history.html").exists()
    leaked = [str(p.relative_to(repo)) for p in files if SECRET.encode() in p.read_bytes()]
    leaked += [f"console of command {i}" for i, out in enumerate(outputs) if SECRET.encode() in out]
    assert not leaked, leaked
    # the positive control: the setting is in the config the stages ran with, and shown masked where it is shown
    assert SECRET in (repo / "params.yaml").read_text()
    assert b"ray://10.0.0.5:10001" in (repo / "mlflow.db").read_bytes()


def _pipelines(repo: Path) -> list[tuple]:
    """(parent run, {stage: child run}) of every pipeline execution in the repo's MLflow store, oldest first."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("adaptbert")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("adaptbert.kind") == "pipeline"]
    return [
        (p, {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id})
        for p in parents
    ]


def test_mlflow_holds_one_parent_run_with_a_child_per_stage(repo: Path) -> None:
    from mlflow import MlflowClient

    ((parent, children),) = _pipelines(repo)
    assert parent.data.tags["adaptbert.trigger"] == "dvc" and parent.info.status == "FINISHED"
    assert parent.data.params["pretrain.max_steps"] == "6"  # the whole resolved config
    assert sorted(children) == sorted(STAGES)
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    for stage, run in children.items():
        assert run.info.status == "FINISHED", stage
        assert len(run.data.tags["git.commit"]) == 40 and run.data.tags["git.dirty"] == "false", stage
    assert "data_hash" in children["register"].data.tags
    assert len(client.get_metric_history(children["pretrain"].info.run_id, "loss")) == 6  # the step curve
    assert children["evaluate"].data.metrics["summary.mean_primary_adapted"] > 0
    assert {"evaluation.md", "metrics.json", "plots"} <= {
        a.path for a in client.list_artifacts(children["evaluate"].info.run_id)
    }
    assert {"validation.json", "data_docs"} <= {a.path for a in client.list_artifacts(children["validate"].info.run_id)}
    nested = {
        r.info.run_name: r
        for r in client.search_runs(
            [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{children['finetune'].info.run_id}'"
        )
    }
    assert sorted(nested) == ["finetune-adapted", "finetune-baseline"]
    assert len(client.get_metric_history(nested["finetune-adapted"].info.run_id, "eval_mean_primary")) >= 3
    aliases = {k: str(v) for k, v in client.get_registered_model("adaptbert").aliases.items()}
    promotion = json.loads((repo / "reports" / "promotion.json").read_text())
    assert promotion["versions"]["full"] == "1"  # then the servable variants, in compress.variants order
    assert aliases["challenger"] == promotion["version"] == promotion["versions"][promotion["serving"]["choice"]]
    assert {"compression.md", "compression.json", "compression"} <= {
        a.path for a in client.list_artifacts(children["compress"].info.run_id)
    }
    assert ("champion" in aliases) == promotion["promoted"]  # the tiny model may not clear the first-champion floors
    # the run report places the run: its stage times (from these runs), its parent run and model version
    assert promotion["parent_run_id"] == parent.info.run_id
    html = (repo / "reports" / "index.html").read_text(encoding="utf-8")
    timed = re.findall(r"<tr><td>(\w+)</td><td>(\d+:\d\d)</td><td>finished</td></tr>", html)
    assert [stage for stage, _ in timed] == STAGES[:-1]  # every stage but the report itself, still running
    assert f"runs/{parent.info.run_id}" in html and f"#/models/adaptbert/versions/{promotion['version']}" in html


def test_stage_runs_carry_the_hashes_dvc_lock_records_for_their_inputs_and_outputs(repo: Path) -> None:
    """Tagged at start (inputs) and after the outputs exist (outputs), checked against dvc.lock afterwards;
    the nested fine-tuning runs carry their stage's lineage and the parent the hash of every stage's outputs."""
    from mlflow import MlflowClient

    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    ((parent, children),) = _pipelines(repo)[:1]
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    for stage in ("pretrain", "finetune", "register"):
        tags = children[stage].data.tags
        for kind, entries in (("in", lock[stage]["deps"]), ("out", lock[stage]["outs"])):
            for entry in entries:
                assert tags.get(f"dvc.{kind}.{entry['path']}") == entry["md5"], (stage, kind, entry["path"])
        for entry in lock[stage]["outs"]:
            assert parent.data.tags.get(f"dvc.{stage}.{entry['path']}") == entry["md5"], (stage, entry["path"])
    nested = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{children['finetune'].info.run_id}'"
    )
    assert len(nested) == 2
    for run in nested:
        for entry in lock["finetune"]["deps"] + lock["finetune"]["outs"]:
            kind = "in" if entry in lock["finetune"]["deps"] else "out"
            assert run.data.tags.get(f"dvc.{kind}.{entry['path']}") == entry["md5"], (run.info.run_name, entry["path"])
    # the parent holds the headline and the run report
    summary = json.loads((repo / "reports" / "summary.json").read_text())
    assert parent.data.metrics["adapted"] == pytest.approx(summary["adapted"])
    assert "Mean primary test metric" in parent.data.tags["mlflow.note.content"]
    assert "report" in {a.path for a in client.list_artifacts(parent.info.run_id)}


def test_every_plotted_cell_has_a_value_and_metrics_show_fits_a_terminal(repo: Path) -> None:
    from tests.model.test_plots import empty_plotted_cells

    assert empty_plotted_cells(repo) == []
    shown = _sh(["dvc", "metrics", "show"], repo).stdout
    assert "reports/summary.json" in shown and len(shown.splitlines()) <= 4  # the headline file only
    assert max(len(line) for line in shown.splitlines()) <= 120  # four tasks: one terminal line


def test_the_plots_page_opens_offline(repo: Path, tmp_path: Path) -> None:
    """Was: `dvc plots show` loads Vega from a CDN, a blank page offline. `python -m pipeline plots` writes DVC's
    page with the libraries inline: no script, style or image from the network, and in headless Chromium with its
    proxy a closed port every plot of dvc.yaml is drawn."""
    from tests.e2e.test_report import chromium

    said = _sh([sys.executable, "-m", "pipeline", "plots", "-o", str(tmp_path / "plots")], repo).stdout
    page = tmp_path / "plots" / "index.html"
    assert str(page) in said
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"""<(script|link|img|iframe)\b[^>]*\b(src|href)=["'](https?:)?//""", html)
    plotted = re.findall(r"vegaEmbed\('#([^']+)'", html)
    titles = [next(iter(plot)) for plot in yaml.safe_load((repo / "dvc.yaml").read_text())["plots"]]
    assert len(plotted) == len(titles) == 4
    if chromium() is None:
        environment_skip(
            "no headless Chromium here (.ci/run installs the Debian package): the page was checked as text"
        )
    offline = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--proxy-server=127.0.0.1:9",
        "--virtual-time-budget=10000",
    ]
    dom = subprocess.run(
        [chromium(), *offline, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.stdout.count('class="marks"') == len(plotted)  # one drawn chart (vega's SVG) per plot
    assert all(t in dom.stdout for t in titles)


def test_second_repro_is_a_no_op(repo: Path) -> None:
    _sh(["git", "add", "-A"], repo)  # the first run's lock and reports, as a user commits them
    _sh(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "first run"], repo)
    second = _sh(["dvc", "repro"], repo)
    assert _ran(second) == []
    assert "Data and pipelines are up to date" in second.stdout
    assert _sh(["git", "status", "--porcelain"], repo).stdout == ""  # the second run changed nothing git tracks
    # a re-run that does work: compress re-measures its latencies (the page and plot showing them are DVC-cached,
    # the versioned half of compression.json holds none), so only dvc.lock changes; the trained variants are the
    # same, so register does not re-run; the run report draws the new front
    forced = _sh(["dvc", "repro", "--force", "--single-item", "compress"], repo)
    assert _ran(forced) == ["compress"]
    changed = _sh(["git", "status", "--porcelain"], repo).stdout.splitlines()
    assert [line[3:] for line in changed] == ["dvc.lock"]  # DVC stages it itself (core.autostage)
    assert _ran(_sh(["dvc", "repro"], repo)) == ["report"]
    _sh(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "compress re-measured"], repo)


def test_push_and_pull_through_the_default_remote(repo: Path) -> None:
    _sh(["dvc", "push"], repo)
    shutil.rmtree(repo / "data" / "corpus")
    _sh(["dvc", "pull"], repo)
    assert (repo / "data" / "corpus" / "manifest.json").exists() and list(
        (repo / "data" / "corpus" / "train").iterdir()
    )
    assert _ran(_sh(["dvc", "repro"], repo)) == []


def test_validate_threshold_change_reruns_only_validate(repo: Path) -> None:
    _edit_params(repo, lambda p: p["validate"]["tasks"].update(max_train_overlap=0.05))
    # the gate's content is unchanged: tokenize skips; the run report shows the new thresholds
    assert _ran(_sh(["dvc", "repro"], repo)) == ["validate", "report"]
    _parent, children = _pipelines(repo)[-1]
    assert list(children) == ["validate", "report"]  # skipped stages log nothing


def test_corrupted_task_file_stops_in_validate_and_keeps_outputs(repo: Path) -> None:
    raw = repo / "data" / "raw" / "role"
    tokenized_before = {p: p.read_bytes() for p in (repo / "data" / "tokenized").rglob("*") if p.is_file()}
    lock_before = (repo / "dvc.lock").read_text()
    validate_lock = yaml.safe_load(lock_before)["stages"]["validate"]

    test_csv = raw / "test.csv"
    lines = test_csv.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + ",DISCUSSION"  # line 5 of the file
    test_csv.write_text("\n".join(lines) + "\n")
    failed = _sh(["dvc", "repro"], repo, check=False)
    assert failed.returncode != 0
    assert _ran(failed) == ["ingest", "validate"]
    parent, children = _pipelines(repo)[-1]
    assert parent.info.status == "FAILED" and children["validate"].info.status == "FAILED"
    assert "labels within the label set" in children["validate"].data.tags["error"]
    assert "labels within the label set" in failed.stderr
    assert "data/raw/role/test.csv:5" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["validate"] == validate_lock
    assert yaml.safe_load((repo / "reports" / "validation.json").read_text())["success"] is False
    assert not (repo / "reports" / "validated.json").exists()  # the gate is closed
    assert {p: p.read_bytes() for p in (repo / "data" / "tokenized").rglob("*") if p.is_file()} == tokenized_before
    again = _sh(["dvc", "repro"], repo, check=False)  # still failing, never "up to date"
    assert again.returncode != 0 and _ran(again) == ["validate"]

    # a file ingest cannot read: ingest stops, naming file/line/rule, and keeps its outputs
    tasks_before = {p: p.read_bytes() for p in (repo / "data" / "tasks").rglob("*") if p.is_file()}
    test_csv.write_bytes(test_csv.read_bytes() + b"caf\xe9,RESULTS\n")
    broken = _sh(["dvc", "repro"], repo, check=False)
    assert broken.returncode != 0
    assert f"data/raw/role/test.csv:{len(lines) + 1}: [invalid-utf8]" in broken.stderr
    assert {p: p.read_bytes() for p in (repo / "data" / "tasks").rglob("*") if p.is_file()} == tasks_before
    assert json.loads((repo / "reports" / "ingest.json").read_text())["tasks"]  # persist: DVC no longer deletes it


def test_history_lists_every_dvc_repro_of_the_repository(repo: Path) -> None:
    """`adaptbert history` over this repository's store: one row per `dvc repro` that ran a stage, newest first;
    the first (the whole pipeline) with what the registry serves."""
    shown = _sh([sys.executable, "-m", "pipeline", "history"], repo).stdout
    executions = _pipelines(repo)
    rows = shown.splitlines()[2 : 2 + len(executions)]
    assert len(executions) >= 3 and all(row.split()[2] == "dvc" for row in rows)  # after the date and time
    promotion = json.loads((repo / "reports" / "promotion.json").read_text())
    assert rows[-1].split()[-1] == promotion["serving"]["choice"]  # the oldest: the run that registered
    assert (repo / "reports" / "history.html").exists() and "validate.tasks.max_train_overlap" in shown  # edited above
