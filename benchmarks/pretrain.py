"""Benchmark: the pretrain stage vs the plain ``run_mlm.py`` recipe, and an ablation of our speed-ups.

    python -m benchmarks.pretrain                # 12 optimiser steps of 16 x 128 per variant, 2 rounds (~12 minutes on 2 cores)
    python -m benchmarks.pretrain --steps 20

Every variant trains all-MiniLM-L6-v2 (offline) with the HF Trainer, AdamW, batch 16, max length
128, token masking at 15%, on the demo corpus, each in a fresh process:

1. plain: what ``run_mlm.py --line_by_line --pad_to_max_length`` users run on a CPU: fp32, the
   dense MLM head, each line of the corpus tokenized on its own, truncated and padded to 128,
   ``DataCollatorForLanguageModeling``. How much it wastes depends on line length, so it runs on
   one document per line (the demo corpus as ingested, ~190 tokens a line: truncation drops a
   third of the text, little padding) and one sentence per line (~25 tokens: mostly padding);
2. ours, ``pipeline.stages.pretrain.run`` on the packed blocks of the tokenize stage (no padding), with
   one change at a time: fp32 + dense head, + masked-only head, bf16 + dense head, bf16 +
   masked-only head (the default where ``precision: auto`` picks bf16), and dropout variants.

Throughput counts real (non-pad) tokens over the warm steps (after the first two, which build
oneDNN kernels and are reported apart as warm-up). A step-level section then times what the
stage does not switch per run (fused vs foreach AdamW, ``torch.compile``, threads) and the attention kernel
(SDPA vs eager: the stages train with eager attention under bf16 on a CPU, ``Precision.training_attention``) on the same
model and batch shape, and the weights (autocast over fp32 weights vs the model in bf16 with fp32 masters, what the
stage does on a CPU: ``Precision.bf16_weights``; the stage-level row "bf16 autocast over fp32 weights" is the same
comparison in the stage). Results: ``benchmarks/results/pretrain.md``, naming the CPU and its flags.

Efficiency: every row also gives its model FLOP/s (the model's necessary FLOPs per token, counted from
its shape by ``pipeline.modelling.flops``, times warm real tokens/s) and that as a share of the
machine's matmul peak, measured first in the same run on the model's largest products in the row's
precision: how close to this hardware's limit the recipe runs. Last, ``torch.profiler`` over the default step
says where its time goes by operator kind, and how fast its matrix products run inside the step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, best_of_rounds, make_sharded_corpus, measure, save_results
from pipeline.modelling.flops import MLM_MASKED_SHARE, mlm_train_flops_per_token

PREPARE = """
import sys
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.text import demo_domain as demo
from pipeline.stages import ingest, validate, tokenize
cfg = load_config("params.yaml", {"tokenize.extend_vocab.enabled": False})
paths = Paths(Path(sys.argv[1]))
demo.run(cfg.demo, paths.demo); ingest.run(cfg, paths); validate.run(cfg, paths); tokenize.run(cfg, paths)
"""

OURS = """
import sys, json, shutil
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import pretrain
steps, variant = int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
if variant.pop("bf16_autocast", False):  # the stage as it was before bf16 weights: autocast over fp32 weights
    from pipeline.modelling.precision import Precision
    Precision.bf16_weights = lambda self, gradient_accumulation_steps: False
cfg = load_config("params.yaml", {"pretrain.max_steps": steps, "pretrain.masking": "token", "pretrain.eval_steps": 10**6,
                                  "pretrain.save_steps": 10**6, "pretrain.logging_steps": 1, "tracking.enabled": False,
                                  "pretrain.eval_max_blocks": 16, "pretrain.warmup_steps": 1, **variant})
