"""The base of every stage report type: strict, frozen, versioned, serialised as the keys its producer set."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

SCHEMA_KEY = "schema"  # the version key in a report's JSON (absent: version 1)


class ReportError(ValueError):
    """A report on disk that its type cannot read: another schema version, a missing or wrong field."""


class StageReport(BaseModel):
    """A stage report: strict, frozen, serialised as the keys its producer set."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    SCHEMA: ClassVar[int] = 1  # raise it on a change an older reader cannot take (a key renamed, removed, retyped)

    def as_json(self) -> dict[str, Any]:
        """The report's JSON object: the fields set, in declaration order, and the schema version after version 1."""
        data = self.model_dump(mode="json", exclude_unset=True)
        return {**data, SCHEMA_KEY: self.SCHEMA} if self.SCHEMA > 1 else data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """The report from its JSON object; :class:`ReportError` for another version or content that does not fit."""
        body = {k: v for k, v in data.items() if k != SCHEMA_KEY}
        version = data.get(SCHEMA_KEY, 1)
        if version != cls.SCHEMA:
            raise ReportError(f"schema version {version}, this adaptbert reads version {cls.SCHEMA}")
        try:
            return cls.model_validate(body)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(report)'}: {e['msg']}" for e in err.errors())
            raise ReportError(f"not a {cls.__name__} ({problems[:300]})") from None
