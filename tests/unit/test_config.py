"""Config: strict, typed, every error names the key path, the value and the expectation."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from pipeline.core.config import Config, ConfigError, dump_config, load_config, load_params, parse_config
from tests.conftest import ROOT


def _params() -> dict:
    return load_params(ROOT / "params.yaml")


def test_repository_params_are_valid() -> None:
    cfg = parse_config(_params())
    assert isinstance(cfg, Config)
    assert cfg.ingest.on_error == "fail"
    assert {t.name for t in cfg.ingest.tasks} == {"role", "pair", "ner", "qa"}
    assert cfg.validation.corpus.min_docs == 100  # the "validate" section, under its alias


def test_config_is_frozen() -> None:
    cfg = parse_config(_params())
    with pytest.raises(Exception, match="frozen"):
        cfg.ingest.chunk_docs = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda p: p["ingest"].update(chunk_dox=10), r"ingest\.chunk_dox: got 10; expected: unknown key"),
        (lambda p: p["ingest"].update(chunk_docs="many"), r"ingest\.chunk_docs: got 'many'; expected: .*integer"),
        (
            lambda p: p["ingest"].update(chunk_docs=0),
            r"ingest\.chunk_docs: got 0; expected: .*greater than or equal to 1",
        ),
        (
            lambda p: p["ingest"].update(on_error="ignore"),
            r"ingest\.on_error: got 'ignore'; expected: .*'fail' or 'skip'",
        ),
        (lambda p: p["ingest"]["corpus"]["sources"][0].update(path=3), r"ingest\.corpus\.sources\[0\]\.path: got 3"),
        (
            lambda p: p["ingest"]["tasks"][1].update(type="summarization"),
            r"ingest\.tasks\[1\]\.type: got 'summarization'",
        ),
        (
            lambda p: p["ingest"]["tasks"][0]["fields"].update(txt="x"),
            r"ingest\.tasks\[0\]: .*unknown key\(s\) \['txt'\]",
        ),
        (
            lambda p: p["validate"]["tasks"].update(max_train_overlap=1.5),
            r"validate\.tasks\.max_train_overlap: got 1\.5",
        ),
        (lambda p: p["demo"].pop("seed"), r"demo\.seed: got nothing; expected: required key is missing"),
        (lambda p: p["tokenize"].update(vocab=3), r"tokenize\.vocab: got 3; expected: unknown key"),
        (
            lambda p: p["ingest"]["corpus"].update(min_chars=10**7),
            r"ingest\.corpus: .*min_chars \(10000000\) > max_chars",
        ),
        (lambda p: p["demo"].update(eval_fraction=True), r"demo\.eval_fraction: got True"),
        # issue 19's recipes: n-gram probabilities, adversarial epsilon, windows on a type without them
        (
            lambda p: p["pretrain"].update(masking="ngram", ngram_probs=[0.5, 0.3, 0.1]),
            r"pretrain\.ngram_probs: got \[0\.5, 0\.3, 0\.1\]; expected: .*summing to 1 \(these sum to 0\.9\)",
        ),
        (
            lambda p: p["pretrain"].update(ngram_probs=[1.2, -0.2]),
            r"pretrain\.ngram_probs: .*each >= 0",
        ),
        (
            lambda p: p["finetune"].update(adversarial="fgm", adversarial_epsilon=0),
            r"finetune\.adversarial_epsilon: got 0; expected: .*greater than 0",
        ),
        (
            lambda p: p["finetune"].update(adversarial="pgd", adversarial_epsilon=-1.0),
            r"finetune\.adversarial_epsilon: got -1\.0; expected: .*greater than 0",
        ),
        (lambda p: p["finetune"].update(adversarial="alum"), r"finetune\.adversarial: got 'alum'"),
        (lambda p: p["pretrain"].update(mask_token="synonym"), r"pretrain\.mask_token: got 'synonym'"),
        (
            lambda p: p["finetune"]["tasks"].update(ner={"long_text": "windows"}),
            r"finetune\.tasks\.ner\.long_text: windows applies to .*'ner' is token_classification, which has no such",
        ),
        (
            lambda p: p["finetune"]["tasks"].update(qa={"long_text": "windows"}),
            r"finetune\.tasks\.qa\.long_text: windows .*extractive_qa, which .* \(it always windows its contexts",
        ),
        (
            lambda p: p["finetune"]["tasks"]["role"].update(window_aggregation="median"),
            r"finetune\.tasks\.role\.window_aggregation: got 'median'",
        ),
        # issue 28's corpus selection
        (
            lambda p: p["pretrain"]["selection"].update(k=0),
            r"pretrain\.selection\.k: got 0; expected: .*greater than or equal to 1",
        ),
        (lambda p: p["pretrain"]["selection"].update(mode="random"), r"pretrain\.selection\.mode: got 'random'"),
        (
            lambda p: p["pretrain"].update(
                sentence_objective="nsp", masking="token", selection={**p["pretrain"]["selection"], "mode": "nearest"}
            ),
            r"pretrain: .*selection\.mode: nearest selects masked-LM blocks",
        ),
        # rules between pretrain and what tokenize writes, checked when params load (not when pretrain runs)
        (
            lambda p: p["pretrain"].update(sentence_objective="sop", masking="token"),
            r"pretrain\.sentence_objective: sop needs sentence pairs: set tokenize\.sentence_pairs: true",
        ),
        (
            lambda p: p["tokenize"].update(whole_word=False),
            r"pretrain\.masking: whole_word needs word ids: set tokenize\.whole_word: true",
        ),
        (
            lambda p: (
                p["pretrain"].update(sentence_objective="sop", masking="token", task_text=True),
                p["tokenize"].update(sentence_pairs=True),
            ),
            r"pretrain: .*task_text: true trains on masked-LM blocks; it does not combine with sentence_objective: sop",
        ),
        # issue 28's decontamination thresholds (in (0, 1]) and time budgets (> 0)
        (
            lambda p: p["ingest"]["decontamination"].update(threshold=1.5),
            r"ingest\.decontamination\.threshold: got 1\.5; expected: .*less than or equal to 1",
        ),
        (
            lambda p: p["ingest"]["near_duplicates"].update(threshold=0),
            r"ingest\.near_duplicates\.threshold: got 0; expected: .*greater than 0",
        ),
        (
            lambda p: p["pretrain"].update(budget_minutes=0),
            r"pretrain\.budget_minutes: got 0; expected: .*greater than 0",
        ),
        (
            lambda p: p["search"].update(budget_minutes=-5),
            r"search\.budget_minutes: got -5; expected: .*greater than 0",
        ),
        (lambda p: p["finetune"].update(baseline_budget="same_time"), r"finetune\.baseline_budget: got 'same_time'"),
        # issue 61: a search range a trial could not use, and a search of no model, are refused at load
        (
            lambda p: p["search"].update(space={"dropout": {"low": 1.5, "high": 2.0}}),
            r"search: .*space\.dropout: 1\.5 is not a value finetune\.dropout accepts \(input should be less than 1",
        ),
        (
            lambda p: p["search"].update(space={"max_steps": {"low": 0.4, "high": 0.45, "log": True}}),
            r"space\.max_steps: 0\.4 \(a trial sets 0\) is not a value finetune\.max_steps accepts",
        ),
        (
            lambda p: p["search"].update(task_space={"ner": {"sampling_weight": {"low": -1, "high": 2}}}),
            r"task_space\.ner\.sampling_weight: -1 is not a value finetune\.tasks\.ner\.sampling_weight accepts",
        ),
        (
            lambda p: (p["search"].update(enabled=True, models=["baseline"]), p["finetune"].update(baseline=False)),
            r"search\.models: \['baseline'\] names no model finetune trains",
        ),
        (
            lambda p: p["pretrain"]["selection"].update(k=100_000_000),
            r"pretrain\.selection\.k: got 100000000; expected: .*less than or equal to 1000",
        ),
        (
            lambda p: p["register"].update(model_name="bert<img src=x onerror=alert(1)>"),
            r"register\.model_name: .*markup characters \['<', '>'\] are refused in model names",
        ),
        # an epochs budget: positive, and for every task or none
        (lambda p: p["finetune"].update(epochs=0), r"finetune\.epochs: got 0; expected: .*greater than 0"),
        (
            lambda p: p["finetune"]["tasks"]["ner"].update(epochs=10),
            r"finetune\.tasks\.<name>\.epochs is set for some tasks but not for \['role', 'pair', 'qa'\]",
        ),
        (
            lambda p: p["finetune"]["tasks"]["ner"].update(decoding="beam"),
            r"finetune\.tasks\.ner\.decoding: got 'beam'; expected: .*'viterbi' or 'argmax'",
        ),
    ],
)
def test_bad_values_name_key_value_and_expectation(mutate, expected: str) -> None:
    params = _params()
    mutate(params)
    with pytest.raises(ConfigError, match=expected):
        parse_config(params)


@pytest.mark.parametrize(
    ("mutate", "said"),
    [
        (
            lambda p: p["pretrain"].update(max_stepz=5),
            "pretrain.max_stepz: got 5; expected: unknown key; did you mean 'max_steps'?",
        ),
        (lambda p: p.update(finetun={}), "finetun: got {...}; expected: unknown key; did you mean 'finetune'?"),
        (
            lambda p: p["register"]["serve"].update(max_body_byte=1),
            "did you mean 'max_body_bytes'?",
        ),  # an aliased section
        (
            lambda p: p["finetune"]["tasks"]["ner"].update(epochz=3),
            "finetune.tasks.ner.epochz: got 3; expected: unknown key; did you mean 'epochs'?",
        ),
        (
            lambda p: p["pretrain"].update(zzzz=1),
            "pretrain.zzzz: got 1; expected: unknown key (see params.yaml for the allowed keys)",
        ),
    ],
)
def test_an_unknown_key_gets_the_closest_allowed_one(mutate, said: str) -> None:
    params = _params()
    params["finetune"]["tasks"].setdefault("ner", {})
    mutate(params)
    with pytest.raises(ConfigError) as info:
        parse_config(params)
    assert said in str(info.value)


def test_a_mistyped_command_or_section_gets_the_closest_one() -> None:
    def stderr(*argv: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "pipeline", *argv], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2
        return proc.stderr

    assert "invalid choice: 'pretrian'; did you mean 'pretrain'?" in stderr("pretrian")
    assert "invalid choice: 'lsit'; did you mean 'list'?" in stderr("models", "lsit")
    said = stderr("config", "show", "pretrainn")
    assert said.startswith("config failed: config show pretrainn: no such section; did you mean 'pretrain'?"), said


def test_cli_exits_2_and_names_the_key(tmp_path) -> None:
    params = _params()
    params["validate"]["corpus"]["min_docs"] = -5
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "--params", str(bad), "config", "show"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "validate.corpus.min_docs: got -5" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_show_round_trips() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "config", "show"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    shown = yaml.safe_load(proc.stdout)
    assert parse_config(shown) == parse_config(_params())
    assert dump_config(parse_config(shown)) == proc.stdout


def test_exponent_floats_written_by_dvc_are_floats(tmp_path) -> None:
    """`dvc exp run -S pretrain.learning_rate=5.0e-5` makes DVC (ruamel, YAML 1.2) write `5e-05`, which
    YAML 1.1 (PyYAML) reads as a string; params files are read with YAML 1.2 floats."""
    from pipeline.core.config import load_config

    text = (
        (ROOT / "params.yaml").read_text(encoding="utf-8").replace("learning_rate: 3.0e-4 ", "learning_rate: 5e-05 ", 1)
    )
    (tmp_path / "params.yaml").write_text(text, encoding="utf-8")
    assert load_config(tmp_path / "params.yaml").pretrain.learning_rate == 5e-05
    assert load_params(tmp_path / "params.yaml")["demo"]["seed"] == 13  # ints stay ints


def test_a_rule_across_sections_is_one_line_that_starts_with_its_key() -> None:
    """Config's own validators (no key path of their own) print their message as is, not under '<root>'."""
    params = _params()
    params["finetune"]["tasks"]["ner"] = {"long_text": "windows"}
    with pytest.raises(ConfigError) as err:
        parse_config(params)
    assert str(err.value).splitlines()[1].startswith("  finetune.tasks.ner.long_text: windows applies to")


