"""Running the validate stage's frames as Great Expectations suites (GX 1.x, ephemeral context).

One suite per frame, one batch per DataFrame; each expectation's result is kept with the rule that
asked for it and up to ``max_offending`` offending records (file and line); Data Docs are built
into the folder the stage commits.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from pipeline.reporting.data_docs import make_offline
from pipeline.tasks.base import Check
from pipeline.validation.frames import Frame


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _offending(frame: Frame, check: Check, result: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    df = frame.df
    if "unexpected_index_list" in result:
        idx = list(result["unexpected_index_list"])[:limit]
    else:  # aggregate expectation: show the most extreme documents of the column
        col = check.expectation.column if hasattr(check.expectation, "column") else None
        if col is None or col not in df or df.empty:
            return []
        idx = list(df[col].sort_values(ascending=False).index[:limit])
    out = []
    for i in idx:
        row = df.loc[i]
        values = {c: _jsonable(row[c]) for c in check.preview if c in df.columns}
        values = {c: (v[:120] + "..." if isinstance(v, str) and len(v) > 120 else v) for c, v in values.items()}
        out.append({"file": row.get("source"), "line": _jsonable(row.get("line")), "values": values})
    return out


RUN_NAME = "adaptbert-validate"  # the Data Docs' run name


def run_suites(frames: list[Frame], docs_dir: Path, max_offending: int) -> list[dict[str, Any]]:
    """Run every frame's suite in one ephemeral GX context; build Data Docs into ``docs_dir``."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    ctx.add_data_docs_site(
        site_name="local",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir.resolve())},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    source = ctx.data_sources.add_pandas("adaptbert")
    suites = []
    for frame in frames:
        batch_def = source.add_dataframe_asset(name=frame.name).add_batch_definition_whole_dataframe("all")
        suite = ctx.suites.add(gx.ExpectationSuite(name=frame.name))
        ids = []
        for check in frame.checks:
            check.expectation.description = html.escape(check.rule)  # GX puts it into Data Docs as HTML
            ids.append(suite.add_expectation(check.expectation).id)
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=frame.name, data=batch_def, suite=suite))
        # a run name for the pages (without one GX shows and files them under "__none__")
        res = vd.run(batch_parameters={"dataframe": frame.df}, result_format="COMPLETE", run_id=RunIdentifier(RUN_NAME))
        results = []
        by_id = {}  # GX does not keep the suite's order
        for er in res.results:
            assert er.expectation_config is not None  # GX sets it on every result of a suite it ran (typed optional)
            by_id[er.expectation_config.id] = (er, er.expectation_config)
        for check, (er, config) in ((c, by_id[i]) for c, i in zip(frame.checks, ids, strict=True)):
            r = er.result or {}
            results.append(
                {
                    "expectation": config.type,
                    "rule": check.rule,
                    "success": bool(er.success),
                    "observed": _jsonable(
                        r.get(
                            "observed_value",
                            {k: r[k] for k in ("unexpected_count", "unexpected_percent", "element_count") if k in r},
                        )
                    ),
                    "expected": _jsonable(
                        {k: v for k, v in config.kwargs.items() if k not in ("batch_id", "column", "description")}
                    ),
                    "column": config.kwargs.get("column"),
                    "exception": (er.exception_info or {}).get("exception_message") if not er.success else None,
                    "offending": [] if er.success else _offending(frame, check, r, max_offending),
                }
            )
        suites.append(
            {
                "suite": frame.name,
                "rows": len(frame.df),
                "success": all(x["success"] for x in results),
                "expectations": results,
            }
        )
    escape_stored_results(ctx.validation_results_store)
    ctx.build_data_docs(site_names=["local"])
    make_offline(docs_dir)  # GX loads its styles and scripts from CDNs: local copies instead
    return suites


def escape_stored_results(store: Any) -> None:
    """HTML-escape every string of the stored validation results before Data Docs render them (and name their data
    asset).

    GX 1.x writes the unexpected values (and observed values) into its pages as raw HTML: a label such as
    ``<img src=x onerror=...>`` in a task file would run in the reader's browser. Our report (built above from the
    results as GX returned them) keeps the values as they are in the data; only the copy the pages are built from is
    escaped (GX does not escape it again, so the page shows the original text).
    """
    for key in store.list_keys():
        result = store.get(key)
        # GX names the data asset from the batch spec, which an in-memory DataFrame's lacks ("Data asset: None")
        spec = result.meta.get("batch_spec")
        if isinstance(spec, dict) and not spec.get("data_asset_name"):
            spec["data_asset_name"] = result.suite_name
        for er in result.results:
            er.result = _escaped(er.result or {})
            if er.exception_info:
                er.exception_info = _escaped(er.exception_info)
        store.set(key, result)


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return html.escape(value)
    if isinstance(value, dict):
        return {k: _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(v) for v in value]
    return value


def summarize(suites: list[dict[str, Any]]) -> str:
    """Readable failure list: suite, rule, observed vs expected, then offending records."""
    failed = [(s["suite"], e) for s in suites for e in s["expectations"] if not e["success"]]
    total = sum(len(s["expectations"]) for s in suites)
    lines = [f"{len(failed)} of {total} expectations failed:"]
    for suite, e in failed:
        col = f"({e['column']})" if e["column"] else ""
        lines.append(f"  [{suite}] {e['rule']}  -- {e['expectation']}{col}")
        lines.append(
            f"      observed: {json.dumps(e['observed'], ensure_ascii=False)[:200]}; expected: {json.dumps(e['expected'], ensure_ascii=False)[:200]}"
        )
        if e.get("exception"):
            lines.append(f"      error: {e['exception'][:200]}")
        for o in e["offending"]:
            where = f"{o['file']}:{o['line']}" if o["line"] is not None else str(o["file"])
            lines.append(f"      {where}  {json.dumps(o['values'], ensure_ascii=False)[:200]}")
    return "\n".join(lines)
