"""Models, masking, MLM loss, the multi-task model, checkpoints, precision."""
