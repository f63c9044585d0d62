"""Pair classification: one label per pair of texts (entailment, relation, paraphrase).

Segment A and B reach the encoder through ``token_type_ids``; everything else is sequence classification.
"""

from __future__ import annotations

from typing import ClassVar

from pipeline.tasks.sequence_classification import SequenceClassification


class PairClassification(SequenceClassification):
    name = "pair_classification"
    fields: ClassVar[dict[str, str]] = {"text": "text", "text_pair": "text_pair", "label": "label"}
    columns = ("text", "text_pair", "label")
    request_fields = ("text", "text_pair")
    pair_field = "text_pair"
