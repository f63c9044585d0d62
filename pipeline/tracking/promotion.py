"""The model registry: the promotion gate (pure), and the alias moves around it.

A registered version carries what a person filters on as tags: per task its primary test metric and the trivial
baseline's (``primary.<task>.<metric>``, ``trivial.<task>.<metric>``), the mean, the variant, size and latency,
lineage; so the gate and ``adaptbert models list`` read the registry alone. Every other test metric is in the
register run's ``lineage.json`` (``test_metrics``), which ``compare`` reads. ``champion`` and ``challenger`` are
MLflow aliases (stages are deprecated); an alias has no history, so every move also tags the version it lands on
(``promoted_at``, ``previous_champion``) and ``rollback`` follows ``previous_champion`` back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.core.errors import RegistryError
from pipeline.core.reports.evaluation import VersionScores
from pipeline.core.sections.register import RegisterConfig

CHAMPION, CHALLENGER = "champion", "challenger"


# ----------------------------------------------------------------------------- the gate (pure)


@dataclass(frozen=True)
class Rules:
    """Promotion rules, in metric units (fractions): see ``params.yaml: register``."""

    min_delta: float = 0.0
    max_regression: float = 0.0
    min_gain_over_trivial: float = 0.0
    floors: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, rc: RegisterConfig) -> Rules:
        return cls(rc.min_delta, rc.max_regression, rc.min_gain_over_trivial, dict(rc.floors))


@dataclass(frozen=True)
class Verdict:
    """The gate's decision, its reason in one sentence, and the side-by-side rows behind it."""

    promote: bool
    reason: str
    rows: list[dict[str, Any]]
    mean_challenger: float | None
    mean_champion: float | None


def _floor(key: str, rules: Rules, trivial: Mapping[str, float]) -> tuple[float, str]:
    """The absolute minimum for ``key`` (``task.metric``) and how it came about."""
    task = key.split(".", 1)[0]
    need, why = -math.inf, "no floor"
    if key in trivial:
        need, why = (
            trivial[key] + rules.min_gain_over_trivial,
            f"trivial {trivial[key]:.4f} + {rules.min_gain_over_trivial}",
        )
    if task in rules.floors and rules.floors[task] > need:
        need, why = rules.floors[task], f"floor {rules.floors[task]}"
    return need, why


def should_promote(
    challenger: Mapping[str, float],
    champion: Mapping[str, float] | None,
    rules: Rules,
    trivial: Mapping[str, float] | None = None,
) -> Verdict:
    """Whether the challenger may replace the champion.

    Metrics are primary test metrics keyed ``task.metric`` (a task whose primary metric changed is a
    different key, hence not comparable). With a champion: every champion key must exist in the
    challenger; the mean over the champion's keys must rise by at least ``min_delta``; no key may
    drop by more than ``max_regression``; keys new in the challenger must clear their floor.
    Without a champion: every key must clear its floor (``trivial + min_gain_over_trivial`` and
    ``floors[task]``, whichever is higher).
    """
    trivial = trivial or {}
    if not challenger:
        return Verdict(False, "the challenger has no metrics", [], None, None)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for key in sorted(set(challenger) | set(champion or {})):
        new, old = challenger.get(key), (champion or {}).get(key)
        row: dict[str, Any] = {
            "metric": key,
            "challenger": new,
            "champion": old,
            "delta": None,
            "check": "",
            "ok": True,
        }
        if new is None:
            row.update(check="missing in the challenger", ok=False)
            failures.append(f"the challenger has no {key}, which the champion has")
        elif old is None:
            need, why = _floor(key, rules, trivial)
            row.update(check=f">= {need:.4f} ({why})", ok=new >= need)
            if not row["ok"]:
                failures.append(f"{key} {new:.4f} is below {need:.4f} ({why})")
        else:
            row.update(
                delta=new - old,
                check=f"delta >= -{rules.max_regression}",
                ok=new - old >= -rules.max_regression - 1e-12,
            )
            if not row["ok"]:
                failures.append(f"{key} regresses by {old - new:.4f} (> max_regression {rules.max_regression})")
        rows.append(row)
    mean_new = sum(challenger.values()) / len(challenger)
    if champion is None:
        reason = (
            "promoted: no champion yet and every task clears its floor"
            if not failures
            else "not promoted: no champion yet, and " + "; ".join(failures)
        )
        return Verdict(not failures, reason, rows, mean_new, None)
    common = [k for k in champion if k in challenger]
    mean_old = sum(champion.values()) / len(champion) if champion else 0.0
    if not common:
        return Verdict(
            False,
            "not promoted: the challenger shares no task metric with the champion; " + "; ".join(failures),
            rows,
            None,
            mean_old,
        )
    mean_new_common = sum(challenger[k] for k in common) / len(common)
    delta = mean_new_common - mean_old
    if not delta >= rules.min_delta - 1e-12:
        failures.insert(
            0,
            f"mean primary {mean_new_common:.4f} vs champion {mean_old:.4f} (delta {delta:+.4f}) "
            f"does not beat it by min_delta {rules.min_delta}",
        )
    reason = (
        f"promoted: mean primary {mean_new_common:.4f} vs champion {mean_old:.4f} (delta {delta:+.4f} >= {rules.min_delta}), "
        f"no task regresses by more than {rules.max_regression}"
        if not failures
        else "not promoted: " + "; ".join(failures)
    )
    return Verdict(not failures, reason, rows, mean_new_common, mean_old)


