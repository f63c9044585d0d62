"""Benchmark: the pretrain stage vs the plain ``run_mlm.py`` recipe, same model, data and steps.

    python -m benchmarks.pretrain                # 10 optimiser steps of 16 x 128 each way (~5 minutes on 2 cores)
    python -m benchmarks.pretrain --steps 20

Both train all-MiniLM-L6-v2 (offline) with the HF Trainer, AdamW, batch 16, max length 128,
token masking at 15%, on the demo corpus, in fresh processes:

1. ours: ``pipeline.pretrain.run`` on the packed ``[CLS] ... [SEP]`` blocks of the tokenize stage
   (no padding; every token kept) with our collator and SDPA attention;
2. plain: what ``run_mlm.py --line_by_line --pad_to_max_length`` users run: each line of the
   corpus tokenized on its own, truncated and padded to 128, ``DataCollatorForLanguageModeling``.

How much the plain recipe wastes depends on line length, so it runs on two layouts of the same
text: one document per line (the demo corpus as ingested, ~190 tokens a line: truncation drops
a third of the text, little padding) and one sentence per line (~25 tokens a line: mostly
padding). Throughput counts real (non-pad) tokens. Results: ``benchmarks/results/pretrain.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.ingest import ROOT, _measure, make_corpus, save_results

PREPARE = """
import sys
from pathlib import Path
from pipeline.config import load_config
from pipeline.paths import Paths
from pipeline import demo, ingest, validate, tokenize
cfg = load_config("params.yaml", {"tokenize.extend_vocab.enabled": False})
paths = Paths(Path(sys.argv[1]))
demo.run(cfg.demo, paths.demo); ingest.run(cfg, paths); validate.run(cfg, paths); tokenize.run(cfg, paths)
"""

OURS = """
import sys, json
from pathlib import Path
from pipeline.config import load_config
from pipeline.paths import Paths
from pipeline import pretrain
steps = int(sys.argv[2])
cfg = load_config("params.yaml", {"pretrain.max_steps": steps, "pretrain.masking": "token", "pretrain.eval_steps": 10**6,
                                  "pretrain.save_steps": 10**6, "pretrain.logging_steps": 1,
                                  "pretrain.eval_max_blocks": 16, "pretrain.warmup_steps": 1})
r = pretrain.run(cfg, Paths(Path(sys.argv[1])))
print(json.dumps({"real_tokens": r["tokens_seen"], "train_seconds": r["train_seconds"], "steps": r["global_step"],
                  "train_blocks": r["train_blocks"]}))
"""

PREPARE_SIZED = """
import sys
from pathlib import Path
from pipeline.config import load_config
from pipeline.paths import Paths
from pipeline import ingest, tokenize
cfg = load_config("params.yaml", {"ingest.corpus.sources": [{"type": "files", "path": sys.argv[1]}], "ingest.tasks": [],
                                  "finetune.tasks": {}, "ingest.corpus.min_chars": 1, "ingest.corpus.min_words": 1,
                                  "tokenize.extend_vocab.enabled": False, "tokenize.domain_terms": None})
paths = Paths(Path(sys.argv[2]))
ingest.run(cfg, paths)
tokenize.run(cfg, paths)
"""

PLAIN = """
import sys, json, re, time
import pyarrow.parquet as pq
import torch
from datasets import Dataset
from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments
from pipeline.models import load_tokenizer, resolve_base
root, steps, layout = sys.argv[1], int(sys.argv[2]), sys.argv[3]
texts = pq.read_table(root + "/data/corpus/train.parquet", columns=["text"])["text"].to_pylist()
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
trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15),
                  processing_class=tok)
start = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - start
lengths = [sum(m) for m in ds["attention_mask"]]
print(json.dumps({"real_tokens": int(trainer.state.num_input_tokens_seen), "train_seconds": round(seconds, 1), "steps": steps,
                  "mean_real_tokens_per_line": round(sum(lengths) / len(lengths), 1),
                  "truncated_lines": sum(1 for t in texts if len(tok(t)["input_ids"]) > 128)}))
