"""GPU check: the gpu profile's pretraining on bert-base-sized random weights vs the plain HF recipe.

    python -m benchmarks.gpu_check                    # on a CUDA machine: ~4-5 minutes on an H200 (6 runs of 60 steps)
    python -m benchmarks.gpu_check --tiny --out /tmp/g  # CPU smoke run of this script (tiny model, a few steps)

Data: the demo generator's corpus (offline; ``--docs`` reports), ingested and tokenized into packed
blocks of 128 and of 512 tokens with the bert-base-uncased-sized WordPiece vocab that ships offline
(30,522 tokens). Model: BERT with bert-base dimensions (12 layers, hidden 768, 12 heads, 3072 FFN;
~110M parameters), random weights. Each length, each run in a fresh process, same tokens per step
(the gpu profile's 64 x 512 x 4 accumulation = 131k; at 128 the micro batch is 256):

1. ours: ``pipeline.stages.pretrain.run`` with the gpu profile's settings: masked-only MLM head,
   ``precision: auto`` (bf16 on a bf16 GPU), fused AdamW, SDPA attention (flash where available),
   whole-word masking;
2. ours + ``torch.compile``;
3. plain run_mlm: what ``run_mlm.py --bf16`` does by default: concatenate the texts, cut blocks
   of the same length, ``DataCollatorForLanguageModeling``, dense MLM head, the HF ``Trainer``.

Reported: optimiser steps/s, real tokens/s, MFU = the FLOPs the method needs per second over the
peak (790 TFLOP/s dense bf16 for an H200; ``--peak-tflops``), peak GPU memory
(``torch.cuda.max_memory_allocated``). FLOPs per token (PaLM accounting): 6 x (encoder weights +
``mlm_probability`` x MLM head weights) + 12 x layers x hidden x length: the decoder counts only at
the masked positions, for every method, so skipping the other rows earns no credit.
Results: ``benchmarks/results/gpu.{md,json}`` with device and date.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, measure

BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}

PREPARE = """
import sys, json
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.text import demo_domain as demo
from pipeline.stages import ingest, tokenize
overrides = json.loads(sys.argv[2])
cfg = load_config("params.yaml", overrides)
paths = Paths(Path(sys.argv[1]))
demo.run(cfg.demo, paths.demo); ingest.run(cfg, paths); tokenize.run(cfg, paths, require_validation=False)  # generated corpus, no tasks
"""

OURS = """
import sys, json, time, shutil
from pathlib import Path
import torch
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import pretrain
cfg = load_config("params.yaml", json.loads(sys.argv[2]))
shutil.rmtree(Paths(Path(sys.argv[1])).pretrain_checkpoints, ignore_errors=True)  # every run starts fresh
if torch.cuda.is_available():
    torch.cuda.reset_peak_memory_stats()
r = pretrain.run(cfg, Paths(Path(sys.argv[1]))).as_json()
peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
print(json.dumps({"steps": r["global_step"], "real_tokens": r["tokens_seen"], "train_seconds": r["train_seconds"], "peak_gib": peak,
                  "warm_tokens_per_s": r["warm_tokens_per_s"], "precision": r["precision"]}))
"""

PLAIN = """
import sys, json, time, itertools
import pyarrow.parquet as pq
import torch
from datasets import Dataset
from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments
from pipeline.modelling.models import load_tokenizer
from pipeline.training.pretraining.budget import WarmupTimer
root, layout, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
L, steps, micro, accum = spec["length"], spec["steps"], spec["micro"], spec["accum"]
texts = pq.read_table(root + "/data/corpus/train", columns=["text"])["text"].to_pylist()
tok = load_tokenizer("minilm", "base")
tok.model_max_length = L
if layout == "grouped":  # run_mlm.py without --line_by_line: tokenize, concatenate, cut into blocks of L
    ids = tok(texts, return_special_tokens_mask=True)
    cat = {k: list(itertools.chain.from_iterable(v)) for k, v in ids.items()}
    n = len(cat["input_ids"]) // L * L
    ds = Dataset.from_dict({k: [v[i:i + L] for i in range(0, n, L)] for k, v in cat.items()})
