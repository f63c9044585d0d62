"""What every params section is built from: the strict base model, the seed type."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

SPLITS = ("train", "validation", "test")


class Strict(BaseModel):
    """Base of every config section: frozen, no unknown keys, no silent type coercion."""

    # allow_inf_nan=False: .inf / .nan are never a meaningful rate, size or threshold
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any) -> Any:
        """Integers must fit in 64 bits (PyArrow, NumPy and PyTorch take nothing larger)."""
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise ValueError(f"integer {value} is outside the 64-bit range")
        return value


Seed = Annotated[int, Field(ge=0, lt=2**32)]  # NumPy's and PyTorch's seed range
