"""The one TrainingArguments builder (pipeline/training/arguments.py): shared choices, the warm-up convention."""

from __future__ import annotations

import re

from pipeline.modelling.precision import resolve_precision
from pipeline.training.arguments import training_arguments
from tests.conftest import ROOT


def _args(warmup: float, **specific: object):
    return training_arguments(
        output_dir="/tmp/unused",
        max_steps=300,
        batch_size=16,
        learning_rate=1e-4,
        weight_decay=0.01,
        warmup=warmup,
        lr_schedule="linear",
        max_grad_norm=1.0,
        logging_steps=10,
        eval_steps=100,
        save_steps=100,
        save_total_limit=2,
        seed=13,
        precision=resolve_precision("fp32"),
        bf16_autocast=False,
        **specific,
    )


def test_a_share_below_one_warms_up_that_share_of_the_steps_and_a_count_that_many_steps() -> None:
    """transformers 5 reads ``warmup_steps`` < 1 as a share of the run (fine-tuning's warmup_ratio), >= 1 as steps."""
    assert _args(0.1).get_warmup_steps(300) == 30
    assert _args(0.06).get_warmup_steps(250) == 15  # rounded up: ceil(15.0)
    assert _args(75).get_warmup_steps(300) == 75
    assert _args(0).get_warmup_steps(300) == 0


def test_every_trainer_gets_the_shared_choices_and_its_own_options() -> None:
    args = _args(0.1, optim="adamw_torch_fused", load_best_model_at_end=True, metric_for_best_model="mean_primary")
    assert (args.seed, args.data_seed) == (13, 13)
    assert args.use_cpu and not args.bf16 and args.disable_tqdm and not args.logging_nan_inf_filter
    assert args.dataloader_num_workers == 0 and not args.remove_unused_columns
    assert args.load_best_model_at_end and args.optim == "adamw_torch_fused"
    assert args.report_to in ([], "none", ["none"])  # no MLflow run is active here


def test_no_trainer_builds_its_arguments_elsewhere() -> None:
    built = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "pipeline").rglob("*.py")
        if re.search(r"\bTrainingArguments\(", path.read_text(encoding="utf-8"))
    ]
    assert built == ["pipeline/training/arguments.py"]
