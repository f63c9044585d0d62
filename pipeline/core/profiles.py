"""Profiles: ``profiles/<name>.yaml`` holds ``section.key: value`` overrides of ``params.yaml`` for one run (smoke,
biomed, zh, gpu, or a user's own). A profile's runs, registered model and reports carry its name, so that trying a
profile never touches the model you serve.

Read by the flows (a run with ``profile=...``), ``flows.profile`` (``dvc exp run -S ...``) and ``adaptbert models
--profile`` (that profile's registered model).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline.core.config import Config, load_params, read_yaml_file
from pipeline.core.errors import ConfigError
from pipeline.core.sections.tracking import PROFILE_NAME


def profile_overrides(root: Path, profile: str | None, params: Path | None = None) -> dict[str, Any]:
    """The ``{"section.key": value}`` overrides of ``root/profiles/<profile>.yaml`` (none for ``None``), with the
    profile's own experiment and registered-model names (:func:`profile_names`; the profile file may set others).

    ``params``: the base params file the names derive from (default ``root/params.yaml``)."""
    if not profile:
        return {}
    if not re.match(PROFILE_NAME, profile):  # never a path: `../params` would read any YAML file as a profile
        raise ConfigError(
            f"profile '{profile}': a profile is named by letters, digits, '_' and '-' (profiles/<name>.yaml)"
        )
    path = root / "profiles" / f"{profile}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (root / "profiles").glob("*.yaml"))
        raise ConfigError(f"profile '{profile}': no file {path} (profiles: {known})")
    data = read_yaml_file(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of 'section.key: value' overrides")
    return {**profile_names(params or root / "params.yaml", profile), **data}


def profile_names(params: Path, profile: str) -> dict[str, str]:
    """Where a profile's runs go: the profile's name as ``tracking.profile`` (a tag on runs, versions, reports) and its
    own MLflow experiment and registered model, ``<name>-<profile>`` of the ``params`` file's, so that a smoke or
    profile run never adds versions to, or moves the aliases of, the model you serve."""
    base = load_params(params)
    registry = Config.model_fields["registration"].alias or "registration"  # the section's name in params.yaml
    return {
        "tracking.profile": profile,
        "tracking.experiment": f"{base['tracking']['experiment']}-{profile}",
        f"{registry}.model_name": f"{base[registry]['model_name']}-{profile}",
    }
