"""Output helpers that never leave a half-written result in place of a good one."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pipeline.core.reports.base import ReportError, StageReport

if TYPE_CHECKING:
    from pipeline.core.errors import DataError, MissingInput

R = TypeVar("R", bound=StageReport)

TMP_MARK = ".tmp-"  # staged outputs: .<name>.tmp-<pid>-<random>
OLD_MARK = ".old-"  # replaced outputs awaiting deletion: .<name>.old-<pid>
JOURNAL_DIR = Path(".adaptbert") / "txn"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _leftover_pid(name: str) -> int | None:
    """The pid in a staged or replaced output's name (``.x.tmp-<pid>-...``, ``.x.old-<pid>``), if any."""
    for mark in (TMP_MARK, OLD_MARK):
        if name.startswith(".") and mark in name:
            head = name.rsplit(mark, 1)[1].split("-", 1)[0]
            return int(head) if head.isdigit() else None
    return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_leftovers(folder: Path) -> list[Path]:
    """Delete staged/replaced outputs in ``folder`` that a dead process left (SIGKILL, power loss)."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        pid = _leftover_pid(entry.name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            _remove(entry)
            removed.append(entry)
    return removed


class Transaction:
    """A stage's outputs, staged next to their targets and swapped in together by :meth:`commit`.

    The commit point is one atomic write of a journal (``.adaptbert/txn/<stage>.json``) that
    lists every staged -> target pair; the swaps follow. A process killed before the journal
    exists leaves every old output in place (its staged files are cleaned at the next start); one
    killed after it is rolled forward by :func:`recover` at the next start. Either way the outputs
    are all old or all new, never a mix.
    """

    def __init__(self, root: Path, stage: str) -> None:
        self.root, self.stage = root, stage
        self.pairs: list[tuple[Path, Path]] = []  # (staged, target)
        recover(root)  # before any cleaning: a killed commit's staged outputs are still needed

    def writing(self) -> str:
        """What this transaction is writing, for an error that names no file ('' before anything is staged)."""
        return "writing " + ", ".join(str(target) for _, target in self.pairs) if self.pairs else ""

    def _stage_path(self, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(target.parent)
        return target.with_name(f".{target.name}{TMP_MARK}{os.getpid()}-{len(self.pairs)}")

    def dir(self, target: Path) -> Path:
        """A fresh empty directory whose contents become ``target`` at commit."""
        staged = self._stage_path(target)
        _remove(staged)
        staged.mkdir()
        self.pairs.append((staged, target))
        return staged

    def write_text(self, target: Path, text: str) -> None:
        """Stage ``text`` (UTF-8) to become the file ``target`` at commit."""
        staged = self._stage_path(target)
        staged.write_text(text, encoding="utf-8")
        self.pairs.append((staged, target))

    def write_json(self, target: Path, data: Any) -> None:
        """Stage ``data`` as indented JSON to become the file ``target`` at commit (an object with its seal:
        :mod:`pipeline.core.seals`)."""
        self.write_text(target, json.dumps(sealed(data), indent=2, ensure_ascii=False) + "\n")

    def write_report(self, target: Path, report: dict[str, Any] | StageReport) -> None:
        """Stage a stage report: its reproducible part to ``target``, its measurements beside it (:func:`write_report`)."""
        stable, measured = split_measured(report_json(report))
        self.write_json(target, stable)
        self.write_json(measured_path(target), measured)

    def abort(self) -> None:
        for staged, _ in self.pairs:
            _remove(staged)

    def commit(self) -> None:
        for staged, _ in self.pairs:
            if staged.is_dir():  # complete now: its seal lists every file the stage wrote
                seal_folder(staged)
        journal = self.root / JOURNAL_DIR / f"{self.stage}.json"
        pairs = [[str(s), str(t)] for s, t in self.pairs]
        try:
            write_text(journal, json.dumps({"pid": os.getpid(), "pairs": pairs}) + "\n")  # the commit point
        except BaseException:  # no commit (a full disk): the old outputs stay, the staged ones go
            self.abort()
            raise
        replaced = _swap_in(self.pairs)
        journal.unlink()
        for old in replaced:
            _remove(old)


def _swap_in(pairs: list[tuple[Path, Path]]) -> list[Path]:
    """Rename each staged output onto its target; return where the replaced targets went."""
    replaced = []
    for staged, target in pairs:
        if not staged.exists():  # already swapped (a roll-forward after a kill mid-commit)
            continue
        if target.exists() or target.is_symlink():
            replaced.append(target.with_name(f".{target.name}{OLD_MARK}{os.getpid()}-{time.monotonic_ns()}"))
            target.rename(replaced[-1])
        staged.rename(target)
        _fault_point("swap")
    return replaced


def _fault_point(where: str) -> None:
    """Test hook: ``ADAPTBERT_FAULT=swap:N`` SIGKILLs this process after the N-th swap of a commit."""
    spec = os.environ.get("ADAPTBERT_FAULT", "")
    if spec.startswith(f"{where}:"):
        remaining = int(spec.split(":", 1)[1]) - 1
        os.environ["ADAPTBERT_FAULT"] = f"{where}:{remaining}"
        if remaining <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


def recover(root: Path) -> list[str]:
    """Finish every commit a killed process left half done (roll forward); return the stages recovered."""
    done = []
    folder = root / JOURNAL_DIR
    for journal in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(journal.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # a torn journal was never a commit point
            journal.unlink(missing_ok=True)
            continue
        if _pid_alive(int(entry["pid"])) and int(entry["pid"]) != os.getpid():
            continue  # still committing
        pairs = [(Path(s), Path(t)) for s, t in entry["pairs"]]
        replaced = _swap_in(pairs)
        journal.unlink()
        for old in replaced:
            _remove(old)
        for _, target in pairs:  # the killed process's own replaced outputs
            clean_leftovers(target.parent)
        done.append(journal.stem)
    return done


# The errors of a write that failed for want of room or a working disk (a library may raise them without a file name)
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG}


@contextmanager
def naming_writes(where: Callable[[], str]) -> Iterator[None]:
    """Re-raise a write error that a library raised without a file name (PyArrow, safetensors, ``torch.save`` inside
    the Trainer's checkpoints) as an ``OSError`` naming ``where()`` (what the block was writing)."""
    try:
        yield
    except BaseException as err:
        from pipeline.core.errors import find_os_error

        os_err = find_os_error(err)
        if os_err is not None and os_err.filename is None and os_err.errno in _WRITE_ERRNOS and (named := where()):
            raise OSError(os_err.errno, os_err.strerror, named) from err
        raise


@contextmanager
def transaction(root: Path, stage: str) -> Iterator[Transaction]:
    """Stage outputs in the block; commit them together if it succeeds, drop them if not."""
    from pipeline.core.errors import raise_if_stopped

    txn = Transaction(root, stage)
    try:
        with naming_writes(txn.writing):
            yield txn
            raise_if_stopped()  # a Ctrl-C/SIGTERM whose exception Python dropped still keeps the old outputs
    except BaseException:
        txn.abort()
        raise
    txn.commit()


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``target`` only if the block succeeds.

    For one output with no report beside it (the demo data); stages, whose outputs must change
    together, use :func:`transaction`.
    """
    with transaction(target.parent.parent, f"dir-{target.name}") as txn:
        yield txn.dir(target)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) through a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-w")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None:  # a write that fails on close (a full disk) names no file
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON through a temporary file and an atomic rename."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


# Values that differ between two runs on the same data: wall-clock timings, throughput, latency, memory,
# thread counts, tracking ids, and what a run found left by the runs before it (the checkpoint it resumed, the
# checkpoints it set aside). A report keeps them out of its versioned file, so that a re-run leaves git and
# dvc.lock unchanged, in ``<report dir>/measured/<name>`` (not versioned); read_report merges them back.
MEASURED_KEY = re.compile(
    r"seconds|_s$|_ms$|_per_s|rss|^threads$|^speed$|^speedup|^run_id$|^tracking_uri$|^resumed_from$|^checkpoint_log$|^minutes(_used)?$"
)


def measured_path(report: Path) -> Path:
    """Where the run-to-run measurements of ``report`` live (``reports/measured/<name>``, not versioned)."""
    return report.parent / "measured" / report.name


def split_measured(tree: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(reproducible, measured)`` halves of a report: keys matching ``MEASURED_KEY`` (and all below them) go to the
    second, with the nesting kept; :func:`merge_measured` is the inverse."""
    stable: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    for key, value in tree.items():
        if MEASURED_KEY.search(str(key)):
            measured[key] = value
        elif isinstance(value, dict):
            stable[key], inner = split_measured(value)
            if inner:
                measured[key] = inner
        else:
            stable[key] = value
    return stable, measured


def merge_measured(stable: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The whole report again from the halves of :func:`split_measured`."""
    merged = dict(stable)
    for key, value in measured.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_measured(merged[key], value)
        else:
            merged[key] = value
    return merged


def report_json(report: dict[str, Any] | StageReport) -> dict[str, Any]:
    """A report as its JSON object (a typed report through its model; the untyped ones are dicts already)."""
    return report.as_json() if isinstance(report, StageReport) else report


def write_report(path: Path, report: dict[str, Any] | StageReport) -> None:
    """Write a stage report atomically: the reproducible part to ``path``, the measurements to :func:`measured_path`."""
    stable, measured = split_measured(report_json(report))
    write_json(measured_path(path), measured)
    write_json(path, sealed(stable))


def data_digest(dirs: list[Path]) -> str:
    """SHA-256 over the names and bytes of every file below ``dirs`` (streamed, 1 MiB at a time)."""
    digest = hashlib.sha256()
    for d in dirs:
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            digest.update(str(f.relative_to(d.parent)).encode())
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of a file, streamed 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def listed_file(root: Path, relative: str, within: str, manifest: Path) -> Path:
    """``root / relative`` for a file a manifest lists, refused (``[corrupt-manifest]``) unless it lies inside
    ``root / within`` (no absolute path, no ``..``); a missing one is a missing input naming its stage."""
    path = Path(relative)
    if path.is_absolute() or ".." in path.parts or path.parts[:1] != (within,):
        raise damaged_input(manifest, "corrupt-manifest", f"entry '{relative}' lies outside {root / within}")
    if not (root / path).is_file():
        raise missing_input(root / path, f"listed in {manifest.name} but missing")
    return root / path


# (path, size, mtime_ns) of the files whose SHA-256 matched their manifest in this process: a stage reads a manifest
# more than once, and hashes each file once
_VERIFIED: set[tuple[str, int, int]] = set()


def check_digest(file: Path, sha256: str, manifest: Path, rule: str = "stale-manifest") -> None:
    """``file`` holds the content ``manifest`` records for it (``[<rule>]`` if not: changed after its stage wrote it);
    each file is hashed once per process."""
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
        if file_digest(file) != sha256:
            raise damaged_input(file, rule, f"its SHA-256 is not the one {manifest.name} records")
        _VERIFIED.add(key)


# Seals (pipeline.core.seals checks them before a stage runs): what a stage promises about the outputs it wrote
SEAL_FILE = ".sealed.json"  # in a folder output: {"sha256": {relative path: SHA-256}} of every file written there
SEAL_KEY = "_seal"  # in a JSON output: the SHA-256 of the rest of the object, as canonical JSON
OLDER = "not written by this version of adaptbert (an older one, or by hand)"


def _digest(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def sealed(data: Any) -> Any:
    """A JSON object with its seal added (anything else as it is: only objects carry one)."""
    if not isinstance(data, dict):
        return data
    body = json.loads(json.dumps({k: v for k, v in data.items() if k != SEAL_KEY}, ensure_ascii=False))
    return {**body, SEAL_KEY: _digest(body)}


def seal_folder(folder: Path) -> None:
    """Write ``folder/.sealed.json``: the SHA-256 of every file under ``folder`` (the transaction, as it commits)."""
    files = {
        f.relative_to(folder).as_posix(): file_digest(f)
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name != SEAL_FILE
    }
    (folder / SEAL_FILE).write_text(json.dumps({"sha256": files}, indent=1) + "\n", encoding="utf-8")


def check_json_seal(path: Path, data: dict[str, Any], required: bool = True) -> dict[str, Any]:
    """``data`` (read from ``path``) without its seal, or ``[corrupt-output]`` when the seal does not match the
    content, or is missing where ``required`` (a stage's input, checked from the CLI; a library caller also reads
    the reports of an older adaptbert, which have none)."""
    seal = data.get(SEAL_KEY)
    body = {k: v for k, v in data.items() if k != SEAL_KEY}
    if seal is None and required:
        raise damaged_input(path, "corrupt-output", f"has no seal: {OLDER}")
    if seal is not None and seal != _digest(body):
        raise damaged_input(path, "corrupt-output", "its content is not what its stage wrote (edited or damaged since)")
    return body


def missing_input(path: Path, detail: str) -> MissingInput:
    """The error for a missing or unreadable input, naming the stage that writes it (from the stage table)."""
    from pipeline.core.errors import MissingInput
    from pipeline.core.stages import producer_of

    return MissingInput(path, detail, producer_of(path))


def damaged_input(path: Path, rule: str, detail: str) -> DataError:
    """The error for an input that exists but cannot be used (truncated, garbled): names the file, the rule
    (``corrupt-model``) and what rewrites it: the stage that writes it, or its owner."""
    from pipeline.core.errors import DataError, stage_command
    from pipeline.core.stages import producer_of

    producer = producer_of(path)
    todo = f"re-run {stage_command(producer)}" if producer else "restore or re-download it"
    return DataError(path, None, rule, f"{detail}; {todo}")


def require_inputs(*inputs: Path) -> None:
    """Each input an earlier stage writes must exist; a missing one is a :class:`MissingInput` naming that stage."""
    for path in inputs:
        if not path.exists():
            raise missing_input(path, "missing (a failed or never-run stage, or deleted by hand)")


@overload
def read_report(path: Path) -> dict[str, Any]: ...
@overload
def read_report(path: Path, kind: type[R]) -> R: ...
def read_report(path: Path, kind: type[R] | None = None) -> dict[str, Any] | R:
    """A JSON report another stage wrote, as ``kind`` (its type, :mod:`pipeline.core.reports`) or a dict; missing,
    truncated, not an object or (typed) not of its type's schema is a :class:`MissingInput` naming the stage that
    rewrites it, one whose seal does not match its content ``[corrupt-output]`` (:mod:`pipeline.core.seals`; a report
    without one, of an older adaptbert, is read: the CLI refuses it as a stage's input)."""
    require_inputs(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise missing_input(path, f"not a complete JSON report ({type(err).__name__}: {str(err)[:120]})") from None
    if not isinstance(data, dict):
        raise missing_input(path, f"expected a JSON object, found {type(data).__name__}")
    stable, measured = check_json_seal(path, data, required=False), read_measured(path)
    if kind is None:
        return merge_measured(stable, measured)
    # the measurements are never an input to trust: only the keys the type knows are taken from them
    known = {k: v for k, v in measured.items() if k in kind.model_fields}
    try:
        return kind.from_json(merge_measured(stable, known))
    except ReportError as err:
        raise missing_input(path, f"written by another version of adaptbert: {err}") from None


@overload
def read_report_if_any(path: Path) -> dict[str, Any] | None: ...
@overload
def read_report_if_any(path: Path, kind: type[R]) -> R | None: ...
def read_report_if_any(path: Path, kind: type[R] | None = None) -> dict[str, Any] | R | None:
    """A stage report with its measurements (as ``kind`` when given), or ``None`` when that stage has not run (yet)."""
    if not path.exists():
        return None
    return read_report(path) if kind is None else read_report(path, kind)


def read_measured(report: Path) -> dict[str, Any]:
    """The measurements of ``report`` (empty when they are missing or unreadable: they are never an input to trust)."""
    try:
        data = json.loads(measured_path(report).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return {k: v for k, v in data.items() if k != SEAL_KEY} if isinstance(data, dict) else {}
