"""adaptbert: domain-adaptive BERT pipeline stages (one module per stage)."""

__version__ = "0.1.0"
