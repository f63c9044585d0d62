"""The one label id that every loss ignores (special tokens, later word pieces, padding, unmasked positions)."""

IGNORE_INDEX = -100  # PyTorch cross_entropy's default ignore_index
