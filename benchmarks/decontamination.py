"""Benchmark: decontamination as a detector: its recall on planted near-copies of evaluation sentences, by sentence
length and kind of edit, and what it flags in text that holds none.

    python -m benchmarks.decontamination            # the biomed tasks and corpus (../shared/data), ~1 minute

Evaluation sentences: the validation and test inputs of RCT and NCBI-disease (sentences of >= leakage_min_chars
non-space characters, as ingest indexes them). For a seeded sample of those of 8 or more words, one near-copy of
each kind is planted into a biomed corpus document (after one of its sentence ends):

- ``one word``: a random inner word replaced by a corpus word; ``middle word``: the middle word replaced;
- ``two words``: two inner words replaced; ``re-cased``: one word replaced, upper-cased and double-spaced;
- ``joined``: one word replaced, its full stop dropped and other words before and after it in the same sentence.

Detectors: ours, :class:`pipeline.text.neardup.EvaluationIndex` (containment of the evaluation sentence's 2-word
shingles in one corpus sentence) at several thresholds, searched through the whole index as ingest runs it; and
the rule it replaced, Jaccard >= 0.8 of the two sentences' 2-word shingles, computed exactly on each planted pair
(an upper bound on what its MinHash search found). Flagged in text that holds none: the demo's synthetic trial
reports (another, made-up domain) against the biomed evaluation sentences, and, for scale, the biomed corpus
itself (real PubMed text: what it flags there are near-copies or boilerplate, not known to be either).
Results: ``benchmarks/results/decontamination.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, demo_reports, save_results

BIOMED = ROOT.parent / "shared" / "data" / "biomed"
KINDS = ("one word", "middle word", "two words", "re-cased", "joined")
BUCKETS = ("8-11", "12-19", "20+")
THRESHOLDS = (0.6, 0.7, 0.8)


def evaluation_texts(data: Path) -> list[tuple[str, str, str]]:
    """``(task, split, text)`` of the biomed tasks' validation and test inputs, normalised as ingest reads them."""
    from pipeline.text.textnorm import normalize_text

    out = []
    for task, field in (("rct", "text"), ("ncbi_disease", "tokens")):
        for split, name in (("validation", "dev"), ("test", "test")):
            for line in (data / task / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
                r = json.loads(line)
                out.append((task, split, normalize_text(r[field] if field == "text" else " ".join(r[field]))))
    return out


def bucket(sentence: str) -> str:
    n = len(sentence.split())
    return BUCKETS[0] if n < 12 else BUCKETS[1] if n < 20 else BUCKETS[2]


def edit(sentence: str, kind: str, rng: random.Random, vocab: list[str]) -> str:
    """``sentence`` with the edit ``kind`` names."""
    words = sentence.split()
    inner = list(range(1, len(words) - 1))
    if kind == "middle word":
        words[len(words) // 2] = rng.choice(vocab)
    else:
        for i in rng.sample(inner, 2 if kind == "two words" else 1):
            words[i] = rng.choice(vocab)
    if kind == "re-cased":
        return "  ".join(words).upper()
    if kind == "joined":
        return "and, as noted, " + " ".join(words).rstrip(".") + " which others also reported"
    return " ".join(words)


def plant(host: str, text: str) -> str:
    """``text`` inside ``host``, after the first sentence end past its middle (or at its end)."""
    cut = host.find(". ", len(host) // 2)
    return f"{host[: cut + 2]}{text} {host[cut + 2 :]}" if cut > 0 else f"{host} {text}"


def shingle_set(text: str) -> set[int]:
    from pipeline.text import neardup as nd

    words = nd.words_of([text])
    flat, _ = nd.shingles(words.hashes, words.text_offsets, 2)
    return set(flat.tolist())


def jaccard(a: str, b: str) -> float:
    x, y = shingle_set(a), shingle_set(b)
    return len(x & y) / max(len(x | y), 1)


def flagged(index: Any, docs: list[str], batch: int = 500) -> list[Any]:
    from pipeline.text import neardup as nd

    return [
        h
        for i in range(0, len(docs), batch)
        for h in index.contaminated(docs[i : i + batch], nd.words_of(docs[i : i + batch]))
    ]


def bench(data: Path, sample: int, seed: int) -> dict[str, Any]:
    """Recall per detector, kind and length bucket; flags on clean and real text; documents/s."""
    from pipeline.core.config import load_config
    from pipeline.text import neardup as nd
    from pipeline.text.textnorm import normalize_text

    ic = load_config(ROOT / "params.yaml").ingest
    dc = ic.decontamination
    evaluation = evaluation_texts(data)
    corpus = [
        normalize_text(json.loads(line)["text"])
        for line in (data / "corpus" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    demo = [normalize_text(t) for t in demo_reports(seed)[:3000]]
    rng = random.Random(seed)
    vocab = sorted({w for d in corpus[:300] for w in d.split() if w.isalpha() and len(w) > 3})
    sentences = sorted(
        {t for _, _, t in evaluation if len(t.split()) >= 8 and len("".join(t.split())) >= ic.leakage_min_chars}
    )
    chosen = rng.sample(sentences, min(sample, len(sentences)))
    # one edit per sentence and kind, judged by both rules: ours inside a planted document, Jaccard on the pair
    edits = {k: [(s, edit(s, k, rng, vocab)) for s in chosen] for k in KINDS}
    planted = {k: [(s, plant(rng.choice(corpus), e)) for s, e in edits[k]] for k in KINDS}
    recall: dict[str, dict[str, dict[str, float]]] = {}
    flags: dict[str, dict[str, Any]] = {}
    for threshold in THRESHOLDS:
        start = time.perf_counter()
        index = nd.EvaluationIndex(evaluation, threshold, dc.shingle_words, ic.leakage_min_chars, dc.common_share)
        build = time.perf_counter() - start
        name = f"containment >= {threshold}" + (" (params.yaml)" if threshold == dc.threshold else "")
        recall[name] = {
            k: rates(
                [
                    (s, h is not None)
                    for (s, _), h in zip(planted[k], flagged(index, [d for _, d in planted[k]]), strict=True)
                ]
            )
            for k in KINDS
        }
        start = time.perf_counter()
        real = sum(h is not None for h in flagged(index, corpus))
        seconds = time.perf_counter() - start
        flags[name] = {
            "clean_flagged": sum(h is not None for h in flagged(index, demo)),
            "clean_docs": len(demo),
            "biomed_flagged": real,
            "biomed_docs": len(corpus),
            "docs_per_s": round(len(corpus) / seconds),
            "index_seconds": round(build, 2),
        }
    recall["Jaccard >= 0.8 of the two sentences (the rule before)"] = {
        k: rates([(s, jaccard(s, e) >= 0.8) for s, e in edits[k]]) for k in KINDS
    }
    return {"recall": recall, "flags": flags, "sentences": len(chosen), "indexed": index.size}


def rates(hits: list[tuple[str, bool]]) -> dict[str, float]:
    """Share found per length bucket, and over all."""
    out = {}
    for b in BUCKETS:
        found = [hit for s, hit in hits if bucket(s) == b]
        out[b] = round(sum(found) / len(found), 3) if found else float("nan")
    out["all"] = round(sum(hit for _, hit in hits) / len(hits), 3)
    out["n"] = {b: sum(bucket(s) == b for s, _ in hits) for b in BUCKETS}  # type: ignore[assignment]
    return out


def to_markdown(result: dict[str, Any]) -> str:
    """Recall table (detector x kind: per length bucket) and the flags table."""
    n = next(iter(next(iter(result["recall"].values())).values()))["n"]
    lines = [
        f"Recall on {result['sentences']} planted evaluation sentences of 8+ words ({', '.join(f'{b} words: {n[b]}' for b in BUCKETS)}), "
        "share found by length:",
        "",
        "| detector | " + " | ".join(KINDS) + " |",
        "|---|" + "---:|" * len(KINDS),
    ]
    for name, by_kind in result["recall"].items():
        cells = [" / ".join(f"{by_kind[k][b]:.2f}" for b in BUCKETS) for k in KINDS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(each cell: 8-11 / 12-19 / 20+ words)",
        "",
        "| detector | clean documents flagged (demo reports vs biomed sentences) | biomed corpus documents flagged | "
        "documents/s (biomed corpus) | index build (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, f in result["flags"].items():
        lines.append(
            f"| {name} | {f['clean_flagged']} of {f['clean_docs']} ({100 * f['clean_flagged'] / f['clean_docs']:.2f}%) | "
            f"{f['biomed_flagged']} of {f['biomed_docs']} ({100 * f['biomed_flagged'] / f['biomed_docs']:.2f}%) | "
            f"{f['docs_per_s']} | {f['index_seconds']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=600, help="evaluation sentences planted (each kind)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=BIOMED, help="a folder laid out like ../shared/data/biomed")
    args = parser.parse_args()
    if not (args.data / "corpus" / "train.jsonl").exists():
        raise SystemExit(
            f"benchmarks.decontamination: {args.data}/corpus/train.jsonl not found (the shared biomed data)"
        )
    result = bench(args.data, args.sample, args.seed)
    save_results(
        "decontamination",
        f"--sample {args.sample} --seed {args.seed}",
        "Planted near-copies of the biomed tasks' validation/test sentences in biomed corpus documents; 2-word "
        "shingles, params.yaml's common_share and leakage_min_chars.",
        to_markdown(result),
        result,
    )


if __name__ == "__main__":
    main()
