"""matplotlib as every figure of ours uses it: headless, labels drawn as text, written as PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def use_headless() -> None:
    """matplotlib for files only (the Agg backend, no display), with mathtext off: label names come from the data, and
    a label such as ``$5-10k`` is a dollar sign, not TeX (mathtext raised a ValueError on it after training)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False


def save_figure(fig: Any, path: Path) -> str:
    """Write ``fig`` as PNG, close it, return the file name (for the report's links)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name
