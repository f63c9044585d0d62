"""The multi-task model and what trains it: task sampling, length buckets, layer-wise LR decay.

One shared BERT encoder, one head per task from :data:`pipeline.tasks.registry.REGISTRY`. Every batch
holds examples of a single task (MT-DNN); which task comes next is drawn by
:class:`MultiTaskBatchSampler` with proportional, temperature (jiant's
``TemperatureMultiTaskSampler``) or fixed probabilities. Within a task, batches are built from
length buckets so that dynamic padding wastes little.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.core.errors import DataError
from pipeline.modelling.precision import Precision
from pipeline.tasks.spec import TaskSpec

# ----------------------------------------------------------------------------- model


class MultiTaskModel(nn.Module):
    """Shared encoder + ``heads[task]``; ``forward(task=..., ...)`` runs one task's batch."""

    accepts_loss_kwargs = False  # the Trainer must not pass num_items_in_batch: each head averages its own loss

    def __init__(
        self,
        encoder: nn.Module,
        specs: Sequence[TaskSpec],
        dropout: float,
        class_weights: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.specs = {s.name: s for s in specs}
        hidden = int(encoder.config.hidden_size)
        self.heads = nn.ModuleDict({s.name: s.kind.make_head(hidden, s, dropout) for s in specs})
        for name, weight in (class_weights or {}).items():
            self.register_buffer(f"class_weight_{name}", weight.float(), persistent=False)

    def forward(
        self,
        task: str,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        window_example: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        logits = self.heads[task](hidden, attention_mask)
        if window_example is not None:  # long_text: windows: one row per window -> one logit row per example
            logits = aggregate_windows(logits, window_example, self.specs[task].settings.window_aggregation)
        out = {"logits": logits}
        targets = {
            k: v
            for k, v in (("labels", labels), ("start_positions", start_positions), ("end_positions", end_positions))
            if v is not None
        }
        if targets:
            spec = self.specs[task]
            weight = getattr(self, f"class_weight_{task}", None)
            out["loss"] = spec.settings.loss_weight * spec.kind.loss(logits, targets, weight)
        return out


def aggregate_windows(logits: torch.Tensor, window_example: torch.Tensor, how: str) -> torch.Tensor:
    """Per-example logits from per-window ones: the ``mean`` or element-wise ``max`` over each example's windows
    (``window_example[i]``: the example of window row ``i``; examples numbered 0..n-1, each with a window)."""
    n = int(window_example.max()) + 1
    index = window_example.unsqueeze(1).expand_as(logits)
    # the start value is ignored (include_self=False), but amax's backward splits the gradient between ties with it
    start = logits.new_zeros if how == "mean" else lambda shape: logits.new_full(shape, float("-inf"))
    reduce = "mean" if how == "mean" else "amax"
    return start((n, logits.shape[1])).scatter_reduce(0, index, logits, reduce=reduce, include_self=False)


def load_encoder(source: str | Path, key: str = "encoder") -> nn.Module:
    """A ``BertModel`` (no pooler: the heads pool) from a BERT checkpoint of any head type; ``key`` names where it
    came from in messages (a params key, or what it is)."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    from pipeline.modelling.models import check_bert

    check_bert(source, key)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report lists the MLM head the encoder drops: expected, not news
    try:  # (progress bars: pipeline.core.console.quiet_libraries decides, once per process)
        return AutoModel.from_pretrained(
            source, add_pooling_layer=False, use_safetensors=True, attn_implementation="sdpa", dtype=torch.float32
        )
    finally:
        hf_logging.set_verbosity(level)


def head_shapes_problem(shapes: dict[str, tuple[int, ...]], specs: Sequence[TaskSpec]) -> str | None:
    """Why heads with these weight ``shapes`` do not fit ``specs`` (label counts), or ``None``."""
    for spec in specs:
        if not spec.kind.labelled:
            continue
        key = f"heads.{spec.name}.out.weight"
        if key not in shapes:
            return f"it has no head for task '{spec.name}'"
        if shapes[key][0] != spec.num_labels:
            return (
                f"its head for task '{spec.name}' has {shapes[key][0]} labels but the task now has {spec.num_labels} "
                f"({spec.labels})"
            )
    return None


def save_multitask(model: MultiTaskModel, tok: Any, out: Path, card: str) -> None:
    """``out/encoder/`` (HF BertModel), ``out/heads.safetensors``, the tokenizer, ``tasks.json`` and a model card."""
    from safetensors.torch import save_file

    model.encoder.save_pretrained(out / "encoder")
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in model.heads.state_dict().items()}, str(out / "heads.safetensors")
    )
    tok.save_pretrained(out)
    tasks = [
        {"name": s.name, "type": s.type, "labels": s.labels, "settings": s.settings.model_dump()}
        for s in model.specs.values()
    ]
    (out / "tasks.json").write_text(json.dumps(tasks, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "README.md").write_text(card, encoding="utf-8")


def read_specs(model_dir: Path) -> list[TaskSpec]:
    """The task specs a saved model (full or compressed) was trained with: its ``tasks.json``."""
    from pipeline.core.io import damaged_input
    from pipeline.core.sections.finetune import FinetuneTaskConfig

    path = model_dir / "tasks.json"
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(tasks, list) or not tasks:
            raise ValueError(f"expected a list of tasks, found {str(tasks)[:60]}")
        return [TaskSpec(t["name"], t["type"], t["labels"], FinetuneTaskConfig(**t["settings"])) for t in tasks]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as err:  # truncated, garbled or edited by hand
        what = f"{type(err).__name__}: {str(err)[:160]}"
        raise damaged_input(path, "corrupt-model", f"the model's task list cannot be read ({what})") from None


def load_multitask(model_dir: Path) -> tuple[MultiTaskModel, Any]:
    """The model and tokenizer written by :func:`save_multitask` (a compressed variant loads through
    :func:`pipeline.compression.variants.load_model`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    specs = read_specs(model_dir)
    try:
        model = MultiTaskModel(load_encoder(model_dir / "encoder", "the fine-tuned model"), specs, dropout=0.0)
        model.heads.load_state_dict(load_file(str(model_dir / "heads.safetensors")))
    except (OSError, RuntimeError, SafetensorError) as err:  # missing, truncated or mismatched weight files
        raise DataError(
            model_dir, None, "corrupt-model", f"cannot load the model in {model_dir}: {str(err)[:300]}; re-run finetune"
        ) from None
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


# ----------------------------------------------------------------------------- optimisation


def llrd_param_groups(model: MultiTaskModel, lr: float, decay: float, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups with layer-wise LR decay (ELECTRA / ULMFiT style).

    Depth 0 is the embeddings, 1..L the encoder layers, L+1 the heads; a parameter at depth d
    gets ``lr * decay ** (L + 1 - d)``: heads at the full LR, the embeddings lowest. Biases and
    LayerNorm weights get no weight decay.
    """
    layers = int(model.encoder.config.num_hidden_layers)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("encoder.embeddings."):
            depth = 0
        elif name.startswith("encoder.encoder.layer."):
            depth = int(name.split(".")[3]) + 1
        else:  # heads (and anything above the layers)
            depth = layers + 1
        no_decay = param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name
        group = groups.setdefault(
            (depth, no_decay),
            {
                "params": [],
                "names": [],
                "depth": depth,
                "lr": lr * decay ** (layers + 1 - depth),
                "weight_decay": 0.0 if no_decay else weight_decay,
            },
        )
        group["params"].append(param)
        group["names"].append(name)
    return [groups[k] for k in sorted(groups, reverse=True)]  # heads first: the Trainer logs the first group's LR


# ----------------------------------------------------------------------------- sampling and batching


def task_probabilities(
    sizes: dict[str, int], sampling: str, temperature: float = 1.0, weights: dict[str, float] | None = None
) -> dict[str, float]:
    """Probability that the next batch comes from each task.

    proportional: p ~ n_task; temperature: p ~ n_task ** (1 / T) (T = 1 proportional, T -> inf
    uniform, as in jiant); fixed: p ~ the given weights.
    """
    if sampling == "proportional":
        raw = {t: float(n) for t, n in sizes.items()}
    elif sampling == "temperature":
        raw = {t: float(n) ** (1.0 / temperature) for t, n in sizes.items()}
    elif sampling == "fixed":
        raw = {t: float((weights or {}).get(t, 1.0)) for t in sizes}
    else:
        raise ValueError(f"unknown sampling '{sampling}'")
    total = sum(raw.values())
    return {t: v / total for t, v in raw.items()}


@dataclass(frozen=True)
class StepPlan:
    """How many optimiser steps a fine-tuning run takes and how they are shared between its tasks."""

    max_steps: int
    probs: dict[str, float]  # task -> probability that the next batch is one of its
    sizes: dict[str, int]  # task -> train examples
    batch_size: int
    needed_steps: int  # what the epochs budget asks for (max_steps caps it); a step budget: max_steps

    @property
    def epochs(self) -> dict[str, float]:
        """Task -> expected passes over its train examples in ``max_steps``."""
        return {t: self.max_steps * p * self.batch_size / max(self.sizes[t], 1) for t, p in self.probs.items()}

    def describe(self) -> str:
        """``rct 2.0, ncbi_disease 10.0 epochs`` (expected passes per task)."""
        return ", ".join(f"{t} {e:.1f}" for t, e in self.epochs.items()) + " epochs"

    def capped(self) -> str | None:
        """Why the run trains fewer steps than its epochs budget asks for, or None."""
        if self.needed_steps <= self.max_steps:
            return None
        return (
            f"finetune.max_steps ({self.max_steps}) caps the epochs budget ({self.needed_steps} steps): the tasks get "
            f"{self.describe()}; raise max_steps to train them all"
        )


def plan_steps(
    sizes: dict[str, int],
    batch_size: int,
    max_steps: int,
    epochs: dict[str, float] | None,
    sampling: str,
    temperature: float = 1.0,
    weights: dict[str, float] | None = None,
) -> StepPlan:
    """The step budget and task shares of one run.

    ``epochs`` None: ``max_steps`` steps shared by ``sampling`` (:func:`task_probabilities`). ``epochs`` (task ->
    passes over its train examples): each task needs ``ceil(epochs x examples / batch_size)`` steps, the run takes
    their sum (at most ``max_steps``) and draws each task in proportion to its need, so every task reaches its
    epochs together; a small task is no longer starved by a large one's share of a common step count.
    """
    if epochs is None:
        probs = task_probabilities(sizes, sampling, temperature, weights)
        return StepPlan(max_steps, probs, sizes, batch_size, max_steps)
    need = {t: max(1, math.ceil(epochs[t] * n / batch_size)) for t, n in sizes.items()}
    total = sum(need.values())
    return StepPlan(min(max_steps, total), {t: k / total for t, k in need.items()}, sizes, batch_size, total)


def length_bucketed_batches(
    lengths: np.ndarray, batch_size: int, bucket_batches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One pass over a task in batches of similar lengths (HF ``LengthGroupedSampler``'s megabatches).

    Shuffle, cut into buckets of ``batch_size * bucket_batches`` examples, sort each bucket by
    length, cut it into batches and shuffle the batches: randomness stays, padding shrinks.
    """
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    bucket = batch_size * bucket_batches
    for start in range(0, len(order), bucket):
        chunk = order[start : start + bucket]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


class MultiTaskBatchSampler:
    """Yields single-task batches ``[(task, row), ...]``: the task drawn by ``probs``, its rows length-bucketed.

    One "epoch" is ``steps`` batches; the draw sequence depends only on (seed, epoch), so a
    resumed Trainer that skips the first batches of an epoch sees the same batches again.
    """

    def __init__(
        self,
        lengths: dict[str, np.ndarray],
        probs: dict[str, float],
        batch_size: int,
        bucket_batches: int,
        steps: int,
        seed: int,
    ) -> None:
        self.tasks = sorted(lengths)
        self.lengths, self.batch_size, self.bucket_batches = lengths, batch_size, bucket_batches
        self.p = np.array([probs[t] for t in self.tasks])
        self.steps, self.seed, self.epoch = steps, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[tuple[str, int]]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        pending: dict[str, list[np.ndarray]] = {t: [] for t in self.tasks}
        for _ in range(self.steps):
            task = self.tasks[int(rng.choice(len(self.tasks), p=self.p))]
            if not pending[task]:  # a task's pass is exhausted: start a new shuffled pass over it
                pending[task] = length_bucketed_batches(self.lengths[task], self.batch_size, self.bucket_batches, rng)
            yield [(task, int(i)) for i in pending[task].pop()]


@dataclass
class TaskData:
    """One task's tokenized splits (memory-mapped Arrow) and gold rows (for scoring)."""

    spec: TaskSpec
    splits: dict[str, Any]  # split -> datasets.Dataset of features
    rows: dict[str, list[dict[str, Any]]]  # split -> the ingested examples, in file order

    def lengths(self, split: str) -> np.ndarray:
        return feature_lengths(self.splits[split])


class Columns:
    """Encoded features held as Python lists (a served request): indexable like a ``datasets.Dataset``.

    Serving used to wrap each request in ``Dataset.from_dict``, whose fingerprinting (dill hashing
    of every column) cost ~5 ms per batch-1 request, as much as the encoder's forward pass.
    """

    def __init__(self, cols: dict[str, list[Any]]) -> None:
        self.cols = cols

    def __len__(self) -> int:
        return len(self.cols["input_ids"])

    def __getitem__(self, rows: list[int]) -> dict[str, list[Any]]:
        return {k: [v[i] for i in rows] for k, v in self.cols.items()}


def feature_lengths(features: Any) -> np.ndarray:
    """Tokens per feature of a tokenized split, read from the Arrow column (no Python lists)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(features, Columns):
        return np.array([token_count(ids) for ids in features.cols["input_ids"]], dtype=np.int64)
    if not len(features):
        return np.zeros(0, dtype=np.int64)
    column = features.data.column("input_ids")
    if pa.types.is_list(column.type.value_type):  # long_text: windows: a list of windows per example
        return np.array([token_count(ids) for ids in column.to_pylist()], dtype=np.int64)
    return pc.list_value_length(column).to_numpy(zero_copy_only=False)


def token_count(ids: list[Any]) -> int:
    """Tokens of one example: its length, or the summed lengths of its windows."""
    return sum(len(w) for w in ids) if ids and isinstance(ids[0], list) else len(ids)


class MultiTaskDataset(torch.utils.data.Dataset):
    """Indexable by ``(task, row)``; the batch sampler decides which rows form a batch."""

    def __init__(self, tasks: dict[str, TaskData], split: str = "train") -> None:
        self.tasks, self.split = tasks, split

    def __len__(self) -> int:
        return sum(len(t.splits[self.split]) for t in self.tasks.values())

    def __getitem__(self, key: tuple[str, int]) -> tuple[str, dict[str, Any]]:
        task, row = key
        return task, self.tasks[task].splits[self.split][row]


def make_collate(specs: dict[str, TaskSpec], pad_id: int) -> Any:
    """Collate one single-task batch with its task's collator; the task name rides along."""

    def collate(items: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        task = items[0][0]
        batch: dict[str, Any] = specs[task].kind.collate([f for _, f in items], pad_id)
        batch["task"] = task
        return batch

    return collate


# ----------------------------------------------------------------------------- scoring


def predict_logits(
    model: MultiTaskModel, task: str, features: Any, pad_id: int, batch_size: int, precision: Precision
) -> list[np.ndarray]:
    """Per-feature logits (unpadded, fp32) in feature order; batches sorted by length to pad little, run in ``precision``.

    An INT8 model runs its int8 kernels on fp32 activations: ``precision`` does not apply to it.
    """
    from contextlib import nullcontext

    kind = model.specs[task].kind
    int8 = bool(getattr(model, "int8", False))  # pipeline.compression.quantize.is_int8 (not imported: torch.ao)
    device = torch.device("cpu") if int8 else next(model.parameters()).device  # a quantised model has no parameters
    lengths = feature_lengths(features)
    order = np.argsort(-lengths, kind="stable")
    out: list[np.ndarray | None] = [None] * len(features)
    model.eval()
    with torch.inference_mode(), nullcontext() if int8 else precision.autocast():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            rows = features[[int(i) for i in idx]]
            feats = [{k: rows[k][j] for k in rows} for j in range(len(idx))]
            batch = {
                k: v.to(device)
                for k, v in kind.collate(feats, pad_id).items()
                if k in ("input_ids", "attention_mask", "token_type_ids", "window_example")
            }
            logits = model(task=task, **batch)["logits"].float().cpu().numpy()
            for j, i in enumerate(idx):
                out[i] = logits[j] if logits.ndim == 2 else logits[j, : lengths[i]]
    return out  # type: ignore[return-value]


@dataclass
class Scored:
    """A model's predictions on one task split, next to the gold answers, and their metrics."""

    gold: list[Any]
    pred: list[Any]
    metrics: dict[str, Any]
    confidence: list[Any] | None = None  # per example, the model's probability for its answer (TaskType.confidences)

    def primary(self, spec: TaskSpec) -> float:
        return float(self.metrics[spec.primary])


def score_task(
    model: MultiTaskModel,
    data: TaskData,
    split: str,
    pad_id: int,
    batch_size: int,
    precision: Precision,
    with_confidence: bool = False,
) -> Scored:
    """Decode ``model``'s predictions on ``split`` of one task and compute its metrics (and, for the error
    analysis, the model's confidence in each answer)."""
    spec = data.spec
    kind = spec.kind
    logits = predict_logits(model, spec.name, data.splits[split], pad_id, batch_size, precision)
    features = data.splits[split].to_list() if kind.decode_reads_features else [None] * len(logits)
    rows = data.rows[split]
    pred = kind.decode(features, logits, rows, spec)
    gold = kind.gold(rows, spec)
    confidence = kind.confidences(features, logits, rows, spec) if with_confidence else None
    return Scored(gold, pred, kind.score(gold, pred, spec), confidence)


def mean_primary(scores: dict[str, float]) -> float:
    """The model-selection score: the unweighted mean of the tasks' primary metrics."""
    return float(np.mean(list(scores.values()))) if scores else math.nan