# ----------------------------------------------------------------------------- the serving rule (pure)


@dataclass(frozen=True)
class Candidate:
    """One of a run's servable models: the full one or a compressed variant, as measured by compress."""

    name: str  # full | int8 | distilled | pruned | distilled_int8
    mean_primary: float
    primary: Mapping[str, float]  # task -> primary test metric
    p50_ms: float | None  # batch-1 p50 latency as served; None: not measured
    p50_range: tuple[float, float] | None = None  # lowest and highest p50 of its timed rounds (ms); None: no rounds


def choose_served(
    full: Candidate, variants: list[Candidate], rule: str, max_mean_drop: float, max_task_drop: float
) -> tuple[str, str, list[dict[str, Any]]]:
    """Which model of this run to propose for serving: ``(name, reason, rows)``.

    ``full``: the full model. ``fastest_within``: the variant with the lowest batch-1 latency whose mean
    primary metric is at most ``max_mean_drop`` below the full model's and no task more than
    ``max_task_drop`` below; it must also be faster than the full model beyond the timing noise (its slowest
    round's p50 below the full model's fastest, where rounds were timed). None qualifies: the full model.
    """
    rows = []
    eligible = []
    for v in variants:
        mean_drop = full.mean_primary - v.mean_primary
        worst = max(((t, full.primary[t] - v.primary.get(t, -math.inf)) for t in full.primary), key=lambda x: x[1])
        faster = v.p50_ms is not None and full.p50_ms is not None and v.p50_ms < full.p50_ms
        mine, theirs = v.p50_range, full.p50_range
        problems = []
        if mean_drop > max_mean_drop + 1e-12:
            problems.append(f"mean drops {mean_drop:.4f} > {max_mean_drop}")
        if worst[1] > max_task_drop + 1e-12:
            problems.append(f"{worst[0]} drops {worst[1]:.4f} > {max_task_drop}")
        if not faster:
            problems.append("not faster than the full model")
        elif mine and theirs and mine[1] >= theirs[0]:  # its slowest round is not below the full model's fastest
            problems.append(
                f"faster only within the timing noise (rounds' p50 {mine[0]:.1f}-{mine[1]:.1f} ms vs the full "
                f"model's {theirs[0]:.1f}-{theirs[1]:.1f} ms)"
            )
        rows.append(
            {
                "model": v.name,
                "p50_ms": v.p50_ms,
                "mean_primary": v.mean_primary,
                "ok": not problems,
                "why": "; ".join(problems),
            }
        )
        if not problems:
            eligible.append(v)
    if rule == "full":
        return full.name, "register.serve.rule is full: the full model is served", rows
    if not eligible:
        return full.name, "no variant is faster and within the serving rule: the full model is served", rows
    best = min(eligible, key=lambda v: (v.p50_ms, v.name))
    reason = (
        f"{best.name}: the fastest variant within the rule ({best.p50_ms:.2f} ms vs {full.p50_ms:.2f} ms batch-1 p50, "
        f"mean primary {best.mean_primary:.4f} vs {full.mean_primary:.4f})"
    )
    return best.name, reason, rows


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


