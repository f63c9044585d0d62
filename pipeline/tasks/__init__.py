"""Task types: heads, losses, decoding, metrics, encoding."""
