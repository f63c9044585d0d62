"""The register stage against a real `mlflow server`: versions, aliases, the gate, the CLI, serving (slow)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from pipeline.core.paths import Paths
from pipeline.reporting.numbers import points
from pipeline.stages import compress, evaluate, finetune
from tests.conftest import (
    ROOT,
    TINY_COMPRESS,
    TINY_FINETUNE,
    TINY_PRETRAIN,
    copy_project,
    free_port,
    make_config,
    stop,
    wait_for_http,
    write_params,
)

pytestmark = pytest.mark.slow

# Any first model may become champion here (the floors are unit-tested); the mean must rise by 0.005.
GATE = {"register.min_gain_over_trivial": -1.0, "register.max_regression": 1.0, "register.min_delta": 0.005}


def _train(src: Paths, dst: Path, steps: int, lr: float) -> tuple[Paths, float]:
    paths = copy_project(src, dst)
    cfg = make_config(
        **TINY_PRETRAIN,
        **{
            **TINY_FINETUNE,
            "finetune.max_steps": steps,
            "finetune.eval_steps": max(1, steps // 2),
            "finetune.learning_rate": lr,
            "finetune.baseline": False,
        },
    )
    finetune.run(cfg, paths)
    return paths, evaluate.run(cfg, paths).summary.mean_primary_adapted


@pytest.fixture(scope="module")
def contenders(pretrained, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Paths]:
    """Two real models of the tiny encoder on the same data: 'better' (200 steps) and 'worse' (one optimiser step)."""
    _, src = pretrained
    worse, worse_mean = _train(src, tmp_path_factory.mktemp("worse"), 1, 1e-3)
    better, better_mean = _train(src, tmp_path_factory.mktemp("better"), 200, 3e-3)
    assert better_mean - worse_mean > 0.05, (
        f"precondition: 200 steps should beat 1 step clearly: {better_mean:.4f} vs {worse_mean:.4f}"
    )
    return {"better": better, "worse": worse}


def _cli(
    project: Paths, server: str, model_name: str, *args: str, wait: bool = True, tmpdir: Path | None = None
) -> subprocess.CompletedProcess | subprocess.Popen:
    params = write_params(
        project.root / f"params-{model_name}.yaml",
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        **GATE,
        **{"register.model_name": model_name},
    )
    cmd = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(project.root), *args]
    env = {**os.environ, "MLFLOW_TRACKING_URI": server} | ({"TMPDIR": str(tmpdir)} if tmpdir else {})
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _aliases(server: str, name: str) -> dict[str, str]:
    from mlflow import MlflowClient

    return dict(MlflowClient(server).get_registered_model(name).aliases)


def _tags(server: str, name: str, version: str) -> dict[str, str]:
    from mlflow import MlflowClient

    return dict(MlflowClient(server).get_model_version(name, version).tags)


def test_worse_then_better_model_moves_the_aliases(contenders, mlflow_server: str, tmp_path: Path) -> None:
    name = "adaptbert-test"
    tmp = tmp_path / "tmp"  # the register's temporary directory
    tmp.mkdir()
    first = _cli(contenders["worse"], mlflow_server, name, "register", tmpdir=tmp)
    assert first.returncode == 0, first.stderr[-3000:]
    # was: every model it loaded back from MLflow stayed behind as a /tmp/tmpXXXX copy (~90 MB each for MiniLM)
    assert [p.name for p in tmp.iterdir() if p.is_dir()] == []
    assert (
        "adaptbert-test v1 (full model) registered; challenger -> v1 (full); champion moved (none) -> 1" in first.stdout
    )
    assert _aliases(mlflow_server, name) == {"champion": "1", "challenger": "1"}

    second = _cli(contenders["better"], mlflow_server, name, "register")
    assert second.returncode == 0, second.stderr[-3000:]
    assert _aliases(mlflow_server, name) == {"champion": "2", "challenger": "2"}
    tags = _tags(mlflow_server, name, "2")
    assert tags["previous_champion"] == "1" and tags["promoted_at"] and tags["promotion.verdict"] == "pass"
    assert tags["git.commit"] and tags["data_hash"] and tags["params_hash"] and float(tags["mean_primary"]) > 0
    report = json.loads((contenders["better"].promotion_report).read_text())
    assert report["promoted"] and report["champion_before"] == "1" and report["champion_after"] == "2"
    assert {r["metric"] for r in report["table"]} == {"role.macro_f1", "pair.macro_f1", "ner.f1", "qa.f1"}

    third = _cli(contenders["worse"], mlflow_server, name, "register")  # a worse challenger: champion stays
    assert third.returncode == 0, third.stderr[-3000:]
    assert _aliases(mlflow_server, name) == {"champion": "2", "challenger": "3"}
    report = json.loads((contenders["worse"].promotion_report).read_text())
    assert not report["promoted"] and "does not beat it by min_delta 0.005" in report["reason"]
    assert _tags(mlflow_server, name, "3")["promotion.verdict"] == "fail"

    listed = _cli(contenders["worse"], mlflow_server, name, "models", "list").stdout
    assert listed.splitlines()[2].split()[:2] == ["3", "challenger"] and listed.splitlines()[3].split()[:2] == [
        "2",
        "champion",
    ]
    assert listed.splitlines()[0].split()[:6] == ["version", "aliases", "variant", "mean_primary", "vs_full", "MB"]
    rows = json.loads(_cli(contenders["worse"], mlflow_server, name, "models", "list", "--json").stdout)
    assert [(r["version"], r["variant"], r["parent_version"]) for r in rows] == [
        ("3", "full", None),
        ("2", "full", None),
        ("1", "full", None),
    ]
    assert rows[0]["mean_primary"] == pytest.approx(float(_tags(mlflow_server, name, "3")["mean_primary"]))
    # the description is the one-line summary (what the registry's Description column shows), then the model card
    line, _, section = rows[0]["description"].split("\n")[:3]
    assert line.startswith(f"full model: mean primary {points(rows[0]['mean_primary'])} points; ")
    assert section.startswith("## ")
    compared = _cli(contenders["worse"], mlflow_server, name, "models", "compare").stdout
    assert "v3 (challenger)" in compared and "v2 (champion)" in compared and "* role.macro_f1" in compared

    refused = _cli(contenders["worse"], mlflow_server, name, "models", "promote", "3")
    assert refused.returncode == 1 and "use --force to override" in refused.stdout
    assert _aliases(mlflow_server, name)["champion"] == "2"
    forced = _cli(contenders["worse"], mlflow_server, name, "models", "promote", "3", "--force")
    assert forced.returncode == 0 and "champion: v2 -> v3 (forced past a failed gate)" in forced.stdout
    assert _tags(mlflow_server, name, "3")["promotion.forced"] == "true"
    back = _cli(contenders["worse"], mlflow_server, name, "models", "rollback")
    assert back.returncode == 0 and "champion: v3 -> v2" in back.stdout
    assert _aliases(mlflow_server, name)["champion"] == "2"


def test_a_failed_register_moves_no_alias(contenders, mlflow_server: str, tmp_path: Path) -> None:
    name = "adaptbert-failure"
    assert _cli(contenders["better"], mlflow_server, name, "register").returncode == 0
    broken = copy_project(contenders["worse"], tmp_path)
    (broken.finetuned / "heads.safetensors").write_bytes(b"not a safetensors file")
    failed = _cli(broken, mlflow_server, name, "register")
    assert failed.returncode != 0
    assert _aliases(mlflow_server, name) == {"champion": "1", "challenger": "1"}
    from mlflow import MlflowClient

    assert len(MlflowClient(mlflow_server).search_model_versions(f"name = '{name}'")) == 1


def test_a_champion_whose_model_files_are_gone_does_not_block_a_servable_challenger(
    contenders, mlflow_server: str
) -> None:
    """Was: the gate compared against a champion that serving could no longer load ("No such artifact") and kept it."""
    from mlflow import MlflowClient
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    name = "adaptbert-lost-files"
    assert _cli(contenders["better"], mlflow_server, name, "register").returncode == 0
    client = MlflowClient(mlflow_server)
    uri = client.get_model_version_download_uri(name, "1")
    get_artifact_repository(uri, tracking_uri=mlflow_server).delete_artifacts()  # mlflow-artifacts:/ resolves on it
    refused = _cli(contenders["better"], mlflow_server, name, "serve")  # was: MLflow's "No such artifact: ''"
    assert refused.returncode == 1 and "serve failed: version 1 of 'adaptbert-lost-files' (champion) cannot be" in (
        refused.stderr
    ), refused.stderr[-2000:]
    assert "its model files are gone" in refused.stderr and "Traceback" not in refused.stderr
    worse = _cli(contenders["worse"], mlflow_server, name, "register")  # would fail the gate against version 1
    assert worse.returncode == 0, worse.stderr[-3000:]
    assert _aliases(mlflow_server, name) == {"champion": "2", "challenger": "2"}
    report = json.loads(contenders["worse"].promotion_report.read_text())
    assert report["promoted"] and report["champion_before"] == "1"
    assert report["reason"].startswith("the champion (version 1) cannot be served: its model files are gone")
    assert _tags(mlflow_server, name, "2")["promotion.reason"] == report["reason"]
    assert _tags(mlflow_server, name, "1")["serving.problem"].startswith("its model files are gone")


def test_a_password_in_the_tracking_uri_is_in_no_output(contenders, mlflow_server: str, tmp_path: Path) -> None:
    """``http://user:password@host`` reaches the server, and neither the console, the reports nor the project's
    files (run context, logs) hold the password; an unreachable one is named without it."""
    secret = "s3cr3t-pw"
    with_password = mlflow_server.replace("http://", f"http://alice:{secret}@")
    project = copy_project(contenders["better"], tmp_path / "project")
    done = _cli(project, with_password, "adaptbert-secret", "register")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(project.promotion_report.read_text())["tracking_uri"] == mlflow_server
    dead = f"http://alice:{secret}@127.0.0.1:{free_port()}"
    failed = _cli(project, dead, "adaptbert-secret", "register")
    assert failed.returncode == 4 and dead.replace(f"alice:{secret}@", "") in failed.stderr
    for proc in (done, failed):
        assert secret not in proc.stdout + proc.stderr
    leaked = [p for p in project.root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == []


def test_concurrent_registers_end_with_a_consistent_champion(contenders, mlflow_server: str) -> None:
    name = "adaptbert-race"
    procs = {k: _cli(contenders[k], mlflow_server, name, "register", wait=False) for k in ("worse", "better")}
    for key, proc in procs.items():
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{key}: {err[-3000:]}"
    reports = {k: json.loads(contenders[k].promotion_report.read_text()) for k in procs}
    better, worse = reports["better"]["version"], reports["worse"]["version"]
    assert _aliases(mlflow_server, name)["champion"] == better  # whichever came first, the better model wins
    previous = _tags(mlflow_server, name, better)["previous_champion"]
    assert previous in ("", worse)
    assert reports["worse"]["promoted"] == (previous == worse)  # worse was champion only if it came first


@pytest.fixture(scope="module")
def served(contenders, mlflow_server: str, tmp_path_factory: pytest.TempPathFactory):
    """`adaptbert serve` of the champion of a fresh registered model."""
    name = "adaptbert-serve"
    params = contenders["better"].root / "params-fill-mask.yaml"
    write_params(
        params,
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        **GATE,
        **{"register.model_name": name, "register.log_fill_mask": True, "register.serve.max_body_bytes": 200_000},
    )
    cli = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(contenders["better"].root)]
    proc = subprocess.run(
        [*cli, "register"],
        cwd=ROOT,
        env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = [*cli, "serve"]
    with _serving(name, mlflow_server, tmp_path_factory.mktemp("serve") / "serve.log", ours) as url:
        yield name, url


@contextlib.contextmanager
def _serving(name: str, server: str, log: Path, command: list[str] | None = None) -> Iterator[str]:
    """``command`` (``adaptbert serve``; default `mlflow models serve` of ``name@champion``) on a free port; yields its
    URL."""
    port = free_port()
    mlflow = [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{name}@champion", "--env-manager"]
    argv = [*command, "--port", str(port)] if command else [*mlflow, "local", "-h", "127.0.0.1", "-p", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_TRACKING_URI": server}
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/ping", proc, log, seconds=180)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


REQUEST = [
    {"task": "role", "text": "Patients were randomised to receive the study drug or placebo."},
    {"task": "pair", "text": "The drug reduced pain.", "text_pair": "Pain was lower with the drug."},
    {"task": "ner", "text": "Patients with chronic hypertension received 20 mg of the study drug daily."},
    {
        "task": "qa",
        "question": "What dose was given?",
        "context": "Patients received 20 mg of the study drug daily for six weeks.",
    },
]


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{url}/invocations", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_served_champion_answers_every_task_type(served, mlflow_server: str, tmp_path: Path) -> None:
    import mlflow

    name, url = served
    status, body = _post(url, {"dataframe_records": REQUEST})
    assert status == 200, body
    role, pair, ner, qa = body["predictions"]
    assert role["task"] == "role" and role["label"] in ("BACKGROUND", "OBJECTIVE", "METHODS", "RESULTS", "CONCLUSIONS")
    assert 0 < role["score"] <= 1 and role["entities"] is None and role["answer"] is None
    assert pair["label"] is not None and 0 < pair["score"] <= 1
    assert isinstance(ner["entities"], list) and ner["label"] is None
    for e in ner["entities"]:
        assert REQUEST[2]["text"][e["start"] : e["end"]] == e["text"]
    context = REQUEST[3]["context"]
    assert qa["answer"] == context[qa["answer_start"] : qa["answer_end"]] and qa["label"] is None

    mlflow.set_tracking_uri(mlflow_server)
    champion = mlflow.pyfunc.load_model(f"models:/{name}@champion", dst_path=str(tmp_path))
    local = champion.predict(pd.DataFrame(REQUEST)).to_dict("records")
    for mine, theirs in zip(local, body["predictions"], strict=True):  # the same answers in process as over HTTP
        assert {k: mine[k] for k in ("task", "label", "answer", "answer_start", "answer_end")} == {
            k: theirs[k] for k in ("task", "label", "answer", "answer_start", "answer_end")
        }
        assert mine["score"] == pytest.approx(theirs["score"]) if theirs["score"] is not None else mine["score"] is None
        assert [e["text"] for e in mine["entities"] or []] == [e["text"] for e in theirs["entities"] or []]


def test_a_body_too_big_or_too_deep_is_refused_before_the_model_sees_it(served) -> None:
    """Was (`mlflow models serve`): a 30 MB body answered after 36 s, JSON nested 100,000 deep an HTTP 500."""
    _name, url = served
    too_big = {"dataframe_records": [{**REQUEST[0], "text": "word " * 50_000}]}
    status, body = _post(url, too_big)
    assert status == 413 and "is 250," in body["message"] and "register.serve.max_body_bytes" in body["message"]
    deep = b'{"dataframe_records": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    req = urllib.request.Request(f"{url}/invocations", data=deep, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=60)
    assert info.value.code == 400
    assert json.loads(info.value.read())["message"].startswith("the request's JSON nests 50001 levels deep; at most 32")
    assert _post(url, {"dataframe_records": REQUEST})[0] == 200  # and the server still answers


def test_every_answer_names_the_model_version_and_variant(served, mlflow_server: str) -> None:
    name, url = served
    req = urllib.request.Request(
        f"{url}/invocations", data=json.dumps({"dataframe_records": REQUEST[:1]}).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as answer:
        named = {k: answer.headers[f"X-Adaptbert-{k}"] for k in ("Model", "Version", "Variant")}
    assert named == {"Model": name, "Version": _aliases(mlflow_server, name)["champion"], "Variant": "full"}


def test_predict_answers_one_row_in_process_naming_the_version(served, contenders, mlflow_server: str) -> None:
    name, _url = served
    done = _cli(contenders["better"], mlflow_server, name, "predict", "role", "--text", REQUEST[0]["text"])
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    champion = _aliases(mlflow_server, name)["champion"]
    assert (answer["model"], answer["version"], answer["variant"], answer["task"]) == (name, champion, "full", "role")
    assert 0 < answer["score"] <= 1 and "entities" not in answer and "answer" not in answer  # nulls left out
    bad = _cli(contenders["better"], mlflow_server, name, "predict", "qa", "--question", "What dose was given?")
    assert bad.returncode == 2 and "'context' must be a non-empty string" in bad.stderr, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr


def test_bad_requests_get_a_400_naming_what_is_wrong_and_no_traceback(served) -> None:
    """A lone surrogate MLflow's parser refuses (a 400 naming it) before the model sees it; a question too long for
    a window is that row's own error, the good row beside it answered. In every request format, no trace and no
    echo of the request reach the client."""
    _name, url = served
    for body_format in ("dataframe_records", "inputs"):
        status, body = _post(url, {body_format: [REQUEST[0], {"task": "role", "text": "dose \ud83d daily"}]})
        assert status == 400 and "surrogates not allowed" in body["message"], (body_format, body)
        assert "stack_trace" not in body and "Traceback" not in json.dumps(body), (body_format, body)
        long_question = {"task": "qa", "question": "dose " * 300, "context": "Patients received 20 mg."}
        status, body = _post(url, {body_format: [REQUEST[0], long_question]})
        good, bad = body["predictions"]
        assert status == 200 and good["label"] and good["error"] is None, (body_format, body)
        assert bad["error"].startswith("row 1 (task 'qa', extractive_qa): 'question' is 300 tokens"), bad
        assert bad["answer"] is None and "Traceback" not in json.dumps(body)


def test_the_adapted_encoder_round_trips_as_a_fill_mask_model(
    served, contenders, mlflow_server: str, tmp_path: Path
) -> None:
    import mlflow

    uri = json.loads(contenders["better"].promotion_report.read_text())["fill_mask_model_uri"]
    mlflow.set_tracking_uri(mlflow_server)
    fill = mlflow.transformers.load_model(uri, dst_path=str(tmp_path))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(contenders["better"].dapt)
    guesses = fill(f"patients received the {tok.mask_token} daily.")
    assert len(guesses) == 5 and all(0 <= g["score"] <= 1 and g["token_str"] for g in guesses)


def test_the_served_model_names_a_bad_row(served) -> None:
    """A bad row among good ones: its own error, the others answered (HTTP 200); a request of bad rows only: a 400
    whose message is the model's (which row, which field), not MLflow's echo of the request."""
    _, url = served
    status, body = _post(url, {"dataframe_records": [REQUEST[0], {"task": "qa", "question": "Which dose?"}]})
    assert status == 200 and body["predictions"][0]["label"] and body["predictions"][0]["error"] is None
    said = "row 1 (task 'qa', extractive_qa): 'context' must be a non-empty string, got None"
    assert body["predictions"][1]["error"] == said
    status, body = _post(url, {"dataframe_records": [{"task": "qa", "question": "Which dose?"}]})
    assert status == 400 and body["message"] == said.replace("row 1", "row 0")


# ----------------------------------------------------------------------------- compressed variants

TWO_VARIANTS = {**TINY_COMPRESS, "compress.variants": ["int8", "distilled"]}


@pytest.fixture(scope="module")
def with_variants(contenders, mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Paths, dict]:
    """The better model compressed (int8, distilled) and registered with its variants on a fresh model name."""
    paths = copy_project(contenders["better"], tmp_path_factory.mktemp("variants"))
    compress.run(make_config(**TINY_PRETRAIN, **TINY_FINETUNE, **TWO_VARIANTS), paths)
    proc = _register_variants(paths, mlflow_server, "adaptbert-variants")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return paths, json.loads(paths.promotion_report.read_text())


def _register_variants(paths: Paths, server: str, name: str) -> subprocess.CompletedProcess:
    """`python -m pipeline register` of the project with its two variants, as model ``name``."""
    params = write_params(
        paths.root / "params-variants.yaml",
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        **GATE,
        **TWO_VARIANTS,
        **{"register.model_name": name},
    )
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(paths.root), "register"],
        cwd=ROOT,
        env={**os.environ, "MLFLOW_TRACKING_URI": server},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_register_without_a_variants_files_names_the_folder_and_moves_nothing(
    with_variants, mlflow_server: str, tmp_path: Path
) -> None:
    """Issue 61 (Why 7): `rm -rf models/compressed` then register was `internal error MlflowException ... No such
    artifact: 'int8'`; now exit 3 naming the folder and the stage that writes it, before anything is logged."""
    from mlflow import MlflowClient

    paths, report = with_variants
    name = report["model_name"]
    before = (_aliases(mlflow_server, name), len(MlflowClient(mlflow_server).search_model_versions(f"name = '{name}'")))
    broken = copy_project(paths, tmp_path)
    shutil.rmtree(broken.compressed)
    proc = _register_variants(broken, mlflow_server, name)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "models/compressed/" in proc.stderr and "dvc repro compress" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "MlflowException" not in proc.stderr
    after = (_aliases(mlflow_server, name), len(MlflowClient(mlflow_server).search_model_versions(f"name = '{name}'")))
    assert after == before


def test_servable_variants_are_registered_with_lineage_to_the_full_model(with_variants, mlflow_server: str) -> None:
    paths, report = with_variants
    compression = json.loads(paths.compression_report.read_text())
    servable = [n for n, v in compression["variants"].items() if v["servable"]]
    assert "int8" in servable, compression["variants"]["int8"]["floor"]
    assert list(report["versions"]) == ["full", *servable]
    assert set(report["not_registered"]) == set(compression["variants"]) - set(servable)
    full = report["versions"]["full"]
    assert _tags(mlflow_server, report["model_name"], full)["variant"] == "full"
    tags = _tags(mlflow_server, report["model_name"], report["versions"]["int8"])
    assert tags["variant"] == "int8" and tags["parent_version"] == full
    assert float(tags["compression.size_mb"]) == compression["variants"]["int8"]["size_mb"]
    int8 = compression["variants"]["int8"]
    for task, t in int8["tasks"].items():  # the variant's own test metrics, as the gate and `models list` read them
        assert float(tags[f"primary.{task}.{t['primary']}"]) == pytest.approx(t["value"])
    assert float(tags["mean_primary"]) == pytest.approx(int8["mean_primary"])
    # what a person filters on, no more (was 29-37 tags); every test metric is in the run's lineage.json. The gate's
    # own tags (verdict, reason, and when it promoted: when, over whom, forced) come on top where int8 was the
    # challenger, which depends on its measured speed against the full model's (was a flaky count)
    gate = {k for k in tags if k.startswith(("promotion.", "promoted_at", "previous_champion"))}
    assert len(tags) - len(gate) <= 6 + 5 + 2 * len(int8["tasks"]) + 1, sorted(tags)  # + 1: mean_primary
    compared = json.loads(
        _cli(
            paths,
            mlflow_server,
            report["model_name"],
            "models",
            "compare",
            str(report["versions"]["int8"]),
            full,
            "--json",
        ).stdout
    )
    assert (compared["a"]["variant"], compared["a"]["parent_version"], compared["b"]["variant"]) == (
        "int8",
        full,
        "full",
    )
    assert compared["a"]["size_mb"] == int8["size_mb"] and compared["a"]["p50_ms"] > 0
    listed = {r["metric"]: r for r in compared["metrics"]}
    assert {"role.accuracy", "role.macro_f1", "ner.precision", "qa.exact_match"} <= set(listed)  # from lineage.json
    assert listed["role.macro_f1"]["primary"] and not listed["role.accuracy"]["primary"]

    from huggingface_hub import ModelCard

    printed = _cli(paths, mlflow_server, report["model_name"], "models", "card", report["versions"]["int8"])
    assert printed.returncode == 0, printed.stderr
    card = ModelCard(printed.stdout)  # the Hub's parser: metadata and model-index
    assert card.data.adaptbert["variant"] == "int8" and card.data.adaptbert["parent_version"] == full
    assert {r.task_name: r.metric_value for r in card.data.eval_results} == {
        task: pytest.approx(t["value"], abs=1e-4) for task, t in int8["tasks"].items()
    }
    assert all("ci_low" in g for g in card.data.adaptbert["gains"].values())  # the change against v{full}, with CI
    choice = report["serving"]["choice"]
    assert _aliases(mlflow_server, report["model_name"])["challenger"] == report["versions"][choice]


def test_an_int8_champion_serves_over_http_with_the_full_models_labels(
    with_variants, mlflow_server: str, tmp_path: Path
) -> None:
    from pipeline.serving.service import Predictor, requests_from_tasks

    paths, report = with_variants
    name, int8 = report["model_name"], report["versions"]["int8"]
    forced = _cli(paths, mlflow_server, name, "models", "promote", int8, "--force")
    assert forced.returncode == 0, forced.stderr
    assert _aliases(mlflow_server, name)["champion"] == int8
    requests = requests_from_tasks(paths.tasks, per_task=1000)
    requests = requests[requests["task"].isin(["role", "pair"])]  # every test example of the labelled tasks
    full = Predictor(paths.finetuned, 128, 32).predict(requests)
    # the champion's own answers, batched as the server batches (evaluate.batch_size): dynamic INT8 scales
    # its activations per batch, so another batching may flip this tiny model's near-tied predictions
    batch = make_config().evaluate.batch_size
    local = Predictor(paths.compressed / "int8", 128, 32, batch_size=batch).predict(requests)
    with _serving(name, mlflow_server, tmp_path / "serve.log") as url:
        records = json.loads(requests.to_json(orient="records"))
        status, body = _post(url, {"dataframe_records": records})
    assert status == 200, body
    served = [p["label"] for p in body["predictions"]]
    # over HTTP the champion answers as the INT8 model does here, in the full model's label names
    same = sum(a == b for a, b in zip(served, local["label"], strict=True)) / len(served)
    assert len(served) > 100 and same >= 0.99, same
    assert set(served) <= set(full["label"]) | set(local["label"]) and set(served) & set(full["label"])
