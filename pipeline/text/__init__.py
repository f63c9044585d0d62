"""Reading sources, normalising text, the demo domain."""
