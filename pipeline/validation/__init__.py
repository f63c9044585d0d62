"""Data validation: what is checked (frames of derived columns) and running the checks as GX suites."""
