"""Numeric precision of every stage that runs the model: ``precision: auto | fp32 | bf16``.

``auto`` picks bf16 autocast where the hardware runs bf16 matrix multiplications fast (a CUDA
device with bf16; a CPU with AMX-BF16 or AVX512-BF16 on x86, or the BF16 extension on Arm) and
fp32 elsewhere. The choice is a pure function of what was detected (:func:`choose_precision`),
so it is tested on sample flag sets; :func:`resolve_precision` detects and chooses. Under bf16
only the autocast region runs in bf16: master weights and optimiser state stay fp32, and the
stages compute their losses in fp32.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.core.errors import ConfigError

PrecisionName = Literal["fp32", "bf16"]
EAGER_CPU_DROPOUT = "adaptbert_eager"  # eager attention with NumPy dropout masks (pipeline.modelling.dropout)

# CPU flags (Linux /proc/cpuinfo names) that mean bf16 matmuls run in hardware, not emulated.
FAST_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # x86: Sapphire Rapids+ (AMX), Cooper Lake / Zen 4+ (AVX512-BF16)
FAST_BF16_ARM_FEATURES = ("bf16",)  # Arm: Neoverse V1/N2+, Graviton 3+


@dataclass(frozen=True)
class Hardware:
    """What the precision choice depends on."""

    device: Literal["cuda", "cpu"]
    name: str  # GPU name or CPU model
    cuda_bf16: bool = False  # the CUDA device supports bf16
    cpu_flags: frozenset[str] = frozenset()

    def describe(self) -> str:
        """``GPU name`` or ``CPU model [bf16 flags]`` for reports and benchmarks."""
        if self.device == "cuda":
            return f"{self.name} (CUDA, bf16 {'yes' if self.cuda_bf16 else 'no'})"
        fast = sorted(
            self.cpu_flags & {*FAST_BF16_CPU_FLAGS, "amx_int8", "avx512_vnni", "amx_tile", *FAST_BF16_ARM_FEATURES}
        )
        return f"{self.name} (CPU flags: {', '.join(fast) if fast else 'no bf16/AMX/VNNI'})"


@dataclass(frozen=True)
class Precision:
    """The precision a stage runs in, on which device, and why."""

    name: PrecisionName
    device: Literal["cuda", "cpu"]
    reason: str

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    @property
    def training_attention(self) -> str:
        """The attention kernel to train with: on a CPU transformers' eager attention (batched matmuls and a
        softmax) with dropout masks from NumPy (:data:`pipeline.modelling.dropout.EAGER_CPU_DROPOUT`), on a GPU
        ``sdpa``. PyTorch's CPU flash-attention backward is slow in bf16 (39% of a MiniLM pretraining step on a
        2-core AMX Xeon; eager made the step 1.66x faster), and its dropout masks are drawn one Mersenne-Twister
        number at a time: with them, fine-tuning steps ran 1.34x faster in bf16 and 1.09x in fp32 than eager with
        PyTorch's dropout; fp32 without dropout, the kernels are within 1-5%. Inference keeps SDPA everywhere
        (bf16 scoring 1.3x faster than eager), and on a GPU flash attention is the fast path (docs/speed.md)."""
        return EAGER_CPU_DROPOUT if self.device == "cpu" else "sdpa"

    def bf16_weights(self, gradient_accumulation_steps: int) -> bool:
        """Whether a training loop keeps the model itself in bf16, with fp32 master weights in the optimiser
        (:mod:`pipeline.training.master_weights`), instead of autocast over fp32 weights: where it trains in bf16 on
        a CPU and each optimiser step is one micro-batch (several would add their gradients up in bf16). On a 2-core
        AMX Xeon a MiniLM pretraining step ran 1.1-1.2x faster than under autocast (docs/speed.md); GPUs keep autocast.
        """
        return self.bf16 and self.device == "cpu" and gradient_accumulation_steps == 1

    def autocast(self) -> Any:
        """The autocast context for inference and for losses computed outside the Trainer."""
        import torch

        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=torch.bfloat16)

    def as_report(self) -> dict[str, str]:
        return {"precision": self.name, "precision_reason": self.reason}


def choose_precision(requested: str, hw: Hardware, key: str = "precision") -> Precision:
    """The precision for ``requested`` on ``hw`` (pure). ``bf16`` on hardware without it is a :class:`ConfigError`."""
    if hw.device == "cuda":
        fast, why = hw.cuda_bf16, f"{hw.name} {'supports' if hw.cuda_bf16 else 'does not support'} bf16"
    else:
        found = sorted(hw.cpu_flags & {*FAST_BF16_CPU_FLAGS, *FAST_BF16_ARM_FEATURES})
        fast = bool(found)
        why = (
            f"CPU {hw.name} has {', '.join(found)}"
            if found
            else f"CPU {hw.name} has no AMX-BF16/AVX512-BF16 (bf16 would be emulated, slower than fp32)"
        )
    if requested == "fp32":
        return Precision("fp32", hw.device, f"{key}: fp32 (asked)")
    if requested == "bf16":
        if not fast:
            raise ConfigError(f"{key}: bf16 needs hardware bf16, but {why}; use {key}: auto or fp32")
        return Precision("bf16", hw.device, f"{key}: bf16 (asked; {why})")
    if requested == "auto":
        return Precision("bf16" if fast else "fp32", hw.device, f"{key}: auto -> {'bf16' if fast else 'fp32'} ({why})")
    raise ConfigError(f"{key}: unknown precision {requested!r}; expected auto, fp32 or bf16")


def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    """CPU model name and feature flags from ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``).

    Where there is no /proc/cpuinfo (macOS, Windows), torch's own CPU capability checks stand in.
    """
    info = Path("/proc/cpuinfo")
    if info.exists():
        fields: dict[str, str] = {}
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())  # the first CPU's lines: all cores are alike
        model = fields.get("model name") or fields.get("hardware") or platform.machine() or "unknown CPU"
        return model, frozenset((fields.get("flags") or fields.get("features") or "").split())
    model = platform.processor() or platform.machine() or "unknown CPU"
    import torch

    torch_flags = {"avx512_bf16": torch.cpu._is_avx512_bf16_supported(), "amx_bf16": torch.cpu._is_amx_tile_supported()}
    return model, frozenset(k for k, v in torch_flags.items() if v)


def detect_hardware() -> Hardware:
    """The device stages train on (CUDA when visible, else the CPU) and its bf16 capability."""
    import torch

    if torch.cuda.is_available():
        return Hardware("cuda", torch.cuda.get_device_name(0), cuda_bf16=bool(torch.cuda.is_bf16_supported()))
    model, flags = cpu_model_and_flags()
    return Hardware("cpu", model, cpu_flags=flags)


@contextlib.contextmanager
def attention_kernel(model: Any, implementation: str) -> Iterator[None]:
    """Inside the block every transformers model in ``model`` runs ``implementation`` attention (``eager`` or
    ``sdpa``); after it, the one it had. Saved checkpoints never record it: a later load picks its own."""
    models = [m for m in model.modules() if hasattr(m, "set_attn_implementation")]
    before = [m.config._attn_implementation for m in models]
    for m in models:
        m.set_attn_implementation(implementation)
    try:
        yield
    finally:
        for m, previous in zip(models, before, strict=True):
            m.set_attn_implementation(previous)


def resolve_precision(requested: str, key: str = "precision") -> Precision:
    """Detect the hardware and choose (see :func:`choose_precision`)."""
    return choose_precision(requested, detect_hardware(), key)
