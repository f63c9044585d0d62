"""``python -m flows.profile <name>``: a profile as ``-S key=value`` arguments for ``dvc exp run``."""

from __future__ import annotations

import json
import sys

import flows
from flows.stages import profile_overrides


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m flows.profile <name>   (profiles/<name>.yaml)", file=sys.stderr)
        return 2
    overrides = profile_overrides(flows.PROJECT_ROOT, args[0])
    print(" ".join(f"-S {k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
