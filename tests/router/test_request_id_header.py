"""``X-Request-Id`` over HTTP, in every mode: the client's id becomes the request's id (the
response's ``id``, streamed or not) and comes back as a response header; an invalid one is
refused with 400 naming the header; without it the router makes an id and sends no header; a
retry right after its client dropped the first's connection is served."""

from __future__ import annotations

import json
import time

import pytest

from tests.router.server_harness import Server

pytestmark = pytest.mark.timeout(300)

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3}


def test_the_client_id_is_the_request_id_and_comes_back(server: Server) -> None:
    r = server.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "trace-7f3a"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "chatcmpl-trace-7f3a"
    assert r.headers["x-request-id"] == "trace-7f3a"

    r = server.post("/v1/completions", json=COMPLETION, headers={"X-Request-Id": "batch-42/req 7"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "cmpl-batch-42/req 7"
    assert r.headers["x-request-id"] == "batch-42/req 7"

    with server.http(timeout=60) as client:
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"X-Request-Id": "trace-stream"},
        ) as s:
            assert s.status_code == 200
            assert s.headers["x-request-id"] == "trace-stream"
            chunks = [
                json.loads(line[len("data: ") :])
                for line in s.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
    assert chunks and {c["id"] for c in chunks} == {"chatcmpl-trace-stream"}
    server.wait_pool_free()


def test_without_the_header_the_router_makes_the_id(server: Server) -> None:
    r = server.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    assert r.json()["id"].startswith("chatcmpl-") and "x-request-id" not in r.headers


@pytest.mark.parametrize(
    ("value", "message"),
    [("x" * 257, "X-Request-Id is 257 characters; at most 256"), ("tab\there", "printable")],
    ids=["too long", "tab"],
)
def test_an_invalid_header_is_refused_naming_it(server: Server, value: str, message: str) -> None:
    r = server.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "X-Request-Id" and message in error["message"], error
    assert "x-request-id" not in r.headers
    assert server.post("/v1/chat/completions", json=CHAT).status_code == 200  # still serving
    server.wait_pool_free()


def test_a_header_id_in_flight_is_refused_naming_the_header(server: Server) -> None:
    long = {**CHAT, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with server.http(timeout=120) as client:
        with client.stream(
            "POST", "/v1/chat/completions", json=long, headers={"X-Request-Id": "dup"}
        ) as first:
            lines = first.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # it streams
            r = server.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "dup"})
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert error["param"] == "X-Request-Id", error
            assert "X-Request-Id: request 'chatcmpl-dup' is already in flight" in error["message"]
            assert "leave it out" in error["message"]
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"  # the first is untouched
    server.wait_pool_free()


def test_a_retry_straight_after_a_dropped_connection_is_served(server: Server) -> None:
    """The client drops a streaming request's connection and at once sends the same
    X-Request-Id again on a new connection, eight times: every retry is served with the same
    tokens. One that reaches the router before the server has noticed the dropped connection
    (a CI run with TLS saw it) gets 409 and is served when it tries again."""
    greedy = {**COMPLETION, "temperature": 0}
    long = {**greedy, "max_tokens": 1000, "stream": True, "ignore_eos": True}
    expected = server.post("/v1/completions", json=greedy).json()["choices"][0]["text"]
    for _ in range(8):
        with server.http(timeout=60) as client:
            with client.stream(
                "POST", "/v1/completions", json=long, headers={"X-Request-Id": "dropped"}
            ) as s:
                assert s.status_code == 200
                next(s.iter_lines())
        for _ in range(50):
            r = server.post("/v1/completions", json=greedy, headers={"X-Request-Id": "dropped"})
            if r.status_code != 409:
                break
            assert r.json()["error"]["param"] == "X-Request-Id", r.text
            time.sleep(0.1)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == expected
    server.wait_pool_free()
