"""Great Expectations Data Docs that open offline: the stylesheets and scripts GX loads from CDNs replaced by local
copies, and an index page that lists every page without JavaScript.

GX 1.x writes each page with ``<link>``/``<script>`` tags pointing at bootstrapcdn, cdnjs, unpkg and jsDelivr, and
fills its index tables from JavaScript (bootstrap-table): offline, the pages are unstyled and the index is empty. GX
has no setting for local assets, so after ``build_data_docs`` :func:`make_offline` rewrites the pages. Bootstrap 4
(CSS and its JS bundle, which holds popper) and jQuery come from the ``xstatic-bootstrap`` and ``xstatic-jquery``
packages, installed with adaptbert: nothing is fetched at run time; font-awesome's status icons become characters
(``icons.css``). What has no local copy (bootstrap-table, datepicker, the dark theme, vega) is dropped: the suite and
validation pages are rendered server-side and read the same without it.
"""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

VENDOR = Path("static") / "vendor"  # under the Data Docs folder
# GX marks each expectation with a font-awesome icon; without the icon font, these characters stand in for them
ICONS_CSS = """.fas{font-style:normal;font-weight:700}
.fa-check-circle::before{content:"\\2714"}.fa-times::before{content:"\\2718"}
.fa-exclamation-triangle::before{content:"\\26A0"}.fa-question-circle::before{content:"?"}.fa-comment::before{content:"\\2026"}
"""
REMOTE_IMAGE = re.compile(r"""(<img\b[^>]*?\bsrc=)["'](?:https?:)?//[^"']*?/([\w.-]+?)(?:\?[^"']*)?["']""", re.I)
REMOTE_TAG = re.compile(
    r"""<(link|script)\b[^>]*?(?:href|src)=["'](?:https?:)?//[^"']*["'][^>]*>(?:\s*</script>)?""", re.I
)


def vendored_assets() -> dict[str, Path]:
    """The local copies: file name under ``static/vendor/`` -> where the xstatic packages installed it."""
    import xstatic.pkg.bootstrap as bootstrap
    import xstatic.pkg.jquery as jquery

    return {
        "bootstrap.min.css": Path(bootstrap.BASE_DIR) / "css" / "bootstrap.min.css",
        "bootstrap.bundle.min.js": Path(bootstrap.BASE_DIR) / "js" / "bootstrap.bundle.min.js",
        "jquery.min.js": Path(jquery.BASE_DIR) / "jquery.min.js",
    }


def local_tag(tag: str, prefix: str) -> str:
    """The replacement of one remote ``<link>``/``<script>`` tag: the local copy, or nothing."""
    url = tag.lower()
    if "bootstrap.min.css" in url and "bootstrap-table" not in url:
        return f'<link rel="stylesheet" href="{prefix}{VENDOR.as_posix()}/bootstrap.min.css">'
    if "jquery" in url and "min.js" in url:
        return f'<script src="{prefix}{VENDOR.as_posix()}/jquery.min.js"></script>'
    if "bootstrap.min.js" in url and "bootstrap-table" not in url:  # the bundle: popper included
        return f'<script src="{prefix}{VENDOR.as_posix()}/bootstrap.bundle.min.js"></script>'
    if "font-awesome" in url:
        return f'<link rel="stylesheet" href="{prefix}{VENDOR.as_posix()}/icons.css">'
    return ""


def offline_page(text: str, depth: int, images: set[str]) -> str:
    """A page with every remote stylesheet, script and image replaced (``depth``: folders below the Data Docs root;
    ``images``: the files GX ships in ``static/images``, such as its logo, which the pages load from S3)."""
    prefix = "../" * depth

    def image(m: re.Match[str]) -> str:
        name = m.group(2) if m.group(2) in images else "favicon.ico"  # a local stand-in: never a request
        return f'{m.group(1)}"{prefix}static/images/{name}"'

    return REMOTE_IMAGE.sub(image, REMOTE_TAG.sub(lambda m: local_tag(m.group(0), prefix), text))


def make_offline(docs: Path) -> int:
    """Rewrite every page of the Data Docs under ``docs`` to load nothing from the network and write the index
    page from the files on disk; returns the number of pages."""
    vendor = docs / VENDOR
    vendor.mkdir(parents=True, exist_ok=True)
    for name, source in vendored_assets().items():
        shutil.copyfile(source, vendor / name)
    (vendor / "icons.css").write_text(ICONS_CSS, encoding="utf-8")
    images = {p.name for p in (docs / "static" / "images").glob("*")}
    pages = sorted(p for p in docs.rglob("*.html") if p.name != "index.html" or p.parent != docs)
    for page in pages:
        depth = len(page.relative_to(docs).parts) - 1
        page.write_text(offline_page(page.read_text(encoding="utf-8"), depth, images), encoding="utf-8")
    (docs / "index.html").write_text(index_page(docs, pages), encoding="utf-8")
    return len(pages) + 1


def index_page(docs: Path, pages: list[Path]) -> str:
    """A plain index of the expectation suites and validation results (GX's own fills its tables from scripts)."""

    def items(kind: str) -> str:
        found = [p.relative_to(docs).as_posix() for p in pages if p.relative_to(docs).parts[0] == kind]
        return "".join(f'<li><a href="{html.escape(p)}">{html.escape(label(p))}</a></li>' for p in found)

    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Data Docs</title>'
        f'<link rel="stylesheet" href="{VENDOR.as_posix()}/bootstrap.min.css"></head>'
        '<body class="container py-4"><h1>Data Docs</h1>'
        "<p>What the validate stage checked (Great Expectations suites) and what it found, one page each. "
        "reports/validation.json holds the same results with the offending records.</p>"
        f"<h2>Validation results</h2><ul>{items('validations')}</ul>"
        f"<h2>Expectation suites</h2><ul>{items('expectations')}</ul></body></html>\n"
    )


def label(relative: str) -> str:
    """``corpus.summary (2026-12-04 17:06:51)`` from a page path."""
    parts = relative.removesuffix(".html").split("/")
    if parts[0] == "validations":  # validations/<suite path...>/<run name>/<run time>/<batch id>.html
        suite = ".".join(p for p in parts[1:-3])
        stamp = parts[-2]
        when = (
            f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}"
            if len(stamp) > 14
            else stamp
        )
        return f"{suite} ({when})"
    return ".".join(parts[1:])
