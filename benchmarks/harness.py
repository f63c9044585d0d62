"""What every benchmark shares: the repository root, a synthetic corpus of any size, a measured child
process (wall seconds and peak RSS of a fresh interpreter) and the results files that ``python -m
benchmarks report`` turns into BENCHMARKS.md (each named with the command, the date and the machine).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def demo_reports(seed: int) -> list[str]:
    """The demo generator's ~10 MB of trial reports (9000 documents), the base every synthetic corpus repeats."""
    sys.path.insert(0, str(ROOT))
    from pipeline.core.config import load_config
    from pipeline.text.demo_domain import build_world, iter_corpus

    cfg = load_config(ROOT / "params.yaml", {"demo.corpus_docs": 9000}).demo
    return [d["text"] for d in iter_corpus(build_world(cfg), cfg, random.Random(seed))]


def make_corpus(path: Path, megabytes: int, seed: int = 0) -> int:
    """Write ~``megabytes`` MB of JSONL documents; return the document count."""
    base = demo_reports(seed)
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    written = docs = copy = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            for text in base:
                if copy:
                    text = f"{text} Trial registry copy {copy}."
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                if rng.random() < 0.03:
                    line += line  # a verbatim duplicate
                    docs += 1
                f.write(line)
                written += len(line.encode("utf-8"))
                docs += 1
                if written >= target:
                    break
            copy += 1
    return docs


def make_sharded_corpus(folder: Path, megabytes: int, shard_mb: int = 64, seed: int = 0) -> int:
    """Write ~``megabytes`` MB of distinct JSONL documents as files of ``shard_mb`` MB; return the document count.

    Every pass over the demo's ~10 MB of reports enciphers its letters with a new permutation (``str.translate``,
    C speed), so passes share no words and are not near-copies of each other; 3% of the documents are written
    twice (exact duplicates) and 1% again with one sentence appended (near-duplicates), so dedup has work.
    """
    import string

    base = demo_reports(seed)
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    target, shard_bytes = megabytes * 1_000_000, shard_mb * 1_000_000
    written = docs = shard = 0
    out = open(folder / "part-00000.jsonl", "w", encoding="utf-8")  # noqa: SIM115 (a new file every shard_mb)
    letters = string.ascii_lowercase
    while written < target:
        cipher = str.maketrans(letters, "".join(rng.sample(letters, len(letters))))
        for text in base:
            text = text.translate(cipher)
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            roll = rng.random()
            if roll < 0.03:
                line += line  # a verbatim duplicate
                docs += 1
            elif roll < 0.04:
                line += json.dumps({"text": f"{text} Reviewed again by the board."}) + "\n"  # a near-duplicate
                docs += 1
            out.write(line)
            written += len(line.encode("utf-8"))
            docs += 1
            if written >= target:
                break
            if written >= (shard + 1) * shard_bytes:
                out.close()
                shard += 1
                out = open(folder / f"part-{shard:05d}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
    out.close()
    return docs


def measure(code: str, *args: str) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter; return wall seconds and peak RSS (MB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"benchmark child failed:\n{out}\n{err}")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "output": out.strip()}


def measured_row(
    method: str, code: str, *args: str, rates: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """One table row: ``code`` (whose last output line is a JSON object) run by :func:`measure`, that object,
    the figures ``rates`` derives from it, and the peak RSS (MB); echoed to stderr as it comes."""
    m = measure(code, *args)
    info = json.loads(m.pop("output").splitlines()[-1])
    row = {"method": method, **info, **rates(info), "peak_rss_mb": round(m["peak_rss_mb"])}
    print(json.dumps(row), file=sys.stderr)
    return row


def best_of_rounds(rounds: int, jobs: list[Any], run: Callable[[Any], dict], seconds: str) -> list[dict]:
    """``run(job)`` for every job, ``rounds`` times in turn (interleaved, so that other work on the machine slows
    every variant alike); per job the row of its fastest round (least ``row[seconds]``: noise only slows a run)."""
    best: dict[int, dict] = {}
    for _ in range(rounds):
        for i, job in enumerate(jobs):
            row = run(job)
            print(json.dumps(row), file=sys.stderr)
            if i not in best or row[seconds] < best[i][seconds]:
                best[i] = row
    return [best[i] for i in range(len(jobs))]


def save_results(name: str, args: str, note: str, table: str, rows: Any = None) -> None:
    """Print ``table`` and keep it, with the command and machine, in ``benchmarks/results/<name>.md``
    (and the raw ``rows`` in ``<name>.json``, which ``python -m benchmarks report`` reads)."""
    from pipeline.modelling.precision import detect_hardware

    machine = detect_hardware().describe()
    header = (
        f"# {name} benchmark\n\n`python -m benchmarks.{name} {args}` on {machine}, {os.cpu_count()} CPU cores, "
        f"{time.strftime('%Y-%m-%d')}. {note}\n\n"
    )
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{name}.md").write_text(header + table + "\n", encoding="utf-8")
    if rows is not None:
        meta = {
            "command": f"python -m benchmarks.{name} {args}".strip(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine,
            "cpu_count": os.cpu_count(),
        }
        (HERE / "results" / f"{name}.json").write_text(
            json.dumps({**meta, "rows": rows}, indent=1) + "\n", encoding="utf-8"
        )
    print(table)