paths = Paths(Path(sys.argv[1]))
shutil.rmtree(paths.pretrain_checkpoints, ignore_errors=True)  # every variant starts fresh
r = pretrain.run(cfg, paths).as_json()
print(json.dumps({"real_tokens": r["tokens_seen"], "train_seconds": r["train_seconds"], "steps": r["global_step"],
                  "train_blocks": r["train_blocks"], "precision": r["precision"], "mlm_head": r["mlm_head"],
                  "warmup_seconds": r["warmup_seconds"], "warm_tokens_per_s": r["warm_tokens_per_s"]}))
"""

PREPARE_SIZED = """
import sys
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import ingest, tokenize
cfg = load_config("params.yaml", {"ingest.corpus.sources": [{"type": "files", "path": sys.argv[1]}], "ingest.tasks": [],
                                  "finetune.tasks": {}, "ingest.corpus.min_chars": 1, "ingest.corpus.min_words": 1,
                                  "tokenize.extend_vocab.enabled": False, "tokenize.domain_terms": None})
paths = Paths(Path(sys.argv[2]))
ingest.run(cfg, paths)
tokenize.run(cfg, paths, require_validation=False)  # generated corpus: the benchmark times pretraining
"""

PLAIN = """
import sys, json, re, time
import pyarrow.parquet as pq
import torch
from datasets import Dataset
from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments
from pipeline.modelling.models import load_tokenizer, resolve_base
from pipeline.training.pretraining.budget import WarmupTimer
root, steps, layout = sys.argv[1], int(sys.argv[2]), sys.argv[3]
texts = pq.read_table(root + "/data/corpus/train", columns=["text"])["text"].to_pylist()
if layout == "sentences":
    texts = [s for t in texts for s in re.split(r"(?<=[.!?])\\s+", t) if s]
tok = load_tokenizer("minilm", "base")
ds = Dataset.from_dict({"text": texts}).map(
    lambda b: tok(b["text"], truncation=True, max_length=128, padding="max_length", return_special_tokens_mask=True),
    batched=True, remove_columns=["text"])
model = BertForMaskedLM.from_pretrained(resolve_base("minilm", "base"), dtype=torch.float32)
args = TrainingArguments(output_dir=root + "/plain_out", max_steps=steps, per_device_train_batch_size=16, learning_rate=1e-4,
                         weight_decay=0.01, warmup_steps=1, logging_steps=1, save_strategy="no", report_to="none", seed=13,
                         use_cpu=True, include_num_input_tokens_seen="non_padding", disable_tqdm=True, dataloader_num_workers=0)
timer = WarmupTimer()
trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15),
                  processing_class=tok, callbacks=[timer])
start = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - start
lengths = [sum(m) for m in ds["attention_mask"]]
print(json.dumps({"real_tokens": int(trainer.state.num_input_tokens_seen), "train_seconds": round(seconds, 1), "steps": steps,
                  "precision": "fp32", "mlm_head": "dense", **timer.summary(),
                  "mean_real_tokens_per_line": round(sum(lengths) / len(lengths), 1),
                  "truncated_lines": sum(1 for t in texts if len(tok(t)["input_ids"]) > 128)}))
"""


STEP = """
import sys, json, time
import torch
from benchmarks.pretrain import minilm_mlm, random_masked_batch, train_step
steps, variant = int(sys.argv[1]), json.loads(sys.argv[2])
torch.set_num_threads(variant.get("threads", torch.get_num_threads()))
model = minilm_mlm(variant.get("attention", "sdpa"))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=variant.get("fused", False) or None, foreach=None if variant.get("fused") else True)
if variant.get("masters"):  # the model in bf16, fp32 masters in the optimiser: no autocast
    from pipeline.training.master_weights import MasterAdamW, MasterWeights
    opt = MasterAdamW(opt, MasterWeights(model))
forward = torch.compile(model) if variant.get("compile") else model
batch = random_masked_batch()
autocast = variant.get("bf16", False) and not variant.get("masters")
times = []
for _ in range(steps):
    start = time.perf_counter()
    train_step(model, opt, batch, autocast, forward)
    times.append(time.perf_counter() - start)
