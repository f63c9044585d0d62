"""The model registry: the alias moves around the promotion gate (:mod:`pipeline.tracking.gate`), under the registry
lock (:mod:`pipeline.tracking.registry_lock`).

A registered version carries what a person filters on as tags: per task its primary test metric and the trivial
baseline's (``primary.<task>.<metric>``, ``trivial.<task>.<metric>``), the mean, the variant, size and latency,
lineage; so the gate and ``adaptbert models list`` read the registry alone. Every other test metric is in the
register run's ``lineage.json`` (``test_metrics``), which ``compare`` reads. ``champion`` and ``challenger`` are
MLflow aliases (stages are deprecated); an alias has no history, so every move also tags the version it lands on
(``promoted_at``, ``previous_champion``) and ``rollback`` follows ``previous_champion`` back.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.core.errors import RegistryError
from pipeline.core.reports.evaluation import VersionScores
from pipeline.tracking.gate import Rules, Verdict, should_promote
from pipeline.tracking.registry_lock import promotion_lock

CHAMPION, CHALLENGER = "champion", "challenger"


# ----------------------------------------------------------------------------- metrics <-> version tags


def version_tags_from_metrics(scores: VersionScores) -> dict[str, str]:
    """Tags of a new version from its test scores: per task the primary metric and the trivial baseline's
    (``primary.role.macro_f1``, ``trivial.role.macro_f1``) and the mean primary."""
    tags: dict[str, str] = {}
    for task, t in scores.tasks.items():
        key = f"{task}.{t.primary}"
        tags[f"primary.{key}"] = repr(t.score)
        tags[f"trivial.{key}"] = repr(t.trivial_score)
    tags["mean_primary"] = repr(float(scores.mean_primary))
    return tags


def primary_scores(tags: Mapping[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """``({task.metric: value}, {task.metric: trivial value})`` of the primary metrics in a version's tags.

    Also reads the tags of versions registered before the trimmed set: ``primary.<task>`` naming the metric, its value
    in ``metric.<task>.<metric>`` and the trivial one in ``trivial.<task>`` (a task name has no dot)."""
    scores, trivial = {}, {}
    for key, text in tags.items():
        if not key.startswith("primary."):
            continue
        rest = key.removeprefix("primary.")
        if "." in rest:  # primary.<task>.<metric> = value
            scores[rest] = float(text)
            if f"trivial.{rest}" in tags:
                trivial[rest] = float(tags[f"trivial.{rest}"])
            continue
        task, metric = rest, text  # the older form
        if (value := tags.get(f"metric.{task}.{metric}")) is not None:
            scores[f"{task}.{metric}"] = float(value)
        if f"trivial.{task}" in tags:
            trivial[f"{task}.{metric}"] = float(tags[f"trivial.{task}"])
    return scores, trivial


def all_metrics(tags: Mapping[str, str], lineage: Mapping[str, Any] | None) -> dict[str, float]:
    """Every ``task.metric`` test value of a version: its variant's ``test_metrics`` in the register run's
    lineage.json (``lineage``, None when it is not there), or the ``metric.*`` tags of an older version."""
    recorded = (lineage or {}).get("test_metrics", {}).get(tags.get("variant", "full"))
    if recorded is not None:
        return {k: float(v) for k, v in recorded.items()}
    older = {k.removeprefix("metric."): float(v) for k, v in tags.items() if k.startswith("metric.")}
    return older or primary_scores(tags)[0]


# ----------------------------------------------------------------------------- registry operations


def get_version(client: Any, name: str, ref: str | int) -> Any | None:
    """A version by number or alias (``champion``, ``challenger``); ``None`` for an alias that is unset."""
    from mlflow.exceptions import MlflowException

    ref = str(ref)
    try:
        if ref.isdigit():
            return client.get_model_version(name, ref)
        return client.get_model_version_by_alias(name, ref)
    except MlflowException as err:
        if ref.isdigit():
            raise RegistryError(f"model '{name}' has no version {ref}") from None
        if (
            "not found" in str(err).lower()
            or "does not exist" in str(err).lower()
            or getattr(err, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"
        ):
            return None
        raise


@dataclass
class Decision:
    """What a promotion attempt did: the verdict, whether ``champion`` moved, from which version."""

    version: str
    verdict: Verdict
    promoted: bool
    forced: bool
    previous_champion: str | None
    champion_after: str | None


def promote(client: Any, name: str, version: str, rules: Rules, force: bool = False, attempts: int = 5) -> Decision:
    """Run the gate for ``version`` against the current champion and move ``champion`` if it passes.

    Guarded against a concurrent promotion twice over: the registry lock (:func:`promotion_lock`) serialises
    promotions across machines, and right before the move the champion is read again; if it changed meanwhile, the
    gate runs again against the new champion. A failed gate (without ``force``) moves nothing.
    """
    challenger = get_version(client, name, version)
    if challenger is None:  # an alias that is not set
        raise RegistryError(f"model '{name}' has no version with alias '{version}'")
    number = str(challenger.version)  # sqlite stores give ints, servers strings
    scores, trivial = primary_scores(challenger.tags)
    with promotion_lock(client, name):
        for _ in range(attempts):
            champ = get_version(client, name, CHAMPION)
            before = str(champ.version) if champ else None
            if before == number:
                verdict = Verdict(False, f"version {number} is already the champion", [], None, None)
                return Decision(number, verdict, False, False, None, before)  # a no-op: nothing was forced
            verdict = gate_against(champ, client, name, scores, rules, trivial)
            if not (verdict.promote or force):
                return Decision(number, verdict, False, False, before, before)
            again = get_version(client, name, CHAMPION)
            if (str(again.version) if again else None) != before:
                continue  # someone promoted meanwhile: gate again against the new champion
            client.set_registered_model_alias(name, CHAMPION, number)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            for key, value in {
                "promoted_at": stamp,
                "previous_champion": before or "",
                "promotion.forced": str(force and not verdict.promote).lower(),
            }.items():
                client.set_model_version_tag(name, number, key, value)
            return Decision(number, verdict, True, force and not verdict.promote, before, number)
    raise RegistryError(f"the champion of '{name}' kept changing during {attempts} promotion attempts; try again")


def gate_against(
    champ: Any, client: Any, name: str, scores: Mapping[str, float], rules: Rules, trivial: Mapping[str, float]
) -> Verdict:
    """The gate against the champion ``champ`` (a model version, or None); a champion that cannot be served is no
    bar to clear: the challenger is gated as if there were none (its floors still hold), and the reason says why.
    Such a champion is flagged where the registry shows it (tag ``serving.problem``; ``adaptbert serve`` refuses it)
    whether or not the challenger replaces it."""
    if champ is None:
        return should_promote(scores, None, rules, trivial)
    problem = serving_problem(client, name, str(champ.version))
    if problem is None:
        return should_promote(scores, primary_scores(champ.tags)[0], rules, trivial)
    client.set_model_version_tag(name, str(champ.version), "serving.problem", problem)
    verdict = should_promote(scores, None, rules, trivial)
    why = f"the champion (version {champ.version}) cannot be served: {problem}; gated as if there were none"
    return replace(verdict, reason=f"{why}: {verdict.reason}")


def serving_problem(client: Any, name: str, version: str) -> str | None:
    """Why ``version`` cannot be served (its model files are gone from the artifact store: serving would fail with
    MLflow's "No such artifact"), or None. A store that cannot be reached raises (that is no verdict on the model)."""
    import mlflow

    from pipeline.core.errors import redact_secrets

    uri = client.get_model_version_download_uri(name, version)
    listed = mlflow.artifacts.list_artifacts(artifact_uri=uri, tracking_uri=client.tracking_uri)  # this client's store
    files = {Path(a.path).name for a in listed}
    return None if "MLmodel" in files else f"its model files are gone (no MLmodel at {redact_secrets(uri)})"


def record_verdict(client: Any, name: str, decision: Decision) -> None:
    """Keep the gate's verdict on the version (the registry UI shows it)."""
    client.set_model_version_tag(
        name, decision.version, "promotion.verdict", "pass" if decision.verdict.promote else "fail"
    )
    client.set_model_version_tag(name, decision.version, "promotion.reason", decision.verdict.reason[:5000])


def rollback(client: Any, name: str) -> tuple[str, str]:
    """Point ``champion`` back at the current champion's ``previous_champion``; ``(from, to)``."""
    with promotion_lock(client, name):
        champ = get_version(client, name, CHAMPION)
        if champ is None:
            raise RegistryError(f"model '{name}' has no champion to roll back")
        previous = champ.tags.get("previous_champion", "")
        if not previous:
            raise RegistryError(
                f"champion version {champ.version} of '{name}' has no previous_champion: nothing to roll back to"
            )
        get_version(client, name, previous)  # exists (raises otherwise)
        client.set_registered_model_alias(name, CHAMPION, previous)
        client.set_model_version_tag(name, previous, "rolled_back_from", str(champ.version))
        client.set_model_version_tag(name, previous, "promoted_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return str(champ.version), previous


def list_versions(client: Any, name: str) -> list[dict[str, Any]]:
    """Every version, newest first, as :func:`version_row`."""
    versions = client.search_model_versions(f"name = '{name}'")
    if not versions:
        raise RegistryError(f"no registered model '{name}' (or it has no versions yet): run the register stage first")
    aliases: dict[str, list[str]] = {}
    for alias, number in client.get_registered_model(name).aliases.items():  # search results carry no aliases
        aliases.setdefault(str(number), []).append(alias)
    return [
        version_row(mv, aliases.get(str(mv.version), []))
        for mv in sorted(versions, key=lambda v: int(v.version), reverse=True)
    ]


def version_row(mv: Any, aliases: list[str]) -> dict[str, Any]:
    """What a version is (variant, of which version), how good (mean primary, its change against that full model,
    each task's primary metric), what it costs (MB, batch-1 p50 ms as served), when and from what: numbers as numbers."""
    tags = mv.tags
    return {
        "version": str(mv.version),
        "aliases": sorted(aliases),
        "variant": tags.get("variant", "full"),
        "parent_version": tags.get("parent_version"),
        "mean_primary": tag_number(tags.get("mean_primary")),
        "delta_vs_full": tag_number(tags.get("compression.mean_primary_delta")),
        "size_mb": tag_number(tags.get("compression.size_mb")),
        "p50_ms": tag_number(tags.get("compression.p50_ms")),  # batch-1 latency as served
        "primary": primary_scores(tags)[0],
        "profile": tags.get("profile"),
        "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(mv.creation_timestamp / 1000)),
        "git_commit": tags.get("git.commit", "")[:10],
        "description": mv.description or "",
    }


def tag_number(tag: str | None) -> float | None:
    """A numeric tag as a number (MLflow stores every tag as a string); None when absent or not a number."""
    try:
        return float(tag) if tag is not None else None
    except ValueError:
        return None


def read_lineage(client: Any, mv: Any) -> dict[str, Any] | None:
    """The register run's ``lineage.json`` of version ``mv`` (its ``lineage`` tag); None when it has none or the file
    is gone from the artifact store (``compare`` then shows the primary metrics of the tags)."""
    from mlflow.exceptions import MlflowException

    uri = mv.tags.get("lineage")
    if not uri:
        return None
    try:
        record = json.loads(artifact_text(client, uri))
    except (MlflowException, OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_model_card(client: Any, name: str, ref: str) -> str:
    """Version ``ref``'s model card (the register run's ``model_cards/<variant>.md``, named by its ``model_card``)."""
    from mlflow.exceptions import MlflowException

    mv = get_version(client, name, ref)
    if mv is None:
        raise RegistryError(f"model '{name}' has no version with alias '{ref}'")
    uri = mv.tags.get("model_card")
    if not uri:
        raise RegistryError(
            f"version {mv.version} of '{name}' has no model card (registered before cards were written)"
        )
    try:
        return artifact_text(client, uri)
    except (MlflowException, OSError) as err:
        raise RegistryError(
            f"the model card of version {mv.version} of '{name}' ({uri}) cannot be read: {err}"
        ) from None


def artifact_text(client: Any, uri: str) -> str:
    """The text of run artifact ``uri`` (``runs:/<id>/<path>``) in ``client``'s store."""
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp, tracking_uri=client.tracking_uri)
        return Path(local).read_text(encoding="utf-8")


def compare_versions(client: Any, name: str, a: str, b: str) -> tuple[dict, dict, list[dict[str, Any]]]:
    """Versions/aliases ``a`` and ``b`` as :func:`version_row`, and every test metric side by side with ``a - b``."""
    va, vb = get_version(client, name, a), get_version(client, name, b)
    if va is None or vb is None:
        raise RegistryError(f"model '{name}' has no version with alias '{a if va is None else b}'")
    ma, mb = all_metrics(va.tags, read_lineage(client, va)), all_metrics(vb.tags, read_lineage(client, vb))
    primaries = set(primary_scores(va.tags)[0]) | set(primary_scores(vb.tags)[0])
    rows = [
        {
            "metric": k,
            "primary": k in primaries,
            "a": ma.get(k),
            "b": mb.get(k),
            "delta": ma[k] - mb[k] if k in ma and k in mb else None,
        }
        for k in sorted(set(ma) | set(mb))
    ]
    return version_row(va, list(va.aliases)), version_row(vb, list(vb.aliases)), rows
