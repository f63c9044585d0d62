"""Tests, architecture layer: the layout's rules: floors, import cycles, computed dvc.yaml deps, the stage table, the docs' commands."""
