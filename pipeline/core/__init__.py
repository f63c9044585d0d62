"""Configuration, paths, atomic outputs and errors."""