"""


def bench(steps: int, workdir: Path) -> list[dict]:
    project = workdir / "project"
    _measure(PREPARE, str(project))
    rows = []
    for name, code, args in (("adaptbert pretrain (packed blocks)", OURS, []),
                             ("plain run_mlm, one document per line", PLAIN, ["documents"]),
                             ("plain run_mlm, one sentence per line", PLAIN, ["sentences"])):
        m = _measure(code, str(project), str(steps), *args)
        info = json.loads(m.pop("output").splitlines()[-1])
        rows.append({"method": name, "steps": info["steps"], "real_tokens": info["real_tokens"], "train_seconds": info["train_seconds"],
                     "s_per_step": round(info["train_seconds"] / info["steps"], 2),
                     "real_tokens_per_s": round(info["real_tokens"] / info["train_seconds"]), "peak_rss_mb": round(m["peak_rss_mb"]),
                     **{k: v for k, v in info.items() if k in ("mean_real_tokens_per_line", "truncated_lines")}})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def scale(sizes: list[int], steps: int, workdir: Path) -> list[dict]:
    """Our pretraining throughput and peak memory on corpora of ``sizes`` MB (prepared untimed)."""
    rows = []
    for mb in sizes:
        corpus, project = workdir / f"corpus_{mb}mb.jsonl", workdir / f"scale_{mb}"
        make_corpus(corpus, mb)
        _measure(PREPARE_SIZED, str(corpus), str(project))
        corpus.unlink()
        m = _measure(OURS, str(project), str(steps))
        info = json.loads(m.pop("output").splitlines()[-1])
        rows.append({"size_mb": mb, "train_blocks": info["train_blocks"], "steps": info["steps"], "real_tokens": info["real_tokens"],
                     "real_tokens_per_s": round(info["real_tokens"] / info["train_seconds"]), "peak_rss_mb": round(m["peak_rss_mb"])})
        print(json.dumps(rows[-1]), file=sys.stderr)
        shutil.rmtree(project)
    return rows


def scale_markdown(rows: list[dict]) -> str:
    lines = ["| corpus | train blocks (x128 tokens) | steps | real tokens/s | peak RSS (MB) |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['size_mb']} MB | {r['train_blocks']} | {r['steps']} | {r['real_tokens_per_s']} | {r['peak_rss_mb']} |" for r in rows]
    return "\n".join(lines)


def to_markdown(rows: list[dict]) -> str:
    ours = rows[0]
    lines = ["| method | steps | real tokens | s/step | real tokens/s | peak RSS (MB) | ours / this (tokens/s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{ours['real_tokens_per_s'] / r['real_tokens_per_s']:.2f}"
        lines.append(f"| {r['method']} | {r['steps']} | {r['real_tokens']} | {r['s_per_step']} | {r['real_tokens_per_s']} | {r['peak_rss_mb']} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--scale-sizes", type=int, nargs="*", default=[], help="also: our throughput on corpora of these sizes (MB)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        rows = bench(args.steps, Path(tmp))
        scaled = scale(args.scale_sizes, args.steps, Path(tmp)) if args.scale_sizes else []
    table = to_markdown(rows)
    if scaled:
        table += "\n\nOur stage on corpora of growing size (same steps; blocks are memory-mapped Arrow):\n\n" + scale_markdown(scaled)
    sizes = f" --scale-sizes {' '.join(map(str, args.scale_sizes))}" if args.scale_sizes else ""
    save_results("pretrain", f"--steps {args.steps}{sizes}", "Same model (all-MiniLM-L6-v2 + fresh MLM head), batch 16, length 128, "
                 "token masking, HF Trainer on CPU; real tokens exclude padding.", table, {"methods": rows, "scaling": scaled})


if __name__ == "__main__":
    main()
