"""Which stage report is read as which type, by its :class:`pipeline.core.paths.Paths` attribute: the run report
and the Prefect views read a typed report through its model, the others as dicts (not typed yet)."""

from __future__ import annotations

from pipeline.core.reports.adapt import AdaptReport
from pipeline.core.reports.base import StageReport
from pipeline.core.reports.compression import CompressionReport
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.finetune import FinetuneReport
from pipeline.core.reports.ingest import IngestReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.reports.promotion import PromotionReport
from pipeline.core.reports.search import SearchReport
from pipeline.core.reports.select import SelectReport
from pipeline.core.reports.tokenize import TokenizeReport

TYPED_REPORTS: dict[str, type[StageReport]] = {
    "ingest_report": IngestReport,
    "tokenize_report": TokenizeReport,
    "adapt_report": AdaptReport,
    "pretrain_report": PretrainReport,
    "finetune_report": FinetuneReport,
    "metrics": EvaluationReport,
    "compression_report": CompressionReport,
    "promotion_report": PromotionReport,
    "select_report": SelectReport,
    "search_report": SearchReport,
}
