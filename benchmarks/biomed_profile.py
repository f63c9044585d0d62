"""Real-data profile: DAPT-vs-baseline on ../shared/data/biomed (PubMed RCT roles + NCBI-disease NER).

    python -m benchmarks.biomed_profile /tmp/biomed              # 60 DAPT steps, 600 fine-tune steps (~20-45 min on 2 cores)
    python -m benchmarks.biomed_profile /tmp/biomed --pretrain-steps 10 --finetune-steps 100

Runs ingest -> validate -> tokenize -> pretrain -> finetune -> evaluate in the given directory
with params.yaml plus overrides (corpus and task paths read in place, never copied), then prints
the summary and per-task test metrics of both models from ``reports/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.ingest import ROOT

BIO = ROOT.parent / "shared" / "data" / "biomed"


def profile_overrides(pretrain_steps: int, finetune_steps: int) -> dict:
    def splits(task: str) -> dict[str, str]:
        return {"train": str(BIO / task / "train.jsonl"), "validation": str(BIO / task / "dev.jsonl"), "test": str(BIO / task / "test.jsonl")}

    return {
        "ingest.corpus.sources": [{"type": "files", "path": str(BIO / "corpus" / "*.jsonl")}],
        "ingest.tasks": [{"name": "rct", "type": "sequence_classification", "files": splits("rct")},
                         {"name": "ncbi_disease", "type": "token_classification", "files": splits("ncbi_disease")}],
        "tokenize.domain_terms": None,
        "pretrain.max_steps": pretrain_steps, "pretrain.eval_steps": pretrain_steps, "pretrain.save_steps": pretrain_steps,
        "pretrain.warmup_steps": max(1, pretrain_steps // 10),
        "finetune.max_steps": finetune_steps, "finetune.eval_steps": max(10, finetune_steps // 6),
        "finetune.tasks": {"rct": {"metric": "micro_f1"}},  # PubMed RCT results are reported as micro-F1
    }


def main() -> None:
    from pipeline import evaluate, finetune, ingest, pretrain, tokenize, validate
    from pipeline.config import load_config
    from pipeline.paths import Paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="working directory for the profile's data, models and reports")
    parser.add_argument("--pretrain-steps", type=int, default=60)
    parser.add_argument("--finetune-steps", type=int, default=600)
    args = parser.parse_args()
    if not BIO.exists():
        raise SystemExit(f"{BIO} not found: the profile reads ../shared/data/biomed in place")
    cfg = load_config(ROOT / "params.yaml", profile_overrides(args.pretrain_steps, args.finetune_steps))
    paths = Paths(args.root)
    for stage in (ingest, validate, tokenize, pretrain, finetune, evaluate):
        start = time.perf_counter()
        stage.run(cfg, paths)
        print(f"{stage.__name__.rsplit('.', 1)[-1]}: {time.perf_counter() - start:.1f} s", flush=True)
    metrics = json.loads(paths.metrics.read_text(encoding="utf-8"))
    print(json.dumps(metrics["summary"], indent=1))
    for name, t in metrics["tasks"].items():
        p = t["primary"]
        print(f"{name} {p}: trivial {t['trivial'][p]:.3f}, baseline {t['baseline'][p]:.3f}, adapted {t['adapted'][p]:.3f}, "
              f"delta {t['delta']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]")


if __name__ == "__main__":
    main()
