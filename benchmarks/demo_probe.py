"""What an encoder knows of the demo's facts: each drug's class, by fill-mask.

    python -m benchmarks.demo_probe models/dapt          # the adapted encoder of the last `dvc repro`

For every drug of the demo world (``params.yaml`` demo section), the MLM head scores the four
class words at the mask of "<drug> is an [MASK] of <target>." (the corpus's fact sentence; each
class is one WordPiece token, so the scores compare alike). Prints, per split, how many drugs
get their own class ranked first; chance is a quarter. Labels are never used: a probe of what
pretraining taught, not a task.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core.config import load_config
from pipeline.text import demo_domain as demo


def class_probe(model_dir: Path, world: demo.World) -> dict[str, dict[str, int]]:
    """Per split: drugs whose own class scores highest at the mask, out of how many."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    class_ids = tok.convert_tokens_to_ids(demo.CLASSES)
    if tok.unk_token_id in class_ids:
        raise SystemExit(f"a class word is not one token of {model_dir}'s vocab: {demo.CLASSES}")
    out = {split: {"correct": 0, "drugs": 0} for split in demo.SPLITS}
    for drug in world.drugs:
        enc = tok(f"{drug.name} is an {tok.mask_token} of {drug.target}.", return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]
        at_mask = logits[(enc["input_ids"][0] == tok.mask_token_id).nonzero()[0, 0], class_ids]
        out[drug.split]["correct"] += int(demo.CLASSES[int(at_mask.argmax())] == drug.klass)
        out[drug.split]["drugs"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_probe", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="a masked-LM directory (e.g. models/dapt)")
    parser.add_argument(
        "--params", type=Path, default=Path("params.yaml"), help="the params whose demo section built the data"
    )
    args = parser.parse_args(argv)
    result = class_probe(args.model_dir, demo.build_world(load_config(args.params).demo))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
