"""Benchmark: the tokenize stage vs a bare ``tokenizer(batch_of_texts)`` over the same texts.

    python -m benchmarks.tokenize                 # 10 MB and 100 MB corpora (about 3 minutes on 2 cores)
    python -m benchmarks.tokenize --sizes 10 100 300

Each corpus is made like the ingest benchmark's (demo reports, repeated with perturbations),
ingested once (not timed), then measured in fresh processes:

- ours: ``pipeline.stages.tokenize.run`` with the repository defaults (vocab mining over the corpus,
  extension, packing into blocks, Arrow output), i.e. the whole stage;
- bare: read the same texts from the ingest Parquet and call the base tokenizer on batches of
  1000 texts (``tokenizer(texts)``, the HF call ``run_mlm`` makes), keeping nothing.

Tokens/s counts the corpus tokens under the base tokenizer for both, so the ratio is time-based.
Results: a Markdown table on stdout and in ``benchmarks/results/tokenize.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT, make_corpus, measure, save_results

INGEST = """
import sys
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import ingest
cfg = load_config("params.yaml", {"ingest.corpus.sources": [{"type": "files", "path": sys.argv[1]}], "ingest.tasks": [], "finetune.tasks": {},
                                  "ingest.corpus.min_chars": 1, "ingest.corpus.min_words": 1})
ingest.run(cfg, Paths(Path(sys.argv[2])))
"""

OURS = """
import sys, json
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import tokenize
cfg = load_config("params.yaml", {"tokenize.domain_terms": None})
r = tokenize.run(cfg, Paths(Path(sys.argv[1])), require_validation=False)  # generated corpus: times tokenize alone
print(json.dumps({"packed_tokens": r.tokens, "blocks": r.blocks, "new_tokens": r.new_tokens, "stage_seconds": r.seconds}))
"""

BARE = """
import sys, json
import pyarrow.parquet as pq
from pipeline.modelling.models import load_tokenizer
tok = load_tokenizer("minilm", "base")
tokens = 0
for split in ("train", "validation"):
    texts = pq.read_table(sys.argv[1] + f"/data/corpus/{split}", columns=["text"])["text"].to_pylist()
    for i in range(0, len(texts), 1000):
        enc = tok(texts[i:i + 1000], add_special_tokens=False)
        tokens += sum(len(x) for x in enc["input_ids"])
print(json.dumps({"base_tokens": tokens}))
"""


def bench(sizes: list[int], workdir: Path) -> list[dict]:
    rows = []
    for mb in sizes:
        corpus = workdir / f"corpus_{mb}mb.jsonl"
        make_corpus(corpus, mb)
        project = workdir / f"project_{mb}"
        measure(INGEST, str(corpus), str(project))
        corpus.unlink()
        bare = measure(BARE, str(project))
        base_tokens = json.loads(bare.pop("output").splitlines()[-1])["base_tokens"]
        ours = measure(OURS, str(project))
        info = json.loads(ours.pop("output").splitlines()[-1])
        for name, m, extra in (
            ("adaptbert tokenize (whole stage)", ours, info),
            ("bare tokenizer(batch) x1000", bare, {}),
        ):
            rows.append(
                {
                    "size_mb": mb,
                    "method": name,
                    "base_tokens": base_tokens,
                    "seconds": round(m["seconds"], 2),
                    "tokens_per_s": round(base_tokens / m["seconds"]),
                    "peak_rss_mb": round(m["peak_rss_mb"]),
                    **extra,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| corpus | method | base tokens | seconds | tokens/s | peak RSS (MB) | throughput ratio (ours/bare) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for ours, bare in zip(rows[::2], rows[1::2], strict=True):
        for r in (ours, bare):
            ratio = f"{bare['seconds'] / ours['seconds']:.2f}" if r is ours else ""
            lines.append(
                f"| {r['size_mb']} MB | {r['method']} | {r['base_tokens']} | {r['seconds']} | {r['tokens_per_s']} | {r['peak_rss_mb']} | {ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100], help="corpus sizes in MB")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        rows = bench(args.sizes, Path(tmp))
    save_results(
        "tokenize",
        f"--sizes {' '.join(map(str, args.sizes))}",
        "Ours is the whole stage (word counting for vocab mining, "
        "extension, packing, Arrow output) with the repository defaults; bare only encodes.",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
