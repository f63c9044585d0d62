"""Progress on the console: a redrawn bar on a terminal, plain lines in logs (DVC, Prefect, CI).

Both show the same fields: ``done/total``, the work's own numbers (loss, ...), throughput and ETA.
On a terminal the bar is redrawn at most 5 times a second; elsewhere a line is printed when the
caller says so (``line=True``, e.g. every training log step) or at most every ``every_s`` seconds.
Everything goes to stderr: stdout carries the stage's one-line summary.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, TextIO

BAR_WIDTH = 24  # characters
REDRAW_S = 0.2  # seconds between two redraws of the bar on a terminal


def is_terminal(stream: TextIO) -> bool:
    """True when ``stream`` is an interactive terminal (``ADAPTBERT_PROGRESS=plain|bar`` overrides)."""
    forced = os.environ.get("ADAPTBERT_PROGRESS", "")
    if forced in ("plain", "bar"):
        return forced == "bar"
    return bool(getattr(stream, "isatty", lambda: False)())


def duration(seconds: float) -> str:
    """``73`` -> ``1:13``, ``3725`` -> ``1:02:05``."""
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_value(value: Any) -> str:
    """Numbers for a person: 4 significant digits below 10 000, whole numbers above (no exponents)."""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 10_000 else f"{value:.4g}"
    return str(value)


class Progress:
    """Progress of one piece of work of ``total`` units (``None``: unknown, no ETA)."""

    def __init__(
        self, what: str, total: int | None, unit: str = "steps", stream: TextIO | None = None, every_s: float = 10.0
    ) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.stream = stream or sys.stderr
        self.bar = is_terminal(self.stream)
        self.start = time.perf_counter()
        self.first: tuple[float, int] | None = None  # (time, done) at the first update: rates skip the set-up
        self.last_draw = self.start  # a plain line comes after ``every_s`` or when asked for
        self.done = 0
        self.printed_at: int | None = None  # ``done`` when the last plain line was printed
        self.fields: dict[str, Any] = {}

    def rate(self) -> float | None:
        """Units per second since the first update (``None`` before two updates)."""
        if self.first is None:
            return None
        t0, d0 = self.first
        elapsed = time.perf_counter() - t0
        return (self.done - d0) / elapsed if elapsed > 0 and self.done > d0 else None

    def eta(self) -> float | None:
        rate = self.rate()
        if rate is None or self.total is None:
            return None
        return max(self.total - self.done, 0) / rate

    def text(self) -> str:
        """``what  120/300 (40%)  loss 1.98  3.1 steps/s  elapsed 0:40  ETA 0:58``."""
        parts = [self.what]
        if self.total:
            parts.append(f"{self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)")
        else:
            parts.append(f"{self.done} {self.unit}")
        throughput_last = sorted(self.fields.items(), key=lambda kv: kv[0].endswith("/s"))  # stable: loss first
        parts += [f"{k} {fmt_value(v)}" for k, v in throughput_last]
        rate = self.rate()
        if rate is not None:
            parts.append(f"{fmt_value(rate)} {self.unit}/s")
        parts.append(f"elapsed {duration(time.perf_counter() - self.start)}")
        eta = self.eta()
        if eta is not None:
            parts.append(f"ETA {duration(eta)}")
        return "  ".join(parts)

    def update(self, done: int, line: bool = False, **fields: Any) -> None:
        """``done`` units so far, with the work's current numbers; ``line``: print a plain line now."""
        now = time.perf_counter()
        if self.first is None:
            self.first = (now, done)
        self.done = done
        self.fields.update(fields)
        if self.bar:
            if now - self.last_draw >= REDRAW_S or done == self.total:
                self.draw()
                self.last_draw = now
        elif line or now - self.last_draw >= self.every_s:
            self.say(self.text())
            self.last_draw, self.printed_at = now, done

    def draw(self) -> None:
        filled = round(BAR_WIDTH * self.done / self.total) if self.total else 0
        bar = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] " if self.total else ""
        self.stream.write(f"\r\x1b[2K{bar}{self.text()}")
        self.stream.flush()

    def say(self, message: str) -> None:
        """A line of its own (on a terminal, above the bar, which is redrawn after it)."""
        if self.bar:
            self.stream.write("\r\x1b[2K")
        self.stream.write(message + "\n")
        if self.bar and self.done:
            self.draw()
        self.stream.flush()

    def close(self) -> None:
        """End the bar (a terminal keeps its last state as a line); a plain log gets a final line."""
        if self.bar:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()
        elif self.printed_at is not None and self.printed_at != self.done:
            self.say(self.text())
            self.printed_at = self.done


def note(stage: str, message: str) -> None:
    """One line of ours on stderr (``pretrain: MiniLM ships no MLM head: a new one is initialised``)."""
    print(f"{stage}: {message}", file=sys.stderr, flush=True)


def quiet_libraries() -> None:
    """Silence what the libraries print about things a stage expects (it says what matters in its own words).

    transformers: load reports (MiniLM has no MLM head; the fine-tuned encoder drops it), "This checkpoint
    seem corrupted" for the untied MLM decoder of a checkpoint without one, "Writing model shards" bars;
    datasets: map/filter bars; MLflow/alembic: the sqlite store's migration INFO lines; SQLAlchemy: its own
    tracebacks of a failed connection. Errors still show;
    ``ADAPTBERT_VERBOSE=1`` keeps every library's own output.
    """
    import logging

    if os.environ.get("ADAPTBERT_VERBOSE") == "1":
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars follow this one
    for name in ("alembic", "mlflow", "great_expectations", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # SQLAlchemy, and MLflow's store for the database error it re-raises, log their tracebacks themselves (a
    # read-only or locked sqlite store); the stage says what failed in one line (pipeline.tracking.runs.store_errors)
    for name in ("sqlalchemy", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if "transformers" in sys.modules:  # imported already: the environment variables were read
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def plain(text: str) -> str:
    """Docstring markup out of help text: ``x`` and :func:`x` read as x on a terminal."""
    return re.sub(r":\w+:`([^`]+)`", r"\1", text).replace("``", "")
