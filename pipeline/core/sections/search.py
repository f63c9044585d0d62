"""params.yaml ``search``: fine-tuning settings chosen on the dev split by the search stage (Optuna)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.core.sections.base import Strict
from pipeline.core.sections.finetune import FinetuneConfig, FinetuneTaskConfig

# what a search may set: the fine-tuning settings that change what is learned (not eval or checkpoint cadence),
# for the whole run and, per task, under finetune.tasks.<name>.
SEARCHABLE = {
    n: FinetuneConfig.model_fields[n].annotation
    for n in ("max_steps", "epochs", "learning_rate", "layer_lr_decay", "weight_decay", "warmup_ratio", "dropout")
    + ("temperature", "max_grad_norm", "adversarial_epsilon")
}
SEARCHABLE_PER_TASK = {n: f.annotation for n, f in FinetuneTaskConfig.model_fields.items() if n == "sampling_weight"}


class SearchRange(Strict):
    """One searched setting: a value in ``[low, high]`` (log-uniform with ``log``; rounded for integer settings)."""

    low: float | int
    high: float | int
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> SearchRange:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0 (got {self.low})")
        return self


class SearchConfig(Strict):
    enabled: bool
    models: list[Literal["adapted", "baseline"]] = Field(min_length=1)  # whose settings are chosen, each on its own
    trials: int = Field(ge=1)  # per model, the first one the settings of params.yaml
    budget_minutes: float | None = Field(default=None, gt=0)  # per model: no round of trials starts after it x models
    pruner: Literal["median", "none"]  # median: stop a trial whose dev score falls below the median of earlier ones
    pruner_warmup_evaluations: int = Field(ge=0)  # evaluations a trial always gets before it can be pruned
    space: dict[str, SearchRange]  # finetune.<key>: its range (keys as under finetune)
    task_space: dict[str, dict[str, SearchRange]] = Field(default_factory=dict)  # <task>: {sampling_weight: range}

    @model_validator(mode="after")
    def _searchable_keys(self) -> SearchConfig:
        for key in self.space:
            if key not in SEARCHABLE:
                raise ValueError(f"space.{key}: not a searchable setting; expected one of {sorted(SEARCHABLE)}")
        for task, ranges in self.task_space.items():
            for key in ranges:
                if key not in SEARCHABLE_PER_TASK:
                    raise ValueError(f"task_space.{task}.{key}: not searchable per task; expected sampling_weight")
        if not self.ranges():
            raise ValueError("space and task_space are both empty: nothing to search")
        for key, r in self.ranges().items():
            self._check_bounds(key, r)
        return self

    def _check_bounds(self, key: str, r: SearchRange) -> None:
        """Both ends of a range must be values its setting accepts (as a trial would set them: integers rounded),
        so a range of dropout 1.5-2.0 or of max_steps 0.4-0.45 is refused here, not by a crashed trial."""
        from typing import Annotated

        from pydantic import TypeAdapter, ValidationError

        name = key.split(".")[-1]
        model = FinetuneTaskConfig if key.startswith("finetune.tasks.") else FinetuneConfig
        field = model.model_fields[name]
        # the field's type with its constraints (ge, le, ...), built at run time: mypy cannot type such a form
        annotated: Any = Annotated[field.annotation, *field.metadata]
        adapter: TypeAdapter[object] = TypeAdapter(annotated)
        where = key.removeprefix("finetune.").replace("tasks.", "task_space.", 1) if ".tasks." in key else key
        where = where if where.startswith("task_space.") else f"space.{name}"
        for end in (r.low, r.high):
            value = round(end) if self.is_integer(key) else end
            try:
                adapter.validate_python(value)
            except ValidationError as err:
                shown = f"{end} (a trial sets {value})" if value != end else f"{end}"
                raise ValueError(
                    f"{where}: {shown} is not a value {key} accepts ({err.errors()[0]['msg'].lower()})"
                ) from None

    def ranges(self) -> dict[str, SearchRange]:
        """Every searched setting by its full key: ``finetune.<key>`` and ``finetune.tasks.<task>.<key>``."""
        out = {f"finetune.{k}": r for k, r in self.space.items()}
        for task, ranges in self.task_space.items():
            out |= {f"finetune.tasks.{task}.{k}": r for k, r in ranges.items()}
        return out

    def is_integer(self, key: str) -> bool:
        """Whether the setting behind a full key is an integer (steps): its values are rounded."""
        name = key.split(".")[-1]
        return SEARCHABLE.get(name, SEARCHABLE_PER_TASK.get(name)) in ("int", int)