def ensure_registered_model(client: Any, name: str) -> None:
    """Create ``name`` in the registry unless it exists (safe when two processes race)."""
    try:
        client.create_registered_model(name, description="adaptbert multi-task model (pyfunc: every task type)")
    except Exception as err:  # a racing insert is SQLAlchemy's IntegrityError, not an MlflowException
        if not already_exists(err):
            raise


LOCK_SUFFIX = ".promotion-lock"  # the registered model that is the lock of <name>'s promotions
LOCK_STALE_S = 600  # a lock older than this was left by a process that died holding it: taken over


def already_exists(err: Exception) -> bool:
    """The error for a name the registry holds already: MLflow's (SQLite, PostgreSQL, a server), or the store's unique
    key itself where two processes passed MLflow's read-then-insert at once (SQLite's "UNIQUE constraint failed",
    PostgreSQL's "duplicate key value", raised as SQLAlchemy's IntegrityError: seen in CI with three threads)."""
    text = str(err).lower()
    return (
        getattr(err, "error_code", "") == "RESOURCE_ALREADY_EXISTS"
        or "already exists" in text
        or "unique constraint failed" in text
        or "duplicate key value" in text
    )


@contextlib.contextmanager
def promotion_lock(client: Any, name: str, wait_s: float = 300) -> Iterator[None]:
    """Serialise promotions of ``name`` across processes and machines: the lock is a registered model
    ``<name>.promotion-lock``, which only one process can create (the store's unique model names: SQLite,
    PostgreSQL, any server), deleted when the promotion ends. A file lock serialised one machine only: two machines
    registering at once against a team's server both moved ``champion`` (tests/e2e/test_team_stack.py). MLflow's
    REST API has no compare-and-set, so its one atomic write, creating a name, is the mutex. A lock older than
    :data:`LOCK_STALE_S` (its holder died) is taken over; waiting longer than ``wait_s`` is a RegistryError."""
    from mlflow.exceptions import MlflowException

    lock = f"{name}{LOCK_SUFFIX}"
    owner = f"{socket.gethostname()}:{os.getpid()}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.create_registered_model(
                lock,
                tags={"adaptbert.lock.owner": owner, "adaptbert.lock.since": f"{time.time():.0f}"},
                description=f"held by {owner} while it promotes a version of {name} (adaptbert); deleted after",
            )
            break
        except Exception as err:  # a racing insert is SQLAlchemy's IntegrityError (see already_exists)
            if not already_exists(err):
                raise
        held = lock_holder(client, lock)
        if held is not None and time.time() - held[1] > LOCK_STALE_S:
            with contextlib.suppress(MlflowException):
                client.delete_registered_model(lock)
            continue
        if time.monotonic() > deadline:
            who = f" by {held[0]}" if held else ""
            raise RegistryError(
                f"another promotion of '{name}' has held the registry lock '{lock}'{who} for over {wait_s:.0f} s; "
                f"try again, or delete that registered model if no promotion is running"
            )
        time.sleep(0.2 + random.random() * 0.3)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            client.delete_registered_model(lock)


def point_alias(client: Any, name: str, alias: str, version: str) -> None:
    """Move ``alias`` of ``name`` to ``version`` under the registry lock: MLflow's SQL store sets an alias by a read
    then an insert, so two processes setting one alias at once fail on PostgreSQL's unique key (a UniqueViolation
    that ended a register in tests/e2e/test_team_stack.py)."""
    with promotion_lock(client, name):
        client.set_registered_model_alias(name, alias, version)


def lock_holder(client: Any, lock: str) -> tuple[str, float] | None:
    """(owner, since) of the lock model, or None where it is gone (released meanwhile)."""
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(lock).tags
    except MlflowException:
        return None
    return tags.get("adaptbert.lock.owner", "?"), float(tags.get("adaptbert.lock.since", "0") or 0)


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
