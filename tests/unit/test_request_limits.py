"""``adaptbert serve``'s request limits: a body over ``max_body_bytes`` is a 413, JSON deeper than ``max_json_depth`` a
400, both before the app reads the request; everything else reaches the app byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pipeline.serving.server import Identified, PlainErrors, RequestLimits, json_depth

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\ ,:'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="[]{}\"'x", max_size=3), inner),
    max_leaves=20,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(json_values)
def test_json_depth_counts_nesting_and_ignores_brackets_in_strings(value: Any) -> None:
    assert json_depth(json.dumps(value).encode()) == _depth(value)


def _client(seen: list[bytes], named: dict[str, str] | None = None) -> TestClient:
    async def invocations(request: Request) -> JSONResponse:
        seen.append(await request.body())
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/invocations", invocations, methods=["POST"])])
    limited = RequestLimits(app, max_body_bytes=2_000, max_json_depth=5)
    return TestClient(Identified(limited, named) if named else limited)


def test_a_request_within_the_limits_reaches_the_app_unchanged() -> None:
    seen: list[bytes] = []
    body = json.dumps({"dataframe_records": [{"task": "role", "text": "[[[[[[[[ brackets in text ]]]]]]]]"}]}).encode()
    response = _client(seen).post("/invocations", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200 and seen == [body]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_a_413_naming_the_setting(chunked: bool) -> None:
    seen: list[bytes] = []
    body = json.dumps({"dataframe_records": [{"task": "role", "text": "x" * 5_000}]}).encode()
    content: Any = iter([body[:1_000], body[1_000:]]) if chunked else body  # chunked: no content-length to trust
    response = _client(seen).post("/invocations", content=content)
    assert response.status_code == 413 and seen == []
    assert "register.serve.max_body_bytes" in response.json()["message"]


def test_json_nested_deeper_than_the_limit_is_a_400_naming_the_setting() -> None:
    seen: list[bytes] = []
    response = _client(seen).post("/invocations", content=b"[" * 100 + b"]" * 100)
    assert response.status_code == 400 and seen == []
    assert response.json() == {
        "error_code": "INVALID_PARAMETER_VALUE",
        "message": "the request's JSON nests 100 levels deep; at most 5 are accepted (register.serve.max_json_depth)",
    }


def test_every_response_names_what_answered_it_refusals_too() -> None:
    seen: list[bytes] = []
    client = _client(seen, {"model": "adaptbert", "version": "3", "variant": "int8"})
    for body in (b'{"dataframe_records": []}', b"[" * 10 + b"]" * 10):
        response = client.post("/invocations", content=body)
        assert (response.headers["x-adaptbert-version"], response.headers["x-adaptbert-variant"]) == ("3", "int8")
    assert len(seen) == 1


def test_an_error_answer_names_the_row_without_mlflows_echo_of_the_request() -> None:
    """MLflow's scoring server puts the pandas repr of the whole request before the model's message."""
    said = "row 1 (task 'qa', extractive_qa): 'context' must be a non-empty string, got None"
    echoed = f"Failed to predict data '  task     question\n0   qa  What. \nError: x'. \nError: {said}"

    async def invocations(request: Request) -> JSONResponse:
        if await request.body() == b"bad":
            return JSONResponse({"error_code": "INVALID_PARAMETER_VALUE", "message": echoed}, status_code=400)
        return JSONResponse({"predictions": [{"message": echoed}]})

    client = TestClient(PlainErrors(Starlette(routes=[Route("/invocations", invocations, methods=["POST"])])))
    bad = client.post("/invocations", content=b"bad")
    assert bad.status_code == 400 and bad.json() == {"error_code": "INVALID_PARAMETER_VALUE", "message": said}
    assert int(bad.headers["content-length"]) == len(bad.content)
    good = client.post("/invocations", content=b"good")  # an answer is never touched
    assert good.status_code == 200 and good.json() == {"predictions": [{"message": echoed}]}
