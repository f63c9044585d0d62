"""Tests, unit layer: pure functions and small pieces on hand-made inputs: config, text, masking, metrics, the gate (seconds)."""