def test_an_alias_bomb_is_refused_at_once_and_a_huge_value_is_shown_short(tmp_path) -> None:
    """Nine levels of anchors used nine times each expand to 9^9 values: refused before anything is built (it took
    ~50 s and 3 GB, most of it printing the value); a large value that does parse is shown in at most 80 characters."""
    import time

    text = (ROOT / "params.yaml").read_text(encoding="utf-8")
    levels = 'l0: &l0 ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    (tmp_path / "bomb.yaml").write_text(levels + text.replace("\nseed: 13", "\nseed: *l8", 1), encoding="utf-8")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb\.yaml: not valid YAML: it expands to more than 100,000 values"):
        load_config(tmp_path / "bomb.yaml")
    assert time.perf_counter() - start < 5
    big = text.replace("\nseed: 13", "\nseed: [" + ", ".join(["[1, 2, 3, 4, 5, 6, 7, 8]"] * 5000) + "]", 1)
    (tmp_path / "big.yaml").write_text(big, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "big.yaml")
    (line,) = [x for x in str(info.value).splitlines() if x.strip().startswith("seed:")]
    assert len(line) < 200


def test_an_impossible_corpus_range_and_a_params_fifo_are_named_as_what_they_are(tmp_path) -> None:
    import os

    with pytest.raises(ConfigError, match=r"median_chars_min \(900\.0\) is above median_chars_max \(800\.0\)"):
        load_config(
            ROOT / "params.yaml",
            {"validate.corpus.median_chars_min": 900, "validate.corpus.median_chars_max": 800},
        )
    os.mkfifo(tmp_path / "params.yaml")
    with pytest.raises(ConfigError, match=r"params\.yaml: is not a regular file \(a pipe or device\?\)"):
        load_config(tmp_path / "params.yaml")


def test_the_model_cards_license_and_language_are_checked_when_params_are_read() -> None:
    from pipeline.core.errors import ConfigError
    from tests.conftest import make_config

    assert make_config(**{"register.card.language": ["zh"]}).registration.card.language == ["zh"]
    with pytest.raises(ConfigError, match=r"register\.card\.language"):
        make_config(**{"register.card.language": ["English"]})
    with pytest.raises(ConfigError, match=r"register\.card\.license"):
        make_config(**{"register.card.license": "Apache 2.0 <b>"})
