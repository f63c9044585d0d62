"""Seals: what a stage promises about the outputs it wrote, checked by every stage that reads them.

A stage's outputs are written through :class:`pipeline.core.io.Transaction`, which seals them as it commits: a
folder output gets ``.sealed.json`` (the SHA-256 of every file in it), a JSON output (a report, a stamp) the
SHA-256 of its own content under the key ``_seal``. Before a stage runs from the CLI, :func:`check_inputs` checks
the seal of every input its record declares (``Stage.inputs``, dvc.yaml's ``deps``): a file cut short, emptied,
overwritten with garbage or with a valid file of the wrong shape is ``[corrupt-output]`` naming the file and the stage
that rewrites it (exit 3), before the stage reads anything or touches its own outputs. Readers keep their own checks
(manifests, checkpoints, model files) for what a seal cannot say and for callers that skip the CLI.

The seals travel with the outputs: inside the folder that DVC caches, inside the report that git versions, so a
``dvc checkout`` or ``dvc exp apply`` restores outputs and seals together. Cost: one SHA-256 pass over the inputs
per stage (~1 GB/s on these CPUs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.io import OLDER, SEAL_FILE, check_digest, check_json_seal, damaged_input, missing_input

if TYPE_CHECKING:
    from pipeline.core.paths import Paths
    from pipeline.core.stages import Stage


def _seal_of(folder: Path) -> dict[str, str]:
    seal = folder / SEAL_FILE
    if not seal.is_file():
        raise damaged_input(folder, "corrupt-output", f"has no {SEAL_FILE}: {OLDER}")
    try:
        files = json.loads(seal.read_text(encoding="utf-8"))["sha256"]
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise damaged_input(seal, "corrupt-output", f"not a complete seal ({type(err).__name__})") from None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise damaged_input(seal, "corrupt-output", "not a complete seal (no file -> SHA-256 table)")
    return files


def check_folder_seal(folder: Path, part: Path | None = None) -> None:
    """Every file the seal of ``folder`` lists (under ``part``, a sub-folder, if given) is there with the content
    its stage wrote; an entry outside the folder is refused (a seal cannot point a reader elsewhere)."""
    seal = folder / SEAL_FILE
    for relative, sha256 in _seal_of(folder).items():
        rel = Path(relative)
        if rel.is_absolute() or ".." in rel.parts:
            raise damaged_input(seal, "corrupt-output", f"entry '{relative}' lies outside {folder}")
        file = folder / rel
        if part is not None and part != file and part not in file.parents:
            continue
        if not file.is_file():
            raise missing_input(file, f"listed in {seal} but missing")
        check_digest(file, sha256, seal, rule="corrupt-output")


def check_output(output: Path, part: Path) -> None:
    """Check the seal of the output ``output`` (a folder or a JSON file) as far as ``part`` (it, or a path inside it)
    is concerned."""
    if output.is_dir():
        check_folder_seal(output, None if part == output else part)
        return
    try:
        data = json.loads(output.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise damaged_input(output, "corrupt-output", f"not complete JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise damaged_input(output, "corrupt-output", f"expected a JSON object, found {type(data).__name__}")
    check_json_seal(output, data)


def check_inputs(stage: Stage, paths: Paths) -> None:
    """Check the seal of every input ``stage`` declares that exists (a missing one is the stage's own error to give,
    naming the stage that writes it)."""
    from pipeline.core.stages import output_holding

    for name in stage.inputs:
        part = getattr(paths, name)
        output = output_holding(part, paths)
        if output is not None and output.exists() and part.exists():
            check_output(output, part)
