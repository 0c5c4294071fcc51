"""The shared front-door vectors (testvectors/frontdoor), run against
idem.frontdoor; the fingerprints are checked against the real server."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import Server, new_key
from idem import Client, frontdoor
from idem.frontdoor import FrontDoorError
from idem._core import seeded
from idem._errors import FleetBudgetExhausted, ProblemError
from idem._middleware import claim_failed
from idem._retry import attempt_header

VECTORS = Path(__file__).resolve().parents[3] / "testvectors" / "frontdoor"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


def test_keys() -> None:
    v = load("keys.json")
    assert v["vectors"]
    for tc in v["vectors"]:
        want = tc["expect"]
        try:
            key = frontdoor.parse_key(tc["header_values"])
            if key is not None and "scope" in tc:
                key = frontdoor.scoped_key(tc["scope"], key)
        except FrontDoorError as e:
            assert want.get("error") == e.code, tc["name"]
            continue
        assert "error" not in want, tc["name"]
        assert key == want["key"], tc["name"]


def _document(tc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    body = base64.b64decode(tc["body_base64"]) if "body_base64" in tc else tc.get("body", "").encode("utf-8")
    rules = tc.get("rules", {})
    doc = frontdoor.document(tc["query"], tc.get("content_type"), body, path=tc["path"], exclude=rules.get("exclude", ()),
                             header_names=rules.get("headers", ()), headers=tc.get("headers"))
    return frontdoor.operation(tc["method"], tc["route"]), doc


def test_fingerprint_documents() -> None:
    v = load("fingerprint.json")
    assert v["vectors"]
    for tc in v["vectors"]:
        want = tc["expect"]
        if "error" in want:
            with pytest.raises(FrontDoorError) as ei:
                _document(tc)
            assert ei.value.code == want["error"], tc["name"]
            continue
        op, doc = _document(tc)
        assert op == want["operation"], tc["name"]
        assert doc == want["document"], tc["name"]


def test_fingerprints_match_the_server(server: Server) -> None:
    """The document the middleware sends as the claim's request gets the
    fingerprint the Go front door computes locally."""
    with Client(server.url, token=server.token) as c:
        for tc in load("fingerprint.json")["vectors"]:
            if "error" in tc["expect"]:
                continue
            op, doc = _document(tc)
            key = new_key("fp")
            c.claim(key, operation=op, request=doc, lease=1)
            assert c.get(key).fingerprint == tc["expect"]["fingerprint"], tc["name"]


def test_policy() -> None:
    v = load("policy.json")
    assert list(frontdoor.DEFAULT_STORED_HEADERS) == v["default_stored_headers"]
    for tc in v["requirements"]:
        assert frontdoor.requirement(tc["method"]) == tc["expect"], tc["method"]
    for tc in v["store"]:
        got = ("not_replayable" if not frontdoor.storable_status(tc["status"])
               else "store" if frontdoor.store_status(tc["status"], tc["store_5xx"]) else "release")
        assert got == tc["expect"], tc
    for tc in v["stored_headers"]:
        items = [(k, x) for k, vals in tc["response_headers"].items() for x in vals]
        assert frontdoor.stored_headers(items, tc["allow"]) == tc["expect"], tc["name"]
    # The codes whose detail is fixed: the vectors hold it once, the constants must say the same.
    fixed = {frontdoor.RESPONSE_NOT_REPLAYABLE: frontdoor.NOT_REPLAYABLE_DETAIL,
             frontdoor.FINGERPRINT_MISMATCH: frontdoor.MISMATCH_DETAIL,
             frontdoor.STORAGE_QUOTA_EXCEEDED: frontdoor.STORAGE_QUOTA_DETAIL,
             frontdoor.TENANT_UNKNOWN: frontdoor.TENANT_UNKNOWN_DETAIL,
             frontdoor.OUTCOME_REVIEW: frontdoor.OUTCOME_REVIEW_DETAIL,
             frontdoor.RETRY_BUDGET_EXHAUSTED: frontdoor.RETRY_BUDGET_DETAIL}
    assert {tc["code"]: tc["detail"] for tc in v["problems"] if "detail" in tc} == fixed
    gateway_only = {"upstream_unavailable", "upstream_timeout", "server_busy"}
    for tc in v["problems"]:
        if tc["code"] in gateway_only:
            assert tc["code"] not in frontdoor.PROBLEMS
            continue
        err = FrontDoorError(tc["code"], "detail", retry_after=0.2)
        status, headers, body = frontdoor.problem(err, "req-1")
        doc = json.loads(body)
        h = dict(headers)
        assert (status, doc["status"], doc["title"], doc["retryable"], doc["type"], doc["code"]) == \
            (tc["status"], tc["status"], tc["title"], tc["retryable"], tc["type"], tc["code"])
        assert h["Content-Type"] == "application/problem+json" and doc["instance"] == "urn:idem:request:req-1"
        assert ("Retry-After" in h) == tc["retry_after"]
        if tc["retry_after"]:
            assert int(h["Retry-After"]) >= 1
    # Rule 8: idem's answers for a key its completer holds, through held() and problem().
    assert v["held"]
    for tc in v["held"]:
        err = frontdoor.held(tc["idem"]["code"], tc["idem"].get("retry_after_seconds", 0.0))
        assert err is not None, tc["name"]
        status, headers, body = frontdoor.problem(err, "req-1")
        doc, h, want = json.loads(body), dict(headers), tc["expect"]
        assert (status, doc["code"], doc["retryable"], doc["detail"]) == \
            (want["status"], want["code"], want["retryable"], want["detail"]), tc["name"]
        assert h.get("Retry-After") == want["retry_after"], tc["name"]
    assert frontdoor.held(frontdoor.REQUEST_IN_FLIGHT, 1.0) is None
    for tc in v["request_ids"]:
        assert frontdoor.valid_request_id(tc["header"]) == tc["kept"], tc["header"]
    assert v["prefer_wait"]
    for tc in v["prefer_wait"]:
        assert frontdoor.prefer_wait(tc["fields"]) == tc["expect"], tc["fields"]
    # Rule 9: the caller's Idem-Attempt, and what the claim passes on (the client's own header of the seeded call).
    assert v["attempts"]
    for tc in v["attempts"]:
        n, cause = frontdoor.caller_attempt(tc["fields"])
        want = tc["expect"]
        assert (n, cause) == (want["number"], want["cause"]), tc["name"]
        logical = seeded((n, cause))
        sent = attempt_header(logical.attempts + 1, logical.cause)
        assert sent == (want["forward"] or "1"), tc["name"]
    # Rule 9: idem's answer to the claim -> the middleware's (claim_failed, the one mapping of both middleware).
    assert v["budget"]
    for tc in v["budget"]:
        idem_ans, want = tc["idem"], tc["expect"]
        status = {"retry_budget_exhausted": 429, "store_unavailable": 503, "request_in_flight": 409}.get(idem_ans["code"], 422)
        err = ProblemError(status, idem_ans["code"], retry_after=idem_ans.get("retry_after_seconds", 0.0),
                           retryable=status != 422, fleet_budget_spent=idem_ans["spent"])
        if idem_ans["spent"] and not idem_ans["seeded"] and status != 422:
            err = FleetBudgetExhausted("claim", 1, "unavailable", err, None)  # what the client raises on the signal
        got = claim_failed(err)
        st, headers, body = frontdoor.problem(got, "req-1")
        doc, h = json.loads(body), dict(headers)
        assert (st, doc["code"], doc["retryable"]) == (want["status"], want["code"], want["retryable"]), tc["name"]
        assert h.get("Retry-After") == want["retry_after"], tc["name"]
        assert (h.get(frontdoor.HEADER_RETRY_BUDGET) == "exhausted") == want["signal"], tc["name"]
        if want["detail"] is not None:
            assert doc["detail"] == want["detail"], tc["name"]
