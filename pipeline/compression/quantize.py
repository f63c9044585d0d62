"""INT8 dynamic quantisation of every linear layer (encoder and heads) with ``torch.ao``, and its file format.

Dynamic quantisation stores the weights of ``nn.Linear`` as int8 and quantises activations on the
fly, per batch; embeddings and LayerNorms stay fp32. The kernels come from a quantisation engine
chosen like ``precision: auto`` (:func:`choose_backend`): ``x86`` (PyTorch's default on x86, which
runs oneDNN's VNNI / AMX-INT8 kernels where the CPU has them and fbgemm's otherwise) where the CPU
has VNNI or AMX-INT8, ``fbgemm`` on other x86 CPUs, ``qnnpack`` on ARM. An engine that this
PyTorch build lacks falls back to the next one, and says so.

Saved weights are the int8 values with their scales (safetensors, no pickle), independent of the
engine: the serving machine re-packs them for its own engine when it loads them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import DataError

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # /proc/cpuinfo names of the int8 dot products


@dataclass(frozen=True)
class Backend:
    """The quantisation engine chosen, why, and the fallbacks taken on the way."""

    engine: str
    reason: str
    fallbacks: tuple[str, ...] = field(default_factory=tuple)


def choose_backend(requested: str, supported: Iterable[str], flags: frozenset[str], machine: str) -> Backend:
    """The engine for ``requested`` (auto | x86 | onednn | fbgemm | qnnpack) on a CPU with ``flags``.

    Pure (the machine is passed in) so every branch is tested. ``machine`` is ``platform.machine()``.
    """
    have = [e for e in supported if e != "none"]
    arm = machine.lower() in ("arm64", "aarch64")
    vnni = sorted(VNNI_FLAGS & flags)
    if requested == "auto":
        if arm:
            order, why = ["qnnpack"], "ARM CPU: qnnpack"
        elif vnni:
            order, why = ["x86", "onednn", "fbgemm"], f"the CPU has {', '.join(vnni)}: x86 (oneDNN int8 kernels)"
        else:
            order, why = ["fbgemm", "x86"], "x86 CPU without VNNI/AMX-INT8: fbgemm"
    else:
        order, why = [requested, *(["qnnpack"] if arm else ["x86", "fbgemm", "onednn", "qnnpack"])], "requested"
        order = list(dict.fromkeys(order))
    notes: list[str] = []
    for engine in order:
        if engine in have:
            return Backend(engine, why if engine == order[0] else f"{why}; fell back to {engine}", tuple(notes))
        notes.append(f"quantisation engine '{engine}' is not in this PyTorch build (it has {have})")
    raise DataError(
        "params.yaml",
        None,
        "no-int8-backend",
        f"no INT8 engine of {order} is available in this PyTorch build (it has {have}); remove int8 variants "
        "from compress.variants",
    )


def machine_backend(requested: str) -> Backend:
    """:func:`choose_backend` for this machine and PyTorch build."""
    import platform

    import torch

    from pipeline.modelling.precision import cpu_model_and_flags

    return choose_backend(
        requested, torch.backends.quantized.supported_engines, cpu_model_and_flags()[1], platform.machine()
    )


@contextmanager
def quiet_ao() -> Iterator[None]:
    """torch 2.13 warns on every quantised-tensor creation that ``torch.ao`` tensors are deprecated (torchao is
    their successor); it is the supported dynamic-quantisation API of this torch, so the warning is noise here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated.*")
        yield


def quantize(model: Any, backend: Backend, per_channel: bool) -> Any:
    """``model`` (fp32, eval) with every ``nn.Linear`` replaced by a dynamically quantised int8 one (a copy)."""
    import torch
    from torch import nn
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    torch.backends.quantized.engine = backend.engine
    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with quiet_ao():
        quantized = quantize_dynamic(model.float().eval(), {nn.Linear: qconfig}, dtype=torch.qint8, inplace=False)
    quantized.int8 = True  # runs in fp32 activations: predict_logits never autocasts it (see is_int8)
    return quantized


def is_int8(model: Any) -> bool:
    """Whether ``model`` came from :func:`quantize` (its linears take fp32 activations, never bf16 autocast)."""
    return bool(getattr(model, "int8", False))


def _quantized_linears(model: Any) -> dict[str, Any]:
    from torch.ao.nn.quantized.dynamic import Linear as QLinear

    return {name: m for name, m in model.named_modules() if isinstance(m, QLinear)}


def int8_tensors(model: Any) -> dict[str, Any]:
    """Plain tensors for safetensors: each quantised linear as int8 values + scales (+ zero points, axis), the rest as is."""
    import torch

    out: dict[str, Any] = {}
    qlinears = _quantized_linears(model)
    for name, mod in qlinears.items():
        w, b = mod.weight(), mod.bias()
        out[f"{name}.weight.int8"] = w.int_repr().contiguous()
        if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            out[f"{name}.weight.scales"] = w.q_per_channel_scales().float().contiguous()
            out[f"{name}.weight.zero_points"] = w.q_per_channel_zero_points().to(torch.int64).contiguous()
        else:
            out[f"{name}.weight.scales"] = torch.tensor([w.q_scale()], dtype=torch.float32)
            out[f"{name}.weight.zero_points"] = torch.tensor([w.q_zero_point()], dtype=torch.int64)
        if b is not None:
            out[f"{name}.bias"] = b.detach().float().contiguous()
    for key, value in model.state_dict().items():
        if isinstance(value, torch.Tensor) and not value.is_quantized and not _inside(key, qlinears):
            out[key] = value.detach().contiguous()
    return out


def _inside(key: str, modules: dict[str, Any]) -> bool:
    return any(key.startswith(f"{name}.") for name in modules)


def load_int8_tensors(model: Any, tensors: dict[str, Any]) -> None:
    """Fill a quantised skeleton (``quantize`` of a model of the same shape) with :func:`int8_tensors`' output."""
    import torch

    qlinears = _quantized_linears(model)
    with quiet_ao():
        for name, mod in qlinears.items():
            mod.set_weight_bias(_qweight(tensors, name), tensors.get(f"{name}.bias"))
    plain = {k: v for k, v in tensors.items() if not _inside(k, qlinears)}
    expected = {k for k in model.state_dict() if not _inside(k, qlinears)}
    if set(plain) != expected:  # load_state_dict cannot be used: quantised linears demand their packed keys
        raise ValueError(
            f"int8 weights do not fit the model: missing {sorted(expected - set(plain))[:5]}, "
            f"unexpected {sorted(set(plain) - expected)[:5]}"
        )
    with torch.no_grad():
        for key, value in plain.items():
            owner, _, attr = key.rpartition(".")
            getattr(model.get_submodule(owner), attr).copy_(value)


def _qweight(tensors: dict[str, Any], name: str) -> Any:
    """The quantised weight of linear ``name``; ``(q - z) * s`` re-quantised with ``s, z`` rounds back to exactly ``q``."""
    import torch

    values = tensors[f"{name}.weight.int8"].float()
    scales, zeros = tensors[f"{name}.weight.scales"], tensors[f"{name}.weight.zero_points"]
    if scales.numel() > 1:  # one scale per output row
        real = (values - zeros[:, None].float()) * scales[:, None]
        return torch.quantize_per_channel(real, scales.double(), zeros, 0, torch.qint8)
    real = (values - float(zeros[0])) * float(scales[0])
    return torch.quantize_per_tensor(real, float(scales[0]), int(zeros[0]), torch.qint8)
