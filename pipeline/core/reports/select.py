"""``reports/select.json``: the select stage's corpus size and, where nearest-neighbour selection ran (kNN-TAPT for
DAPT, or the tournament's ``nearest+tapt`` arm), what it chose: blocks and tokens per task, how near they are, and
the embedding cache's use.

Timings (``seconds``, ``blocks_per_s``) are its measured half (``reports/measured/``). Fields are declared in the order
the stage writes them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from pipeline.core.reports.base import StageReport


class TaskSelection(StageReport):
    """One task's queries (its train inputs) and the blocks their nearest neighbours hold."""

    train_inputs: int
    blocks: int
    tokens: int
    shared_blocks: int  # blocks another task's queries chose too
    mean_top1_cosine: float | None  # None: no finite score
    mean_kth_cosine: float | None  # None where the corpus has fewer than k blocks


class CacheUse(StageReport):
    """The embedding cache (``data/embeddings/``): files read, computed, and removed as stale."""

    hits: int
    embedded: int
    removed: int


class SelectReport(StageReport):
    """reports/select.json (``mode: all``: the corpus size only)."""

    # "for" is a Python keyword: the field is ``used_for``, written and read as "for"
    model_config = StageReport.model_config | ConfigDict(serialize_by_alias=True, validate_by_name=True)

    mode: Literal["all", "nearest"]
    corpus_blocks: int
    corpus_tokens: int
    used_for: str | None = Field(default=None, alias="for")  # the setting that asked for it (DAPT or the tournament)
    k: int | None = None
    embedder: str | None = None
    precision: str | None = None
    precision_reason: str | None = None
    train_inputs: int | None = None
    selected_blocks: int | None = None
    selected_tokens: int | None = None
    selected_token_share: float | None = None
    tasks: dict[str, TaskSelection] | None = None
    mean_random_cosine: float | None = None  # a query and an unselected block, on average
    cache: CacheUse | None = None
    seconds: float | None = None  # measured
    blocks_per_s: int | None = None  # measured
