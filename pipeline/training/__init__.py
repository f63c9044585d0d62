"""Training: the multi-task model and its Trainer, pretraining's library, fine-tuning's contenders and search."""
