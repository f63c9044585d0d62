"""Compressed variants of the multi-task model: INT8 quantisation, distillation, attention-head pruning."""
