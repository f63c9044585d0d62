"""Benchmark: ingest's near-duplicate and contamination checks against exact-hash dedup and datasketch.

    python -m benchmarks.dedup                    # the biomed corpus (../shared/data), ~1 minute on 2 cores
    python -m benchmarks.dedup --copies 4         # the same corpus 4 times over (each copy re-worded): cost vs size

On the normalised documents of the corpus (normalisation is not timed: every method needs it):

- exact-hash dedup: ingest's ``text_hash`` (blake2b, 64 bits) of every document and a set of them;
- near-duplicates: :class:`pipeline.text.neardup.NearDuplicateIndex` (word 5-grams, rensa MinHash, LSH),
  the ``params.yaml`` settings;
- decontamination: :class:`pipeline.text.neardup.EvaluationIndex` over the validation and test inputs
  of the corpus's tasks (RCT and NCBI-disease sentences), every corpus sentence checked (its recall on planted
  near-copies: ``python -m benchmarks.decontamination``);
- both, as ingest runs them (the words of a batch hashed once);
- the obvious alternative: datasketch, one ``MinHash`` per document from its 5-gram strings
  (``update_batch``) and a ``MinHashLSH`` query + insert per document, on the first 500 documents
  (it is too slow for all of them) and reported per document.

Each method runs ``--repeats`` times in one fresh process per method (peak RSS = its ``ru_maxrss``,
loading included); the table keeps the fastest repeat. Results: ``benchmarks/results/dedup.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness import ROOT, measured_row, save_results

BIOMED = ROOT.parent / "shared" / "data" / "biomed"

# argv: method, copies, repeats. Prints {"docs": n, "seconds": fastest repeat, "dropped": n}.
CODE = """
import sys, json, time
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.text import neardup as nd
from pipeline.text.textnorm import normalize_text, text_hash
method, copies, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
root = Path(sys.argv[4])
ic = load_config("params.yaml").ingest
base = [normalize_text(json.loads(l)["text"]) for l in open(root / "corpus" / "train.jsonl", encoding="utf-8")]
docs = base + [f"{d} Copy {c} of the record." for c in range(1, copies) for d in base]
evaluation = []
for task, field in (("rct", "text"), ("ncbi_disease", "tokens")):
    for split in ("dev", "test"):
        for line in open(root / task / f"{split}.jsonl", encoding="utf-8"):
            r = json.loads(line)
            evaluation.append((task, split, normalize_text(r[field] if field == "text" else " ".join(r[field]))))
m, n, d = ic.minhash, ic.near_duplicates, ic.decontamination
batch = ic.chunk_docs

def exact():
    seen = set()
    return sum(1 for t in docs if (h := text_hash(t)) in seen or seen.add(h))

def near():
    index = nd.NearDuplicateIndex(n.threshold, n.shingle_words, m.num_perm, m.seed)
    return sum(x is not None for i in range(0, len(docs), batch)
               for x in index.check_batch(nd.words_of(docs[i:i + batch]), [str(j) for j in range(i, i + batch)][:len(docs[i:i + batch])]))

def decontaminate(index=None):
    index = index or nd.EvaluationIndex(evaluation, d.threshold, d.shingle_words, ic.leakage_min_chars, d.common_share)
    return sum(x is not None for i in range(0, len(docs), batch)
               for x in index.contaminated(docs[i:i + batch], nd.words_of(docs[i:i + batch])))

def both():
    near_index = nd.NearDuplicateIndex(n.threshold, n.shingle_words, m.num_perm, m.seed)
    evaluation_index = nd.EvaluationIndex(evaluation, d.threshold, d.shingle_words, ic.leakage_min_chars, d.common_share)
    dropped = 0
    for i in range(0, len(docs), batch):
        chunk = docs[i:i + batch]
        words = nd.words_of(chunk)
        bad = evaluation_index.contaminated(chunk, words)
        dup = near_index.check_batch(words, [str(j) for j in range(i, i + len(chunk))])
        dropped += sum(b is not None or u is not None for b, u in zip(bad, dup))
    return dropped

def datasketch_lsh():
    from datasketch import MinHash, MinHashLSH
    global docs
    docs = docs[:500]
    lsh, dropped = MinHashLSH(threshold=n.threshold, num_perm=m.num_perm), 0
    for i, t in enumerate(docs):
        w = t.lower().split()
        grams = [" ".join(w[j:j + n.shingle_words]).encode() for j in range(max(len(w) - n.shingle_words + 1, 1))]
        mh = MinHash(num_perm=m.num_perm, seed=m.seed)
        mh.update_batch(grams)
        if lsh.query(mh):
            dropped += 1
        else:
            lsh.insert(str(i), mh)
    return dropped

run = {"exact": exact, "near": near, "decontaminate": decontaminate, "both": both, "datasketch": datasketch_lsh}[method]
best, dropped = float("inf"), 0
for _ in range(repeats):
    start = time.perf_counter()
    dropped = run()
    best = min(best, time.perf_counter() - start)
print(json.dumps({"docs": len(docs), "seconds": round(best, 3), "dropped": dropped}))
"""

METHODS = {
    "exact": "exact-hash dedup (blake2b + set)",
    "near": "near-duplicates (rensa MinHash, LSH; ours)",
    "decontaminate": "decontamination, every corpus sentence (ours)",
    "both": "near-duplicates + decontamination, as ingest runs them (ours)",
    "datasketch": "datasketch MinHash + MinHashLSH per document (500 documents)",
}


def bench(copies: int, repeats: int, data: Path) -> list[dict]:
    """One row per method, fastest of ``repeats``, methods interleaved over the repeats' processes."""
    rows = []
    for method, title in METHODS.items():
        rows.append(
            measured_row(
                title,
                CODE,
                method,
                str(copies),
                str(repeats),
                str(data),
                rates=lambda r: {"docs_per_s": round(r["docs"] / max(r["seconds"], 1e-9))},
            )
        )
    exact = rows[0]["docs_per_s"]
    for row in rows:
        row["vs_exact"] = round(row["docs_per_s"] / exact, 3)
    return rows


def to_markdown(rows: list[dict]) -> str:
    """The table of ``bench``'s rows."""
    lines = [
        "| method | documents | seconds | documents/s | dropped | documents/s vs exact-hash dedup | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['method']} | {r['docs']} | {r['seconds']} | {r['docs_per_s']} | {r['dropped']} | {r['vs_exact']:.3f} | "
        f"{r['peak_rss_mb']} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1, help="the corpus this many times (copies re-worded)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per method (the fastest is kept)")
    parser.add_argument("--data", type=Path, default=BIOMED, help="a folder laid out like ../shared/data/biomed")
    args = parser.parse_args()
    if not (args.data / "corpus" / "train.jsonl").exists():
        raise SystemExit(f"benchmarks.dedup: {args.data}/corpus/train.jsonl not found (the shared biomed data)")
    rows = bench(args.copies, args.repeats, args.data)
    save_results(
        "dedup",
        f"--copies {args.copies} --repeats {args.repeats}",
        "Normalised documents of the biomed corpus (3,807 PMC articles, 4.2 KB each on average); normalisation is "
        "not timed. Checks are the params.yaml settings (near-duplicates: Jaccard 0.8 over word 5-grams, 128 "
        "permutations; decontamination: containment 0.7 of an evaluation sentence's word 2-grams in a corpus "
        "sentence).",
        to_markdown(rows),
        rows,
    )
    print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
