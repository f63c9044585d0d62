"""``reports/compression.json``: the compress stage's models, the full one and every variant, each with its test
scores, size and speed as served; the machine and the INT8 engine they were timed on.

The full model is one entry of :meth:`CompressionReport.models` like any variant (what a version of it is, its
scores and its speed, are read the same way), so nothing asks whether a name is ``"full"``. Speeds, the stage's
``seconds`` and the threads are the measured half (``reports/measured/``): every timing field is optional, absent
from a clean checkout. Fields are declared in the order the stage writes them: a report is rewritten byte for byte.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.reports.base import StageReport
from pipeline.core.reports.evaluation import Bootstrap

FULL = "full"  # the fine-tuned model's name among the models (a variant never takes it: compress.variants)
Served = Literal["fp32", "bf16"]  # the precisions a model is timed in


class PrecisionSpeed(StageReport):
    """One precision's timing through the serving code (:mod:`pipeline.serving.speed`), in a fresh process."""

    p50_ms: float  # batch-1 latency
    p95_ms: float
    p50_rounds_ms: list[float] = Field(default_factory=list)  # the p50 of each consecutive round of timed requests
    load_1m: float | None = None  # the busiest 1-minute load average around the timed requests
    cores: int | None = None  # the cores the process could run on
    throughput_rows_per_s: float
    load_s: float

    @property
    def p50_range(self) -> tuple[float, float] | None:
        """The lowest and highest round p50 (ms); None for timings without rounds."""
        rounds = self.p50_rounds_ms
        return (float(min(rounds)), float(max(rounds))) if rounds else None


class Speed(StageReport):
    """A model's speed and memory, measured in one process: each precision it runs in, the process's peak RSS."""

    threads: int
    rss_before_load_mb: float
    fp32: PrecisionSpeed | None = None
    bf16: PrecisionSpeed | None = None  # timed where the CPU has bf16 (int8 variants: never)
    peak_rss_mb: float

    def precisions(self) -> dict[str, PrecisionSpeed]:
        """The precisions measured, fp32 first."""
        return {p: s for p in ("fp32", "bf16") if (s := getattr(self, p)) is not None}

    def fastest_p50_ms(self) -> float:
        """The batch-1 p50 in whichever precision answers fastest (a bf16 model can be slower than fp32)."""
        return min(s.p50_ms for s in self.precisions().values())


class TaskScore(StageReport):
    """The full model's primary test metric on one task."""

    primary: str
    value: float


class VariantTaskScore(TaskScore):
    """A variant's test metrics on one task, its own CI, and the paired bootstrap CI of (variant - full model)."""

    value_ci: list[float]  # [low, high], from the same resamples as the change's
    agreement: float | None  # share of test predictions identical to the full model's; None for real values
    delta: float
    ci_low: float
    ci_high: float
    metrics: dict[str, float]


class Build(StageReport):
    """How a variant was built: the student's teacher layers, the heads kept, and the recovery training if any."""

    teacher_layers: list[int] | None
    heads: dict[int, list[int]] | None  # per layer, the heads kept (a string key in JSON)
    resumed_from: str | None = None  # measured, like the fields below that name seconds
    checkpoint_log: list[str] | None = None
    steps: int | None = None  # the trained variants (distilled, pruned): training/trainer.py's summary
    best_step: int | None = None
    stopped_early: bool | None = None
    best_dev_mean_primary: float | None = None
    planned_epochs: dict[str, float] | None = None
    train_seconds: float | None = None
    train_examples_per_s: float | None = None
    build_seconds: float | None = None


def served_speed(speed: Speed | None, served_in: str) -> PrecisionSpeed | None:
    """The timing in the precision a model is served in; None where not measured."""
    return None if speed is None else speed.precisions().get(served_in)


class FullEntry(StageReport):
    """The fine-tuned model as compress measured it: its primary test scores, size on disk and speed as served."""

    mean_primary: float
    tasks: dict[str, TaskScore]
    size_mb: float
    speed: Speed | None = None  # measured
    served_in: Served

    def served_speed(self) -> PrecisionSpeed | None:
        """The timing in the precision the model is served in; None where not measured."""
        return served_speed(self.speed, self.served_in)


class VariantEntry(StageReport):
    """A compressed variant: scores and CIs against the full model, how it was built, its size and speed as served,
    and whether it is servable. (Its own class, not a FullEntry's: the stage writes its keys in another order.)"""

    tasks: dict[str, VariantTaskScore]
    mean_primary: float
    mean_primary_delta: float
    size_mb: float
    build: Build
    speed: Speed | None = None  # measured
    served_in: Served
    size_ratio: float  # the full model's size over the variant's
    speedup_p50: dict[str, float] | None = None  # measured: vs_full_<precision>, in the same precision
    speedup_vs_fastest_full: float | None = None  # measured: against the full model's fastest precision
    servable: bool
    floor: str  # why it is (not) servable under compress.accuracy_floor

    def served_speed(self) -> PrecisionSpeed | None:
        """The timing in the precision the model is served in; None where not measured."""
        return served_speed(self.speed, self.served_in)


ModelEntry = FullEntry | VariantEntry  # a model compress measured: what a registered version's tags are read from


class Machine(StageReport):
    """The CPU the models were timed on and its bf16/INT8 flags."""

    cpu: str
    flags: list[str]
    threads: int | None = None  # measured


class Int8Backend(StageReport):
    """The INT8 kernels the quantised variants run on, and why."""

    engine: str
    reason: str
    fallbacks: list[str]


class CompressionReport(StageReport):
    """reports/compression.json (``enabled: false`` and no variants where compression is off)."""

    enabled: bool
    machine: Machine | None = None
    serving_precision: Served | None = None
    int8_backend: Int8Backend | None = None  # None: no quantised variant asked for
    bootstrap: Bootstrap | None = None
    full: FullEntry | None = None
    variants: dict[str, VariantEntry]
    seconds: float | None = None  # measured

    def models(self) -> dict[str, ModelEntry]:
        """Every model measured, the full one first: a registered version's entry is ``models()[name]``."""
        return ({FULL: self.full} if self.full is not None else {}) | dict(self.variants)

    def model(self, name: str) -> ModelEntry | None:
        """The entry of ``name`` (``full`` or a variant); None where compress did not measure it."""
        return self.models().get(name)

    def servable(self) -> dict[str, VariantEntry]:
        """The variants within ``compress.accuracy_floor``."""
        return {n: v for n, v in self.variants.items() if v.servable}

    def not_servable(self) -> dict[str, str]:
        """Each variant below the floor, and why."""
        return {n: v.floor for n, v in self.variants.items() if not v.servable}