print(json.dumps({"warmup_seconds": round(sum(times[:2]), 2), "warm_s_per_step": round(sum(times[2:]) / len(times[2:]), 3)}))
"""

PROFILE = """
import sys, json, time
from collections import defaultdict
import torch
from torch.profiler import ProfilerActivity, profile
from benchmarks.pretrain import minilm_mlm, random_masked_batch, train_step
from pipeline.training.master_weights import MasterAdamW, MasterWeights
steps, bf16, categories = int(sys.argv[1]), sys.argv[2] == "bf16", json.loads(sys.argv[3])
model = minilm_mlm("eager")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
if bf16:  # what the stage does on a CPU with bf16 (Precision.bf16_weights)
    opt = MasterAdamW(opt, MasterWeights(model))
batch = random_masked_batch()
for _ in range(3):  # oneDNN builds its kernels
    train_step(model, opt, batch, False)
times = []
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
        start = time.perf_counter()
        train_step(model, opt, batch, False)
        times.append(time.perf_counter() - start)
shares = defaultdict(float)
for event in prof.key_averages():
    name = next((c for c, ops in categories.items() if event.key in ops), "everything else")
    shares[name] += event.self_cpu_time_total
total = sum(shares.values())
print(json.dumps({"s_per_step": min(times), "shares": {k: v / total for k, v in shares.items()}}))
"""

WEIGHTS = """
import sys, json, copy, time
import torch
from benchmarks.pretrain import minilm_mlm, random_masked_batch, train_step
from pipeline.training.master_weights import MasterAdamW, MasterWeights
steps = int(sys.argv[1])
base, batch = minilm_mlm("eager"), random_masked_batch()
def trainer(masters):
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if masters:
        opt = MasterAdamW(opt, MasterWeights(model))
    return lambda: train_step(model, opt, batch, not masters)
variants = {"autocast": trainer(False), "bf16 weights": trainer(True)}
times = {name: [] for name in variants}
for step in variants.values():  # oneDNN builds its kernels
    step(); step()
for _ in range(steps):  # one step of each in turn: other work on the machine slows both alike
    for name, step in variants.items():
        start = time.perf_counter()
        step()
        times[name].append(time.perf_counter() - start)
