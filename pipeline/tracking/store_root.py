"""A local MLflow store that moves with its project: re-rooted on open when the checkout was copied or moved.

MLflow's sqlite store records absolute locations: the experiment's artifact root, every run's artifact URI, every
logged model's and model version's source, every dataset input's file. A checkout copied with ``cp -a`` (or moved)
therefore read and wrote the *old* folder's ``mlartifacts/``: ``mlflow models serve`` of the copy wrote into the
original, and a removed original left the copy unable to load a model. MLflow has no setting for relative locations,
so when the project's own store is opened and its experiments' artifact root (``<root>/mlartifacts``, as
:func:`pipeline.tracking.runs.connect` creates it) names another folder than this project's, every location under
that old root is rewritten to the same path under this one, in one transaction. The columns are MLflow 3's (its
``dbmodels``): a schema change there shows as a failed test, not as silent damage.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

ARTIFACTS = "mlartifacts"
# (table, column) of every location MLflow 3's sqlite store keeps (tracking and registry dbmodels)
LOCATIONS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
    ("datasets", "dataset_source"),
)


def as_path(location: str) -> Path:
    """``file:///a/b`` or ``/a/b`` -> ``Path('/a/b')``."""
    return Path(unquote(urlparse(location).path)) if location.startswith("file:") else Path(location)


def recorded_roots(con: sqlite3.Connection) -> set[Path]:
    """The project folders the store's experiments were created in (their artifact root is ``<root>/mlartifacts``)."""
    rows = con.execute("SELECT artifact_location FROM experiments WHERE artifact_location IS NOT NULL").fetchall()
    return {as_path(loc).parent for (loc,) in rows if as_path(loc).name == ARTIFACTS}


def reroot_local_store(db: Path, root: Path) -> list[Path]:
    """Point every location in the sqlite store ``db`` that lies under another project folder at the same path under
    ``root`` (done only when ``root/mlartifacts`` exists: a copy of the project brought its artifacts along); the
    old roots rewritten (empty: nothing to do)."""
    new = root.resolve()
    if not db.is_file() or not (new / ARTIFACTS).is_dir():
        return []
    with sqlite3.connect(db) as con:  # one transaction: committed whole or not at all
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return []
        old_roots = sorted(r for r in recorded_roots(con) if r != new)
        for old in old_roots:
            for before, after in ((old.as_uri(), new.as_uri()), (str(old), str(new))):
                for table, column in LOCATIONS:
                    if table in tables:
                        rewrite_prefix(con, table, column, before, after)
    return old_roots


def rewrite_prefix(con: sqlite3.Connection, table: str, column: str, before: str, after: str) -> None:
    """``before`` -> ``after`` wherever ``column`` starts with it as a whole path (``before`` itself, or followed by
    ``/``; a JSON dataset source, whose URI sits inside the text, at ``"uri": "<before>``)."""
    if column == "dataset_source":  # JSON: {"uri": "/abs/path/..."}
        con.execute(
            f"UPDATE {table} SET {column} = replace({column}, ?, ?) WHERE instr({column}, ?) > 0",
            (f'"uri": "{before}/', f'"uri": "{after}/', f'"uri": "{before}/'),
        )
        return
    con.execute(
        f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE {column} = ? OR substr({column}, 1, ?) = ?",
        (after, len(before) + 1, before, len(before) + 1, before + "/"),
    )
