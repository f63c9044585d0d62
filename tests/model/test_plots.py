"""The DVC plots tell the truth: every file `dvc plots show` is pointed at has a value in every plotted cell.

DVC's Vega templates draw an empty CSV cell as 0; a file that mixed training rows and evaluation rows
once drew saw-tooths falling to zero. :func:`empty_plotted_cells` is also run on the end-to-end
project in ``tests/e2e/test_dvc_pipeline.py``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

from pipeline.training.callbacks import CurveLogger, Series

ROOT = Path(__file__).resolve().parents[2]


def plotted_columns(root: Path) -> dict[Path, set[str]]:
    """Every data file (CSV) the top-level ``plots`` of ``root/dvc.yaml`` draw, with the columns drawn from it."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    files: dict[Path, set[str]] = {}
    for entry in spec.get("plots", []):
        for definition in entry.values():
            x = definition.get("x")
            for file, columns in definition["y"].items():
                cols = {columns} if isinstance(columns, str) else set(columns)
                files.setdefault(root / file, set()).update(cols | ({x} if isinstance(x, str) else set()))
    return files


def empty_plotted_cells(root: Path) -> list[str]:
    """``file:line: column`` for every missing file, missing column or empty cell among the plotted ones."""
    problems = []
    for path, columns in plotted_columns(root).items():
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            absent = columns - set(reader.fieldnames or [])
            problems += [f"{path}: no column {c}" for c in sorted(absent)]
            for line, row in enumerate(reader, start=2):
                problems += [f"{path}:{line}: {c} is empty" for c in sorted(columns - absent) if not row[c]]
    return problems


def test_the_committed_default_runs_plots_have_no_empty_cell() -> None:
    files = plotted_columns(ROOT)
    assert len(files) >= 5  # pretraining loss and perplexity, fine-tuning loss and dev metric of both models
    assert empty_plotted_cells(ROOT) == []


def test_the_check_fails_on_an_empty_cell_and_on_a_missing_column(tmp_path: Path) -> None:
    (tmp_path / "dvc.yaml").write_text(
        "plots:\n  - loss:\n      x: step\n      y:\n        a.csv: loss\n        b.csv: [loss, eval_loss]\n"
    )
    (tmp_path / "a.csv").write_text("step,loss\n1,0.5\n2,\n")
    (tmp_path / "b.csv").write_text("step,loss\n1,0.5\n")
    assert empty_plotted_cells(tmp_path) == [
        f"{tmp_path / 'a.csv'}:3: loss is empty",
        f"{tmp_path / 'b.csv'}: no column eval_loss",
    ]


def test_the_curve_logger_writes_one_dense_file_per_kind_of_log(tmp_path: Path) -> None:
    """Training logs and evaluation logs arrive as separate dicts; each lands in its own file, whole."""

    class State:
        is_world_process_zero, global_step = True, 0

    logger = CurveLogger(tmp_path, (Series("train", ("loss",)), Series("eval", ("eval_loss", "eval_perplexity"))))
    state = State()
    for step, logs in [(1, {"loss": 2.0}), (2, {"loss": 1.5}), (2, {"eval_loss": 1.0, "eval_perplexity": 2.7})]:
        state.global_step = step
        logger.on_log(None, state, None, logs=logs)
    assert (tmp_path / "train.csv").read_text().splitlines() == ["step,loss", "1,2.0", "2,1.5"]
    assert (tmp_path / "eval.csv").read_text().splitlines() == ["step,eval_loss,eval_perplexity", "2,1.0,2.7"]


def test_labels_from_the_data_are_drawn_as_text_not_tex(tmp_path: Path) -> None:
    """A label with two dollar signs is mathtext to matplotlib: ``$x_1_2$`` (a double subscript) made evaluate raise
    a ValueError after training, and ``$10-$20`` was drawn as TeX; both are text now."""
    from pipeline.core.reports.evaluation import TaskEvaluation
    from pipeline.reporting.figures import use_headless
    from pipeline.reporting.plots import plot_confusions, plot_entity_f1

    use_headless()
    labels = ["$x_1_2$", "$10-$20", "under $5", r"$\frac{$"]
    matrix = [[1, 0, 0, 0], [0, 2, 0, 0], [0, 0, 3, 0], [0, 0, 0, 4]]
    extras = {"price": {"labels": labels, "confusion": {"adapted": matrix}}}
    per_type = {t: {"f1": 0.5} for t in labels}
    ner = TaskEvaluation(
        type="token_classification",
        primary="f1",
        test_examples=10,
        trivial_baseline="all O",
        trivial={"f1": 0.0},
        adapted={"f1": 0.5, "per_type": per_type},
        baseline={"f1": 0.5, "per_type": per_type},
        primary_ci={},
    )
    written = plot_confusions(extras, tmp_path) + plot_entity_f1({"ner": ner}, tmp_path)
    assert written == ["confusion_price.png", "entity_f1_ner.png"]
    assert all((tmp_path / name).stat().st_size > 1000 for name in written)