print(json.dumps({name: {"min": min(t), "median": sorted(t)[len(t) // 2]} for name, t in times.items()}))
"""


def minilm_mlm(attention: str) -> Any:
    """all-MiniLM-L6-v2 with a fresh masked-only MLM head, fp32, no dropout (the stage's default), in train mode: the
    model of the step-level child scripts."""
    import torch

    from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM
    from pipeline.modelling.models import resolve_base

    torch.manual_seed(0)
    return MaskedOnlyBertForMaskedLM.from_pretrained(
        resolve_base("minilm", "base"),
        attn_implementation=attention,
        dtype=torch.float32,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    ).train()


def random_masked_batch(blocks: int = 16) -> dict[str, Any]:
    """One ``blocks`` x 128 batch of random tokens with 15% of them masked (labels elsewhere -100), no padding."""
    import torch

    ids = torch.randint(1000, 30000, (blocks, 128))
    labels = torch.full_like(ids, -100)
    selected = torch.rand(ids.shape) < 0.15
    labels[selected], ids[selected] = ids[selected], 103
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def train_step(model: Any, opt: Any, batch: dict[str, Any], autocast: bool, forward: Any = None) -> None:
    """One optimiser step as the Trainer takes it (clipping at 1.0), under bf16 autocast if ``autocast``;
    ``forward`` is the model's callable (a compiled one) where it is not the model itself."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = (forward or model)(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


# self-CPU time of a profiled step, by what the operators do (the rest: "everything else")
PROFILE_CATEGORIES = {
    "matrix products": ["aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"],
    "dtype casts and copies": ["aten::copy_", "aten::_to_copy", "aten::clone"],
    "MLM loss (log-softmax over the vocabulary, NLL)": [
        "aten::_log_softmax",
        "aten::_log_softmax_backward_data",
        "aten::nll_loss_forward",
        "aten::nll_loss_backward",
    ],
    "zero fills": ["aten::fill_", "aten::zero_"],
    "attention softmax, GELU, layer norms": [
        "aten::_softmax",
        "aten::_softmax_backward_data",
        "aten::gelu",
        "aten::gelu_backward",
        "aten::native_layer_norm",
        "aten::native_layer_norm_backward",
    ],
    "optimiser (fused AdamW) and gradient clipping": [
        "aten::_fused_adamw_",
        "aten::_foreach_norm",
        "aten::_foreach_mul_",
        "aten::linalg_vector_norm",
    ],
    "additions, multiplications, sums": ["aten::add", "aten::add_", "aten::mul", "aten::sum", "aten::div"],
}

PEAK = """
import sys, json, time
import torch
shapes, dtypes, seconds = json.loads(sys.argv[1]), sys.argv[2].split(","), float(sys.argv[3])
rates, medians = {}, {}
for name in dtypes:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):  # oneDNN builds its kernels
            a @ b
        times, end = [], time.perf_counter() + seconds  # repeat for a while: the min is the machine's, not its noise
        while time.perf_counter() < end:
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        times.sort()
        rates[f"{name} {m}x{k} @ {k}x{n}"] = 2 * m * k * n / times[0]
        medians[f"{name} {m}x{k} @ {k}x{n}"] = 2 * m * k * n / times[len(times) // 2]
print(json.dumps({"best": rates, "median": medians}))
"""

# (name, overrides of our stage); bf16 rows run only where the hardware has bf16
DEFAULTS = "ours: params.yaml defaults"
OUR_VARIANTS: list[tuple[str, dict]] = [
    (DEFAULTS, {}),  # what `dvc repro` runs on this machine (precision: auto; no pretraining dropout)
    ("ours: defaults, but bf16 autocast over fp32 weights (before bf16 weights)", {"bf16_autocast": True}),
    ("ours: fp32, dense head", {"precision": "fp32", "pretrain.mlm_head": "dense"}),
    ("ours: fp32, masked-only head", {"precision": "fp32", "pretrain.mlm_head": "masked_only"}),
    ("ours: bf16, dense head", {"precision": "bf16", "pretrain.mlm_head": "dense"}),
    (  # null: the base model's dropout (0.1), as before pretraining dropout was turned off
        "ours: bf16, masked-only, the base model's attention dropout (0.1)",
        {"precision": "bf16", "pretrain.mlm_head": "masked_only", "pretrain.attention_dropout": None},
    ),
    (
        "ours: bf16, masked-only, the base model's dropout (0.1) everywhere",
        {
            "precision": "bf16",
            "pretrain.mlm_head": "masked_only",
            "pretrain.attention_dropout": None,
            "pretrain.hidden_dropout": None,
        },
    ),
]
STEP_VARIANTS: list[tuple[str, dict]] = [
    ("bf16 masked-only, foreach AdamW, all threads", {"bf16": True}),
    ("+ fused AdamW", {"bf16": True, "fused": True}),
    (
        "+ fused AdamW, eager attention (bf16 autocast over fp32 weights)",
        {"bf16": True, "fused": True, "attention": "eager"},
    ),
    (
        "+ fused AdamW, eager attention, the model in bf16 with fp32 master weights (the stages' way on a CPU)",
        {"bf16": True, "fused": True, "attention": "eager", "masters": True},
    ),
    ("+ torch.compile (inductor)", {"bf16": True, "compile": True}),
    ("1 thread", {"bf16": True, "threads": 1}),
    ("fp32 masked-only, foreach AdamW", {}),
    ("fp32 masked-only + fused AdamW", {"fused": True}),
    ("fp32 masked-only + fused AdamW, eager attention", {"fused": True, "attention": "eager"}),
]


def bench(steps: int, workdir: Path, bf16: bool, rounds: int) -> list[dict]:
    project = workdir / "project"
    measure(PREPARE, str(project))
    runs = [
        ("plain run_mlm, one document per line", PLAIN, ["documents"]),
        ("plain run_mlm, one sentence per line", PLAIN, ["sentences"]),
    ]
    runs += [
        (name, OURS, [json.dumps(v)])
        for name, v in OUR_VARIANTS
        if bf16 or (v.get("precision") != "bf16" and not v.get("bf16_autocast"))
    ]

    def run(job: tuple[str, str, list[str]]) -> dict:
        name, code, args = job
        m = measure(code, str(project), str(steps), *args)
        info = json.loads(m.pop("output").splitlines()[-1])
        return {
            "method": name,
            "precision": info["precision"],
            "mlm_head": info["mlm_head"],
            "steps": info["steps"],
            "real_tokens": info["real_tokens"],
            "train_seconds": info["train_seconds"],
            "real_tokens_per_s": round(info["real_tokens"] / info["train_seconds"]),  # warm-up included
            "warmup_seconds": info["warmup_seconds"],
            "warm_tokens_per_s": info["warm_tokens_per_s"],
            "warm_s_per_step": round(
                info["real_tokens"] / info["steps"] / info["warm_tokens_per_s"], 3
            ),  # tokens/step over warm tokens/s
            "peak_rss_mb": round(m["peak_rss_mb"]),
            **{k: v for k, v in info.items() if k in ("mean_real_tokens_per_line", "truncated_lines")},
        }

    return best_of_rounds(rounds, runs, run, "warm_s_per_step")


def bench_steps(steps: int, bf16: bool, rounds: int) -> list[dict]:
    """Train-step time of one 16 x 128 batch for settings the stage does not vary per run."""

    def run(job: tuple[str, dict]) -> dict:
        name, variant = job
        m = measure(STEP, str(steps), json.dumps(variant))
        info = json.loads(m.pop("output").splitlines()[-1])
        return {
            "setting": name,
            "precision": "bf16" if variant.get("bf16") else "fp32",
            **info,
            "warm_tokens_per_s": round(16 * 128 / info["warm_s_per_step"]),  # one 16 x 128 batch per step
            "peak_rss_mb": round(m["peak_rss_mb"]),
        }

    return best_of_rounds(
        rounds, [(n, v) for n, v in STEP_VARIANTS if bf16 or not v.get("bf16")], run, "warm_s_per_step"
    )


def weights_interleaved(steps: int) -> dict[str, Any]:
    """bf16 autocast over fp32 weights vs the model in bf16 with fp32 masters: one 16 x 128 step of each in turn,
    in one process, ``steps`` times; min and median seconds per step."""
    m = measure(WEIGHTS, str(steps))
    times = json.loads(m.pop("output").splitlines()[-1])
    return {
        "steps": steps,
        **{name: {k: round(v, 3) for k, v in t.items()} for name, t in times.items()},
        "speedup_min": round(times["autocast"]["min"] / times["bf16 weights"]["min"], 2),
        "speedup_median": round(times["autocast"]["median"] / times["bf16 weights"]["median"], 2),
    }


def weights_markdown(w: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"The weights, interleaved ({w['steps']} steps of each in turn in one process, bf16, eager attention, fused "
            "AdamW, no dropout):",
            "",
            "| weights | min s/step | median s/step |",
            "|---|---:|---:|",
            f"| bf16 autocast over fp32 weights | {w['autocast']['min']} | {w['autocast']['median']} |",
            f"| the model in bf16, fp32 masters in the optimiser (the stage on a CPU) | {w['bf16 weights']['min']} | "
            f"{w['bf16 weights']['median']} |",
            f"| speed-up | {w['speedup_min']}x | {w['speedup_median']}x |",
        ]
    )


def profile_step(
    steps: int, bf16: bool, flops_per_token: float, rates: dict[str, float], medians: dict[str, float]
) -> dict[str, Any]:
    """Where the time of the stage's default step goes (``torch.profiler``, self CPU time by operator kind), and the
    FLOP rate its matrix products reach inside the step: the efficiency the step would have if nothing else took
    time."""
    precision = "bf16" if bf16 else "fp32"
    m = measure(PROFILE, str(steps), precision, json.dumps(PROFILE_CATEGORIES))
    info = json.loads(m.pop("output").splitlines()[-1])
    step_flops = flops_per_token * 16 * 128
    matmul_seconds = info["s_per_step"] * info["shares"]["matrix products"]
    peak = peak_of(rates, precision)
    return {
        "precision": precision,
        "s_per_step": round(info["s_per_step"], 3),
        "shares": {k: round(v, 3) for k, v in sorted(info["shares"].items(), key=lambda kv: -kv[1])},
        "efficiency": round(step_flops / info["s_per_step"] / peak, 3),
        "matmul_flop_per_s_in_step": round(step_flops / matmul_seconds),
        "efficiency_if_only_matmuls": round(step_flops / matmul_seconds / peak, 3),
        "isolated_median_flop_per_s": round(peak_of(medians, precision)),
    }


def profile_markdown(p: dict[str, Any]) -> str:
    lines = [
        f"Where a default step's time goes ({p['precision']}, 16 x 128, masked-only head, eager attention, fused AdamW"
        f"{', bf16 weights with fp32 masters' if p['precision'] == 'bf16' else ''}; `torch.profiler`, self CPU time; "
        f"fastest step {p['s_per_step']} s under the profiler):",
        "",
        "| operators | share of the step |",
        "|---|---:|",
        *(f"| {k} | {v:.0%} |" for k, v in p["shares"].items()),
        "",
        f"Share of the matmul peak: {p['efficiency']:.0%} for the whole step; its matrix products alone run at "
        f"{p['matmul_flop_per_s_in_step'] / 1e9:,.0f} GFLOP/s, so with every other operator free the step would reach "
        f"{p['efficiency_if_only_matmuls']:.0%} (the best isolated product's median repeat: "
        f"{p['isolated_median_flop_per_s'] / 1e9:,.0f} GFLOP/s).",
    ]
    return "\n".join(lines)


def model_shapes(config: Any, batch: int = 16, seq_len: int = 128) -> list[tuple[int, int, int]]:
    """The largest matrix products of one training step, (m, k, n): the projections and feed-forward over a
    batch's tokens, and the MLM decoder over its masked positions."""
    tokens, h, i = batch * seq_len, config.hidden_size, config.intermediate_size
    masked = round(MLM_MASKED_SHARE * tokens)
    return [(tokens, h, h), (tokens, h, i), (tokens, i, h), (masked, h, config.vocab_size)]


def matmul_rates(
    shapes: list[tuple[int, int, int]], bf16: bool, seconds: float = 2.0
) -> tuple[dict[str, float], dict[str, float]]:
    """FLOP/s of each shape per precision over ``seconds`` of repeats, in a fresh process with all threads: from the
    fastest repeat (the peak) and from the median one (what the product sustains on this machine as it is)."""
    m = measure(PEAK, json.dumps(shapes), "fp32,bf16" if bf16 else "fp32", str(seconds))
    out = json.loads(m["output"].splitlines()[-1])
    return out["best"], out["median"]


def matmul_peak(shapes: list[tuple[int, int, int]], bf16: bool, seconds: float = 2.0) -> dict[str, float]:
    """FLOP/s of each shape per precision from the fastest of ``seconds`` of repeats (:func:`matmul_rates`)."""
    return matmul_rates(shapes, bf16, seconds)[0]


def best_rates(*runs: dict[str, float]) -> dict[str, float]:
    """Per product, the best of several measurements (before and after the training rows: other work on the
    machine only ever slows a product down)."""
    return {name: max(run[name] for run in runs) for name in runs[0]}


def peak_of(rates: dict[str, float], precision: str) -> float:
    """The machine's measured matmul peak in ``precision``: the best of the model's shapes."""
    return max(rate for name, rate in rates.items() if name.startswith(precision + " "))


def add_efficiency(rows: list[dict], rates: dict[str, float], flops_per_token: float, tokens_per_s: str) -> None:
    """Each row's model FLOP/s (model FLOPs per token x its ``tokens_per_s``) and its share of the measured
    matmul peak in the row's precision."""
    for r in rows:
        achieved = flops_per_token * r[tokens_per_s]
        r["model_gflop_per_s"] = round(achieved / 1e9, 1)
        r["peak_share"] = round(achieved / peak_of(rates, r["precision"]), 3)


def scale(sizes: list[int], steps: int, workdir: Path) -> list[dict]:
    """Our pretraining throughput and peak memory on corpora of ``sizes`` MB (prepared untimed)."""
    rows = []
    for mb in sizes:
        # distinct documents (make_corpus's copies of the demo are near-duplicates: ingest keeps ~one copy's worth)
        folder, project = workdir / f"corpus_{mb}mb", workdir / f"scale_{mb}"
        make_sharded_corpus(folder, mb, shard_mb=mb + 1)  # one file
        measure(PREPARE_SIZED, str(folder / "part-00000.jsonl"), str(project))
        shutil.rmtree(folder)
        m = measure(OURS, str(project), str(steps))
        info = json.loads(m.pop("output").splitlines()[-1])
        rows.append(
            {
                "size_mb": mb,
                "train_blocks": info["train_blocks"],
                "steps": info["steps"],
                "real_tokens": info["real_tokens"],
                "real_tokens_per_s": round(info["real_tokens"] / info["train_seconds"]),
                "peak_rss_mb": round(m["peak_rss_mb"]),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
        shutil.rmtree(project)
    return rows


def scale_markdown(rows: list[dict]) -> str:
    lines = [
        "| corpus | train blocks (x128 tokens) | steps | real tokens/s | peak RSS (MB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['size_mb']} MB | {r['train_blocks']} | {r['steps']} | {r['real_tokens_per_s']} | {r['peak_rss_mb']} |"
        for r in rows
    ]
    return "\n".join(lines)


def to_markdown(rows: list[dict]) -> str:
    plain = rows[0]
    lines = [
        "| method | precision | MLM head | steps | warm-up s (first 2 steps) | warm s/step | warm real tokens/s | peak RSS (MB) "
        "| this / plain doc-per-line (warm tokens/s) | model GFLOP/s | share of matmul peak |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['precision']} | {r['mlm_head']} | {r['steps']} | {r['warmup_seconds']} | {r['warm_s_per_step']} | "
            f"{r['warm_tokens_per_s']} | {r['peak_rss_mb']} | {r['warm_tokens_per_s'] / plain['warm_tokens_per_s']:.2f} | "
            f"{r['model_gflop_per_s']} | {r['peak_share']:.0%} |"
        )
    return "\n".join(lines)


def peak_markdown(rates: dict[str, float], medians: dict[str, float], flops_per_token: float) -> str:
    lines = [
        f"Model FLOPs per token (encoder over 128-token blocks + MLM head at the {MLM_MASKED_SHARE:.0%} masked positions, "
        f"forward and backward; `pipeline/modelling/flops.py`): {flops_per_token / 1e6:.1f} MFLOP. The machine's matmul "
        "rate on the model's largest products, measured in the same run (before and after the rows below, "
        "the better of the two; 2 s of repeats each, all threads): the peak from the fastest repeat (the shares "
        "below are of it), the median repeat for what a product sustains on this machine as it is:",
        "",
        "| product (m x k @ k x n) | peak GFLOP/s | median GFLOP/s |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {rate / 1e9:.1f} | {medians[name] / 1e9:.1f} |" for name, rate in rates.items()]
    return "\n".join(lines)


def steps_markdown(rows: list[dict]) -> str:
    first = rows[0]
    lines = [
        "| setting (one 16 x 128 train step, MiniLM, no dropout) | warm-up s (2 steps) | warm s/step | peak RSS (MB) | s/step vs the first row "
        "| model GFLOP/s | share of matmul peak |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['setting']} | {r['warmup_seconds']} | {r['warm_s_per_step']} | {r['peak_rss_mb']} | "
        f"{r['warm_s_per_step'] / first['warm_s_per_step']:.2f} | {r['model_gflop_per_s']} | {r['peak_share']:.0%} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    from transformers import AutoConfig

    from pipeline.modelling.models import resolve_base
    from pipeline.modelling.precision import resolve_precision

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--rounds", type=int, default=2, help="each variant this many times, interleaved; its best kept"
    )
    parser.add_argument(
        "--scale-sizes", type=int, nargs="*", default=[], help="also: our throughput on corpora of these sizes (MB)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    bf16 = resolve_precision("auto").bf16
    config = AutoConfig.from_pretrained(resolve_base("minilm", "base"))
    flops_per_token = mlm_train_flops_per_token(config, 128)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        before = matmul_rates(model_shapes(config), bf16)
        rows = bench(args.steps, Path(tmp), bf16, args.rounds)
        step_rows = bench_steps(args.steps, bf16, args.rounds)
        after = matmul_rates(model_shapes(config), bf16)
        rates, medians = best_rates(before[0], after[0]), best_rates(before[1], after[1])
        profiled = profile_step(args.steps, bf16, flops_per_token, rates, medians)
        weights = weights_interleaved(3 * args.steps) if bf16 else None
        scaled = scale(args.scale_sizes, args.steps, Path(tmp)) if args.scale_sizes else []
    add_efficiency(rows, rates, flops_per_token, "warm_tokens_per_s")
    add_efficiency(step_rows, rates, flops_per_token, "warm_tokens_per_s")
    table = peak_markdown(rates, medians, flops_per_token) + "\n\n" + to_markdown(rows)
    if not bf16:
        table += "\n\nbf16 rows skipped: this machine has no hardware bf16 (precision: auto runs fp32 here)."
    table += (
        "\n\nSettings the stage does not switch per run (fresh process each, random tokens, 15% masked):\n\n"
        + steps_markdown(step_rows)
    )
    if weights:
        table += "\n\n" + weights_markdown(weights)
    table += "\n\n" + profile_markdown(profiled)
    if scaled:
        table += (
            "\n\nOur stage on corpora of growing size (same steps; blocks are memory-mapped Arrow):\n\n"
            + scale_markdown(scaled)
        )
    sizes = f" --scale-sizes {' '.join(map(str, args.scale_sizes))}" if args.scale_sizes else ""
    save_results(
        "pretrain",
        f"--steps {args.steps} --rounds {args.rounds}{sizes}",
        "Same model (all-MiniLM-L6-v2 + "
        "fresh MLM head), batch 16, length 128, token masking, HF Trainer on CPU; real tokens exclude padding; warm = after the "
        "first 2 steps; each variant in a fresh process, all of them in turn --rounds times, the fastest round kept.",
        table,
        {
            "methods": rows,
            "steps": step_rows,
            "weights_interleaved": weights,
            "profile": profiled,
            "scaling": scaled,
            "matmul_flop_per_s": rates,
            "matmul_median_flop_per_s": medians,
            "model_flops_per_token": flops_per_token,
        },
    )


if __name__ == "__main__":
    main()
