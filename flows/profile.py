"""``python -m flows.profile <name>``: run, print or apply a profile (``profiles/<name>.yaml``).

    python -m flows.profile biomed                 # print the `dvc exp run -S ...` command (shell-quoted)
    python -m flows.profile biomed --run           # run it: an experiment with the profile's params
    python -m flows.profile biomed --run -- -n b1  # ... with extra `dvc exp run` arguments
    python -m flows.profile biomed --apply         # write the profile into params.yaml (then `dvc repro`)

A profile is a mapping of ``section.key: value`` overrides. A value replaces the key's value
whole (a list or mapping too: ``finetune.tasks: {rct: ...}`` drops the demo tasks' entries), the
same way the Prefect flow's ``profile`` parameter applies it. DVC's ``-S`` takes Hydra override
syntax, in which a mapping merges into the existing one; the command therefore deletes a
mapping key first (``-S ~finetune.tasks``) and adds it back (``-S ++finetune.tasks={...}``).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline.core.config import load_config, set_dotted
from pipeline.core.console import plain
from pipeline.core.errors import ConfigError
from pipeline.core.profiles import profile_overrides

_HYDRA_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (what ``dvc exp run -S`` parses): strings quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):  # Hydra reads 5e-05 as a string: its floats need a decimal point (5.0e-05)
        mantissa, _, exponent = repr(value).partition("e")
        return (mantissa if "." in mantissa else mantissa + ".0") + (f"e{exponent}" if exponent else "")
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str) or not _HYDRA_KEY.match(key):
                raise ConfigError(
                    f"profile mapping key {key!r}: only [A-Za-z0-9_-] keys can be passed to dvc exp run -S"
                )
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"profile value {value!r}: unsupported type {type(value).__name__}")


def set_param_args(overrides: dict[str, Any]) -> list[str]:
    """``-S`` arguments for ``dvc exp run`` that set every override, replacing (not merging) mappings."""
    args: list[str] = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            args += ["-S", f"~{key}"]
        args += ["-S", f"++{key}={hydra_value(value)}"]
    return args


def apply_profile(root: Path, overrides: dict[str, Any]) -> None:
    """Write the overrides into ``root/params.yaml`` for good (DVC's round-trip YAML: comments kept)."""
    from dvc.utils.serialize import modify_yaml

    with modify_yaml(root / "params.yaml") as data:
        for dotted, value in overrides.items():
            set_dotted(data, dotted, value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.profile", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("name", help="profiles/<name>.yaml")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--run", action="store_true", help="run `dvc exp run` with the profile (extra dvc args after --)")
    mode.add_argument("--apply", action="store_true", help="write the profile into params.yaml")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)  # everything after -- goes to dvc exp run as it is
    args = parser.parse_args(argv[:cut])
    dvc_args = argv[cut + 1 :]
    root = Path.cwd()  # the project in the working directory, like the flow's root="."
    try:
        overrides = profile_overrides(root, args.name)
        load_config(root / "params.yaml", overrides)  # a bad key or value fails here, naming it
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    command = ["dvc", "exp", "run", *set_param_args(overrides), *dvc_args]
    if args.apply:
        apply_profile(root, overrides)
        print(f"params.yaml: {len(overrides)} keys set from profiles/{args.name}.yaml; now `dvc repro`")
        return 0
    if args.run:
        return subprocess.run(command, cwd=root, check=False).returncode
    print(shlex.join(command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