else:  # --line_by_line --pad_to_max_length
    ds = Dataset.from_dict({"text": texts}).map(
        lambda b: tok(b["text"], truncation=True, max_length=L, padding="max_length", return_special_tokens_mask=True),
        batched=True, remove_columns=["text"])
cuda = torch.cuda.is_available()
model = BertForMaskedLM(BertConfig(vocab_size=len(tok), max_position_embeddings=512, **spec["dims"]))
args = TrainingArguments(output_dir=root + "/plain_out", max_steps=steps, per_device_train_batch_size=micro,
                         gradient_accumulation_steps=accum, learning_rate=1e-4, warmup_steps=1, logging_steps=10, save_strategy="no",
                         report_to="none", seed=13, bf16=cuda, use_cpu=not cuda, include_num_input_tokens_seen="non_padding",
                         disable_tqdm=True, dataloader_num_workers=0)
timer = WarmupTimer()
trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15),
                  processing_class=tok, callbacks=[timer])
if cuda:
    torch.cuda.reset_peak_memory_stats()
start = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - start
peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
print(json.dumps({"steps": steps, "real_tokens": int(trainer.state.num_input_tokens_seen), "train_seconds": round(seconds, 1),
                  "peak_gib": peak, "warm_tokens_per_s": timer.summary()["warm_tokens_per_s"], "precision": "bf16" if cuda else "fp32"}))
