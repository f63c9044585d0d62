"""``python -m pipeline plots``: the page of ``dvc plots show``, opening offline.

DVC's page loads Vega, Vega-Lite and vega-embed from a CDN (``dvc_render``'s script tags), so on a machine
without a network it is blank. This runs ``dvc plots show`` with an HTML template (``--html-template``) whose
head holds those libraries inline, bundled by ``vl-convert-python`` from the copies in its wheel: nothing is
fetched and nothing is vendored in this repository. The plots are DVC's own (``plots:`` in ``dvc.yaml``),
rendered by DVC's code unchanged; only where the scripts come from differs. Plain ``dvc plots show`` keeps
working as before (online).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.core.errors import Failure
from pipeline.core.paths import Paths

# The libraries go where DVC's template has its {scripts} placeholder: left out, DVC adds no CDN tag. DVC fills
# {plot_divs} (one vega-embed call per plot, run as the page loads: the inline bundle is defined before them).
TEMPLATE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {refresh_tag}
    <title>DVC Plot (offline)</title>
    <script>{bundle}</script>
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>"""

VEGA_LITE_MAJOR = "5"  # the schema version of DVC's plot templates ($schema .../vega-lite/v5.json)


def vega_lite_version() -> str:
    """The newest Vega-Lite ``VEGA_LITE_MAJOR``.x that vl-convert ships (its default is the newest major)."""
    import vl_convert as vlc

    same_major = [v for v in vlc.get_vegalite_versions() if v.split(".")[0].lstrip("v") == VEGA_LITE_MAJOR]
    return max(same_major, key=lambda v: tuple(int(x) for x in v.lstrip("v").split(".")))


def offline_template() -> str:
    """DVC's page template with Vega, Vega-Lite and vega-embed inline (about 0.9 MB of JavaScript)."""
    import vl_convert as vlc

    # no snippet: the function's default is None, which its type stub leaves out
    bundle = vlc.javascript_bundle(vl_version=vega_lite_version())  # type: ignore[call-arg]
    # a "</script" inside the bundle would end the tag early; "<\/" is the same string to JavaScript
    return TEMPLATE.replace("{bundle}", bundle.replace("</script", "<\\/script"))


def curve_files(dvc_yaml: Path) -> list[str]:
    """The CSV files the top-level ``plots:`` of ``dvc.yaml`` draw (each plot's ``y`` maps a file to a column)."""
    import yaml

    plots = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")).get("plots", [])
    return list(dict.fromkeys(f for plot in plots for spec in plot.values() for f in (spec.get("y") or {})))


def write_offline_plots(paths: Paths, out: Path) -> tuple[Path, list[str]]:
    """``dvc plots show`` into ``out`` through the offline template: the page's path and the curve files it lacks
    (DVC leaves a plot out without a word when its file is missing). No curve file at all (nothing has run yet),
    or a DVC failure, is a :class:`Failure` naming what to do."""
    files = curve_files(paths.root / "dvc.yaml")
    missing = [f for f in files if not (paths.root / f).exists()]
    if files and len(missing) == len(files):
        raise Failure(f"no curves to plot yet ({', '.join(missing)} missing): run dvc repro first")
    template = paths.root / ".dvc" / "tmp" / "adaptbert-offline-plots.html"  # DVC's scratch folder, git-ignored
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text(offline_template(), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "plots", "show", "--html-template", str(template), "-o", str(out)],
        cwd=paths.root,
        capture_output=True,
        text=True,
    )
    page = out / "index.html"
    if proc.returncode != 0 or not page.exists():
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise Failure(f"dvc plots show failed: {said[0]} (the curves come from dvc repro: run it first)")
    return page, missing
