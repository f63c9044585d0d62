"""Tests, data layer: the data stages on small files: ingest, bad input, GX validation, tokenize, real data (skips if absent)."""
