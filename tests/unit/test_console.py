"""Console progress: the same fields as a redrawn bar on a terminal and as plain lines in logs."""

from __future__ import annotations

import argparse
import io
import re

import pytest

from pipeline.core import console
from pipeline.core.console import Progress, duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def no_forced_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADAPTBERT_PROGRESS", raising=False)


def test_durations_read_as_clock_times() -> None:
    assert [duration(s) for s in (0, 7.4, 73, 3725)] == ["0:00", "0:07", "1:13", "1:02:05"]


def test_plain_lines_carry_step_total_fields_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(console.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    p = Progress("pretrain:", 300, "steps", stream=out)
    now[0] = 5.0
    p.update(0)  # t=5 s, after the set-up: the rate starts here
    now[0] = 15.0
    p.update(100, line=True, loss=2.5)  # t=15 s: 10 steps/s, 200 steps left
    lines = out.getvalue().splitlines()
    assert lines == ["pretrain:  100/300 steps (33%)  loss 2.5  10 steps/s  elapsed 0:15  ETA 0:20"]
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()  # logs get no control codes


def test_plain_mode_prints_only_when_asked_or_every_few_seconds() -> None:
    out = io.StringIO()
    p = Progress("tokenize:", 10, "batches", stream=out, every_s=3600)
    for i in range(1, 10):
        p.update(i)
    assert out.getvalue() == ""  # not asked, and an hour has not passed
    p.update(10, line=True)
    p.close()  # the final state was printed already: no second copy
    assert len(out.getvalue().splitlines()) == 1 and "10/10 batches (100%)" in out.getvalue()


def test_a_terminal_gets_a_bar_redrawn_in_place_and_ended_by_a_newline() -> None:
    out = Terminal()
    p = Progress("finetune:", 4, "steps", stream=out)
    for i in range(1, 5):
        p.update(i, loss=1.0)
    p.say("finetune: step 4/4 evaluation: mean_primary 0.8")
    p.close()
    text = out.getvalue()
    assert "\r\x1b[2K[" in text and "########################] finetune:  4/4 steps (100%)" in text
    assert "finetune: step 4/4 evaluation: mean_primary 0.8\n" in text  # a message is a line of its own
    assert text.endswith("\n")


def test_unknown_totals_show_a_count_and_no_eta() -> None:
    out = io.StringIO()
    p = Progress("ingest:", None, "documents", stream=out)
    p.update(5)
    p.update(1500, line=True)
    assert re.fullmatch(r"ingest:  1500 documents  \S+ documents/s  elapsed 0:00\n", out.getvalue())


def test_the_mode_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTBERT_PROGRESS", "bar")
    assert console.is_terminal(io.StringIO())
    monkeypatch.setenv("ADAPTBERT_PROGRESS", "plain")
    assert not console.is_terminal(Terminal())


def test_training_progress_replaces_the_trainers_dict_printer(tmp_path) -> None:
    """The Trainer prints a Python dict per log unless its printer is swapped for ours."""
    import torch
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from pipeline.training.callbacks import TrainingProgress, replace_printer

    args = TrainingArguments(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", use_cpu=True)
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
    assert any(isinstance(c, PrinterCallback) for c in trainer.callback_handler.callbacks)
    replace_printer(trainer, TrainingProgress("pretrain", "training"))
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert PrinterCallback not in kinds and TrainingProgress in kinds


def test_a_missing_mlm_head_is_one_line_of_ours(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.training.pretraining.model import announce_new_weights

    announce_new_weights("minilm", ["cls.predictions.bias", "cls.predictions.transform.dense.weight"])
    announce_new_weights("scratch", [])  # nothing missing: nothing said
    assert capsys.readouterr().err == "pretrain: minilm ships no MLM head: a new one is initialised (2 tensors)\n"


def test_the_cli_silences_what_the_libraries_say_about_expected_things(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.utils import logging as hf_logging

    for var in ("ADAPTBERT_VERBOSE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(var, raising=False)
    level = hf_logging.get_verbosity()
    try:
        console.quiet_libraries()
        assert hf_logging.get_verbosity() == hf_logging.ERROR and not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()


def test_training_lines_name_the_model_where_a_stage_trains_several(capsys: pytest.CaptureFixture[str]) -> None:
    """Was: compress printed "compress:  5/10 steps" for the distilled and the pruned model alike."""
    from types import SimpleNamespace

    from pipeline.training.callbacks import TrainingProgress

    progress = TrainingProgress("compress", "training the distilled model", who="distilled")
    state = SimpleNamespace(is_world_process_zero=True, max_steps=10, global_step=0)
    progress.on_train_begin(None, state, None)
    state.global_step = 5
    progress.on_log(None, state, None, logs={"loss": 0.5})
    progress.on_log(None, state, None, logs={"eval_mean_primary": 0.25})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "compress: training the distilled model"
    assert any(line.startswith("compress (distilled):  5/10 steps") for line in lines), lines
    assert "compress (distilled): step 5/10 evaluation: mean_primary 0.25" in lines


def test_a_stage_help_says_what_it_does_reads_and_writes() -> None:
    """Was one line ("Run the adapt stage (what dvc repro runs).") for every stage (issue 63, item 10)."""
    from pipeline.__main__ import build_parser

    parser = build_parser()
    stages = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    shown = stages["pretrain"].format_help()
    assert "domain-adaptive continued masked-LM pretraining" in shown and "``" not in shown
    assert "reads:  data/tokenized/pretrain, models/tokenizer, data/selection, data/adapt" in shown
    assert "writes: reports/pretrain.json, models/dapt" in shown and "adaptbert config show pretrain" in shown
    assert "config show" not in stages["report"].format_help()  # no params section of that name


def test_the_profile_help_reads_without_docstring_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from flows import profile

    with pytest.raises(SystemExit):
        profile.main(["--help"])
    assert "python -m flows.profile <name>: run, print or apply" in capsys.readouterr().out
