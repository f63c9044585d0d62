"""A compressed variant on disk: one directory that loads, serves and is measured like ``models/finetuned``.

Layout: ``config.json`` (the student's ``BertConfig``), ``model.safetensors`` (the whole multi-task
model: encoder and every head; int8 values and scales where quantised), the tokenizer,
``tasks.json`` (as the full model's), ``compression.json`` (what was done: the teacher layers
kept, the heads kept per layer, the INT8 settings) and a model card ``README.md``.
:func:`load_model` loads either kind of directory (it sees ``compression.json``), so scoring and
serving need nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.compression.quantize import Backend, int8_tensors, is_int8, load_int8_tensors, machine_backend, quantize
from pipeline.core.errors import DataError
from pipeline.training.multitask import MultiTaskModel, load_multitask, read_specs

META = "compression.json"


def variant_meta(
    variant: str,
    layers: list[int] | None,
    heads: dict[int, list[int]] | None,
    backend: Backend | None,
    requested_backend: str,
    per_channel: bool,
) -> dict[str, Any]:
    """What ``compression.json`` records for a variant (JSON keys are strings)."""
    return {
        "variant": variant,
        "teacher_layers": layers,
        "heads": {str(k): v for k, v in heads.items()} if heads is not None else None,
        "int8": {"backend": requested_backend, "engine_at_compression": backend.engine, "per_channel": per_channel}
        if backend
        else None,
    }


def save_variant(model: Any, tokenizer: Any, out: Path, meta: dict[str, Any], card: str, tasks_json: str) -> None:
    """Write a variant directory (see the module docstring)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    model.encoder.config.save_pretrained(out)
    tensors = (
        int8_tensors(model)
        if is_int8(model)
        else {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    )
    save_file(tensors, str(out / "model.safetensors"))
    tokenizer.save_pretrained(out)
    (out / "tasks.json").write_text(tasks_json, encoding="utf-8")
    (out / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(card, encoding="utf-8")


def load_model(model_dir: Path) -> tuple[MultiTaskModel, Any]:
    """The model and tokenizer of ``models/finetuned`` or of a compressed variant directory."""
    if not (model_dir / META).exists():
        return load_multitask(model_dir)
    from transformers import AutoTokenizer

    return load_compressed(model_dir, read_specs(model_dir)), AutoTokenizer.from_pretrained(model_dir)


def load_compressed(model_dir: Path, specs: list[Any]) -> MultiTaskModel:
    """The multi-task model of a variant directory: skeleton from the config, heads sliced, quantised, weights loaded."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    from pipeline.compression.prune import slice_heads

    meta_file = model_dir / META
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        config = BertConfig.from_pretrained(model_dir, attn_implementation="sdpa")
        tensors = load_file(str(model_dir / "model.safetensors"))
    except (OSError, ValueError, SafetensorError) as err:  # a missing, truncated or corrupt file of the variant
        raise DataError(
            model_dir, None, "corrupt-model", f"cannot load the compressed model in {model_dir}: {err}; re-run compress"
        ) from None
    torch.manual_seed(0)  # the skeleton's random init is overwritten; seeded only to be reproducible
    encoder = BertModel(config, add_pooling_layer=False)
    if meta.get("heads"):
        slice_heads(encoder, {int(k): v for k, v in meta["heads"].items()})
    model = MultiTaskModel(encoder, specs, dropout=0.0).eval()
    try:
        if meta.get("int8"):
            model = quantize(model, machine_backend(meta["int8"]["backend"]), meta["int8"]["per_channel"])
            load_int8_tensors(model, tensors)
        else:
            model.load_state_dict(tensors)
    except (KeyError, RuntimeError, ValueError) as err:
        raise DataError(
            model_dir / "model.safetensors",
            None,
            "corrupt-model",
            f"the weights do not fit {META} / config.json ({str(err)[:300]}); re-run compress",
        ) from None
    return model.eval()