"""


def model_flops_per_token(dims: dict[str, int], vocab: int, length: int, mlm_probability: float) -> float:
    """Training FLOPs per token the method needs (forward + backward), PaLM accounting: 6 x matmul weights + attention.

    The MLM head (transform + decoder) is needed only at the masked share of positions.
    """
    h, layers, ffn = dims["hidden_size"], dims["num_hidden_layers"], dims["intermediate_size"]
    encoder = layers * (4 * h * h + 2 * h * ffn)  # Q, K, V, output projections + the two FFN matrices
    head = h * h + vocab * h  # MLM transform + decoder
    return 6 * (encoder + mlm_probability * head) + 12 * layers * h * length


def overrides(args: argparse.Namespace, dims: dict[str, int], length: int) -> dict:
    """The gpu profile, offline: the shipped 30,522-token uncased vocab, random bert-base-sized weights, demo data."""
    from pipeline.core.profiles import profile_overrides

    profile = {
        k: v
        for k, v in profile_overrides(ROOT, "gpu").items()
        if k.startswith("pretrain.") or k == "tokenize.max_seq_length"
    }
    scratch = {f"pretrain.scratch.{k}": v for k, v in dims.items()}
    o = {
        **profile,
        "tokenize.base_tokenizer": "minilm",
        "tokenize.extend_vocab.enabled": False,
        "tokenize.domain_terms": None,
        "demo.corpus_docs": args.docs,
        "ingest.tasks": [],
        "finetune.tasks": {},
        "pretrain.base_model": "scratch",
        **scratch,
        "pretrain.max_steps": args.steps,
        "pretrain.warmup_steps": 1,
        "pretrain.eval_steps": 10**6,
        "pretrain.save_steps": 10**6,
        "pretrain.logging_steps": 10,
        "pretrain.eval_max_blocks": 8,
        "tracking.enabled": False,
        "tokenize.max_seq_length": length,
        "tokenize.doc_stride": length // 4,
    }
    # same tokens per optimiser step at every length: the profile's micro batch is for 512-token blocks
    o["pretrain.micro_batch_size"] = o.get("pretrain.micro_batch_size", 64) * 512 // length
    if args.tiny:
        o.update(
            {"pretrain.micro_batch_size": 4, "pretrain.gradient_accumulation_steps": 1, "pretrain.logging_steps": 1}
        )
    return o


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimiser steps per run")
    parser.add_argument("--docs", type=int, default=10000, help="demo reports in the corpus (~1 KB each)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the GPU's dense bf16 peak (H200: ~790)")
    parser.add_argument("--tiny", action="store_true", help="tiny model and blocks: a CPU smoke run of this script")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where gpu.{md,json} go")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="block lengths to run (default: 128 512; with --tiny 32 64)"
    )
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.tiny:
        print("no CUDA device: this check needs a GPU (use --tiny for a CPU smoke run of the script)", file=sys.stderr)
        return 2
    dims = TINY if args.tiny else BERT_BASE
    rows, specs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths or ((32, 64) if args.tiny else (128, 512)):
            o = overrides(args, dims, length)
            spec = {
                "length": length,
                "steps": args.steps,
                "micro": o["pretrain.micro_batch_size"],
                "accum": o["pretrain.gradient_accumulation_steps"],
                "dims": dims,
            }
            flops_per_token = model_flops_per_token(dims, 30522, length, o.get("pretrain.mlm_probability", 0.15))
            specs.append({**spec, "gflop_per_token": round(flops_per_token / 1e9, 3)})
            project = Path(tmp) / f"project_{length}"
            measure(PREPARE, str(project), json.dumps(o))
            runs = [
                ("ours: adaptbert pretrain (masked-only head, packed blocks)", OURS, [json.dumps(o)]),
                ("ours + torch.compile", OURS, [json.dumps({**o, "pretrain.torch_compile": True})]),
                ("plain run_mlm --bf16 (grouped texts, dense head)", PLAIN, ["grouped", json.dumps(spec)]),
            ]
            for name, code, extra in (
                runs[::2] if args.tiny else runs
            ):  # --tiny: no compile (minutes on CPU; tests/test_pretrain covers it)
                m = measure(code, str(project), *extra)
                info = json.loads(m.pop("output").splitlines()[-1])
                tps = (
                    info["warm_tokens_per_s"] or info["real_tokens"] / info["train_seconds"]
                )  # warm: after the first 2 steps
                rows.append(
                    {
                        "length": length,
                        "method": name,
                        "precision": info["precision"],
                        "steps": info["steps"],
                        "real_tokens": info["real_tokens"],
                        "train_seconds": info["train_seconds"],
                        "steps_per_s": round(info["steps"] / info["train_seconds"], 2),
                        "real_tokens_per_s": round(tps),
                        "mfu": round(tps * flops_per_token / (args.peak_tflops * 1e12), 4),
                        "peak_gib": None if info["peak_gib"] is None else round(info["peak_gib"], 1),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (tiny smoke run)"
    write(args, rows, device, specs)
    return 0


def write(args: argparse.Namespace, rows: list[dict], device: str, specs: list[dict]) -> None:
    lines = [
        "| length | method | precision | steps | real tokens | s | steps/s | warm real tokens/s | MFU | peak GPU memory (GiB) "
        "| ours / this (tokens/s) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ours = next(o for o in rows if o["length"] == r["length"])
        lines.append(
            f"| {r['length']} | {r['method']} | {r['precision']} | {r['steps']} | {r['real_tokens']} | {r['train_seconds']} | "
            f"{r['steps_per_s']} | {r['real_tokens_per_s']} | {r['mfu']:.1%} | {r['peak_gib']} | "
            f"{ours['real_tokens_per_s'] / r['real_tokens_per_s']:.2f} |"
        )
    command = (
        "python -m benchmarks.gpu_check"
        + (" --tiny" if args.tiny else "")
        + f" --steps {args.steps} --docs {args.docs}"
        + (f" --lengths {' '.join(map(str, args.lengths))}" if args.lengths else "")
    )
    shapes = "; ".join(
        f"{s['length']} tokens: micro batch {s['micro']} x {s['accum']} accumulation, {s['gflop_per_token']} GFLOP/token"
        for s in specs
    )
    note = (
        f"{device}, {time.strftime('%Y-%m-%d')}: `{command}`. Model dims {specs[0]['dims']}; {shapes}; peak {args.peak_tflops:.0f} "
        "TFLOP/s. Warm = after the first 2 steps."
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.md").write_text(f"# gpu check\n\n{note}\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (args.out / "gpu.json").write_text(
        json.dumps(
            {"command": command, "date": time.strftime("%Y-%m-%d"), "device": device, "specs": specs, "rows": rows},
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
