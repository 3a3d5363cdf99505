"""Bad-input fuzz (hypothesis) against a real server: every payload gets a 4xx (or a 200 when it happens
to be valid), never a 5xx, and the server keeps serving valid requests afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genrec.serve.app import create_app
from genrec.serve.config import ServeConfig

from ._server import ServerThread

VALID = {"history": [{"item_id": 1}, {"item_id": 50, "action": "like"}], "k": 5, "beam_width": 8,
         "diversity_lambda": 0.0, "sources": ["sid", "ann"], "rank": True}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)


@pytest.fixture(scope="module")
def client(run_dir: Path):
    app = create_app(ServeConfig(workdir=run_dir, max_body_bytes=64 * 1024))
    with ServerThread(app) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        yield c


def post_raw(c: httpx.Client, body: bytes, path: str = "/v1/recommend") -> httpx.Response:
    return c.post(path, content=body, headers={"content-type": "application/json"})


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert 400 <= r.status_code < 500
        body = r.json()
        assert body["message"], body  # a clear message, not an empty error


@FUZZ
@given(body=json_values)
def test_arbitrary_json(client: httpx.Client, body: object) -> None:
    for path in ("/v1/recommend", "/v1/rank"):
        check(post_raw(client, json.dumps(body).encode(), path))


@FUZZ
@given(field=st.sampled_from(sorted(VALID) + ["candidates", "surface", "request_ts", "extra"]), value=json_values)
def test_one_field_replaced(client: httpx.Client, field: str, value: object) -> None:
    check(post_raw(client, json.dumps({**VALID, field: value}).encode()))


@FUZZ
@given(item=st.dictionaries(st.sampled_from(["item_id", "action", "surface", "ts", "x"]), json_values, max_size=4))
def test_bad_history_items(client: httpx.Client, item: dict) -> None:
    check(post_raw(client, json.dumps({**VALID, "history": [{"item_id": 1}, item]}).encode()))
    check(post_raw(client, json.dumps({"history": [{"item_id": 1}, item], "candidates": [1, 2]}).encode(), "/v1/rank"))


@FUZZ
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_malformed_bytes(client: httpx.Client, raw: bytes) -> None:
    check(post_raw(client, raw))


@pytest.mark.parametrize("raw", [b'{"history": [], "diversity_lambda": NaN}', b'{"history": [], "diversity_lambda": Infinity}',
                                 b'{"history": [{"item_id": NaN}]}', b'{"history": [], "k": 1e400}',
                                 b'{"history": [], "k": 99999999999999999999999999}', b"\xff\xfe", b"[]", b"null",
                                 b'{"history": [{"item_id": 92233720368547758070}]}'])
def test_special_payloads(client: httpx.Client, raw: bytes) -> None:
    r = post_raw(client, raw)
    assert 400 <= r.status_code < 500, (raw, r.status_code, r.text)


def test_huge_histories_and_still_serving(client: httpx.Client) -> None:
    for n in (5_000, 100_000):
        r = client.post("/v1/recommend", json={"history": [{"item_id": i} for i in range(n)]})
        assert r.status_code == 413, r.text
    r = post_raw(client, b"{" * 50_000)  # deep nesting, under the size limit
    assert 400 <= r.status_code < 500
    assert client.get("/healthz").status_code == 200
    r = client.post("/v1/recommend", json=VALID)
    assert r.status_code == 200 and len(r.json()["items"]) == 5
