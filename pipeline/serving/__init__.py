"""The served model: batched prediction for every task type."""
