"""Stage reports as types, beside the config sections: what a stage writes to ``reports/<name>.json`` is one
pydantic model, written and read through it (``pipeline.core.io.write_report`` / ``read_report(path, Model)``),
so a field renamed in the producer fails where it is written and wherever it is read (mypy), not where a test
happens to look.

- :class:`pipeline.core.reports.base.StageReport` is the base: strict (an unknown key is an error), frozen, with a schema version. A report
  keeps the keys its producer set and only those (``exclude_unset``), so a run of one kind (DAPT, ELECTRA, no
  adaptation) writes the keys it always wrote, byte for byte;
- ``schema``: version 1 is the layout from before the field existed and is written as no key at all; a change a
  reader cannot take raises ``SCHEMA`` and writes it. A file of another version, or one that does not parse, is
  an input to re-make: the error names the stage that writes it (:func:`pipeline.core.io.read_report`).

One module per stage report (``pretrain.py``, ...); the reports not typed yet are read as dicts.
"""
