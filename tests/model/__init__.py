"""Tests, model layer: tiny models trained and scored: heads, losses, pretrain, finetune, search, compression, serving."""
