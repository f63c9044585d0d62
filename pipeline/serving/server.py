"""``adaptbert serve``: a registered version over HTTP, MLflow's scoring app behind request limits.

The app is MLflow's own (``mlflow.pyfunc.scoring_server.init``: ``/invocations``, ``/ping``, ``/health``,
``/version``; the same answers as ``mlflow models serve``). In front of it, :class:`RequestLimits` refuses what
MLflow's server accepts without bound: it reads any body whole (a 30 MB one was answered after 36 s) and its JSON
parser recurses into any depth (a body nested 100,000 deep was an HTTP 500). Before serving, the version is checked:
one whose model files are gone from the artifact store is refused with the version and the way out, not MLflow's
"No such artifact". Every response names the registered model, version and variant that answered (headers
``X-Adaptbert-Model``, ``X-Adaptbert-Version``, ``X-Adaptbert-Variant``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import ConfigError, RegistryError
from pipeline.core.paths import Paths

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# A JSON string (escapes included): its brackets are text, not nesting
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), in one linear pass: brackets inside
    strings do not count. Malformed text gets a number too; the parser behind refuses it."""
    import numpy as np

    code = np.frombuffer(_JSON_STRING.sub(b"", body), dtype=np.uint8)
    step = np.isin(code, (ord("["), ord("{"))).astype(np.int64) - np.isin(code, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


class RequestLimits:
    """ASGI middleware: a request body over ``max_body_bytes`` is a 413 and JSON nested deeper than
    ``max_json_depth`` a 400, both answered before the app reads the request (register.serve names the limits)."""

    def __init__(self, app: App, max_body_bytes: int, max_json_depth: int) -> None:
        self.app, self.max_body_bytes, self.max_json_depth = app, max_body_bytes, max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self.refuse(send, 413, self.too_big(int(declared)))
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:  # a body sent in chunks, or without its length
                await self.refuse(send, 413, self.too_big(len(body)))
                return
            if not message.get("more_body"):
                break
        if (depth := json_depth(bytes(body))) > self.max_json_depth:
            await self.refuse(
                send,
                400,
                f"the request's JSON nests {depth} levels deep; at most {self.max_json_depth} are accepted "
                "(register.serve.max_json_depth)",
            )
            return
        sent = False

        async def replay() -> Message:  # the app reads the body we already read
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def too_big(self, size: int) -> str:
        return (
            f"the request body is {size:,} bytes; at most {self.max_body_bytes:,} are accepted "
            "(register.serve.max_body_bytes): send fewer or shorter rows"
        )

    @staticmethod
    async def refuse(send: Send, status: int, message: str) -> None:
        """An error in MLflow's shape (``error_code``, ``message``), as its scoring server answers a bad request."""
        body = json.dumps({"error_code": "INVALID_PARAMETER_VALUE", "message": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Identified:
    """ASGI middleware: every response names what answered it (``X-Adaptbert-Model``, ``-Version``, ``-Variant``)."""

    def __init__(self, app: App, headers: dict[str, str]) -> None:
        self.app = app
        self.headers = [(f"x-adaptbert-{k}".encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, named)


class PlainErrors:
    """ASGI middleware: an error answer's ``message`` without the prefix MLflow's scoring server puts before the
    model's own words (``Failed to predict data '<the pandas repr of the whole request>'. \nError: row 1 (task 'qa',
    ...): 'context' must be ...``): the client reads which row and field are wrong, not its request echoed back."""

    PREFIX = re.compile(r"\AFailed to predict data '.*?'\. \nError: ", re.DOTALL)

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = bytearray()

        async def plain(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held back until the body is in: its length changes
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            cleaned = self.cleaned(bytes(body))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(cleaned)).encode())]})
            await send({"type": "http.response.body", "body": cleaned})

        await self.app(scope, receive, plain)

    @classmethod
    def cleaned(cls, body: bytes) -> bytes:
        """``body`` with its JSON ``message`` freed of MLflow's prefix (any other body as it is)."""
        try:
            answer = json.loads(body)
        except ValueError:
            return body
        if not isinstance(answer, dict) or not isinstance(answer.get("message"), str):
            return body
        return json.dumps({**answer, "message": cls.PREFIX.sub("", answer["message"], count=1)}).encode()


def servable_uri(cfg: Config, paths: Paths, ref: str) -> tuple[str, str, str]:
    """``(models:/<name>/<version>, version, variant)`` of ``ref`` (an alias or a version number) in the registry, or
    a :class:`RegistryError` naming why it cannot be served (no such version, its files gone from the store)."""
    from pipeline.tracking.promotion import get_version, serving_problem
    from pipeline.tracking.runs import connect

    client, _ = connect(cfg.tracking, paths)
    name = cfg.registration.model_name
    version = get_version(client, name, ref)
    if version is None:
        raise RegistryError(f"model '{name}' has no version '{ref}' (`adaptbert models list` shows them)")
    number = str(version.version)
    if problem := serving_problem(client, name, number):
        raise RegistryError(
            f"version {number} of '{name}' ({ref}) cannot be served: {problem}; "
            "`adaptbert models rollback` points champion at the one before, or register a new run"
        )
    return f"models:/{name}/{number}", number, version.tags.get("variant", "full")


def predict(cfg: Config, paths: Paths, ref: str, row: dict[str, str]) -> dict[str, Any]:
    """The answer of version ``ref`` to one request row (``task`` and its fields), in this process, with the
    registered model, version and variant that gave it; a bad row is a :class:`ConfigError` naming the field."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    uri, number, variant = servable_uri(cfg, paths, ref)
    model = mlflow.pyfunc.load_model(uri)
    try:
        answer = model.predict(pd.DataFrame([row])).to_dict("records")[0]
    except MlflowException as err:  # the pyfunc's 400: the row and field that are wrong
        raise ConfigError(f"predict: {err.message}") from None
    named = {"model": cfg.registration.model_name, "version": number, "variant": variant}
    given = {k: v for k, v in answer.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
    return json.loads(json.dumps({**named, **given}, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def serve(cfg: Config, paths: Paths, ref: str, host: str, port: int) -> int:
    """Load version ``ref`` and answer requests on ``host:port`` until stopped (Ctrl-C)."""
    import mlflow
    import uvicorn
    from mlflow.pyfunc import scoring_server

    uri, number, variant = servable_uri(cfg, paths, ref)
    rule, name = cfg.registration.serve, cfg.registration.model_name
    model = mlflow.pyfunc.load_model(uri)
    limited = RequestLimits(scoring_server.init(model), rule.max_body_bytes, rule.max_json_depth)
    app = Identified(PlainErrors(limited), {"model": name, "version": number, "variant": variant})
    print(
        f"serving {name} version {number} ({ref}, {variant}) on http://{host}:{port}/invocations "
        f"(bodies up to {rule.max_body_bytes:,} bytes, JSON up to {rule.max_json_depth} levels)",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0
