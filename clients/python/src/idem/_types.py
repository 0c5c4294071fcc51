"""The data types of the idem HTTP contract."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

# The states of a record.
IN_FLIGHT = "in_flight"
COMPLETED = "completed"
ORPHANED = "orphaned"
EXPIRED = "expired"


@dataclass(frozen=True)
class Response:
    """A stored response: what a completed request answered, and what a
    replay returns verbatim."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def to_wire(self) -> dict[str, Any]:
        """The contract's response object: the body as UTF-8 text when it is
        valid UTF-8, base64 otherwise."""
        w: dict[str, Any] = {"status": self.status}
        if self.headers:
            w["headers"] = dict(self.headers)
        try:
            w["body"], w["body_encoding"] = self.body.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            w["body"], w["body_encoding"] = base64.b64encode(self.body).decode("ascii"), "base64"
        return w

    @classmethod
    def from_wire(cls, w: Mapping[str, Any]) -> Response:
        """Decode the contract's response object; ValueError when the body
        cannot be decoded (bad base64, unknown encoding)."""
        enc = w.get("body_encoding") or "utf8"
        text = w.get("body") or ""
        if not isinstance(text, str):
            raise ValueError("response body is not a string")
        if enc == "utf8":
            body = text.encode("utf-8")
        elif enc == "base64":
            try:
                body = base64.b64decode(text.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as e:
                raise ValueError(f"decode base64 response body: {e}") from e
        else:
            raise ValueError(f"unknown body_encoding {enc!r}")
        headers = w.get("headers") or {}
        return cls(status=int(w["status"]), headers={str(k): str(v) for k, v in headers.items()}, body=body)


def _time(v: Any) -> datetime | None:
    if not isinstance(v, str) or not v:
        return None
    return datetime.fromisoformat(v.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Record:
    """What the service stores for one key (GET /v1/keys/{key})."""

    key: str
    state: str
    operation: str = ""
    fingerprint: str = ""
    fencing_token: int = 0
    attempt: int = 0
    lease_expires_at: datetime | None = None
    recovery_point: str = ""
    recovery_data: Any = None
    created_at: datetime | None = None
    completed_at: datetime | None = None
    replay_until: datetime | None = None
    purge_after: datetime | None = None
    response: Response | None = None
    #: Set by the operator's orphan list only.
    tenant: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Record:
        """Decode a record, reading JSON nulls as empty values."""
        resp = d.get("response")
        return cls(
            key=str(d.get("key") or ""), state=str(d.get("state") or ""),
            operation=str(d.get("operation") or ""), fingerprint=str(d.get("fingerprint") or ""),
            fencing_token=int(d.get("fencing_token") or 0), attempt=int(d.get("attempt") or 0),
            lease_expires_at=_time(d.get("lease_expires_at")), recovery_point=str(d.get("recovery_point") or ""),
            recovery_data=d.get("recovery_data"), created_at=_time(d.get("created_at")),
            completed_at=_time(d.get("completed_at")), replay_until=_time(d.get("replay_until")),
            purge_after=_time(d.get("purge_after")),
            response=Response.from_wire(resp) if isinstance(resp, dict) else None,
            tenant=str(d.get("tenant") or ""),
        )


@dataclass(frozen=True)
class ClaimResult:
    """The answer to a claim: a fresh claim or takeover (replayed False;
    record.fencing_token, record.attempt, resumed and the recovery point are
    set) or a replay of a completed request (replayed True; record.response
    holds the stored response)."""

    record: Record
    #: True for a takeover of an orphaned claim; the record's recovery point is the last checkpoint.
    resumed: bool = False
    #: True when the key was already completed.
    replayed: bool = False
    #: The wait, in whole seconds, the server applied to this claim (its
    #: Preference-Applied answer to ``wait``): it held the claim while another
    #: request had the key; 0 when none.
    wait_applied: int = 0
    #: The lease the claim had when the server answered, seconds:
    #: record.lease_expires_at less the answer's Date (whole seconds, so up to
    #: a second more). Unlike lease_expires_at less this host's clock, it does
    #: not depend on how far the two clocks are apart. 0 when unknown.
    lease_left: float = 0.0
    #: For a replay, how much of the replay window was left when the server
    #: answered, seconds: record.replay_until less the answer's Date and less
    #: a second (Date is in whole seconds), so never more than what was left,
    #: on the server's clock rather than this host's. 0 when the answer had
    #: no Date, or for a claim. A front door's replay cache keeps the replay
    #: no longer (docs/frontdoor.md, "The replay cache").
    replay_left: float = 0.0


@dataclass(frozen=True)
class RunResult:
    """The outcome of run()."""

    #: The function's response, or the stored one on a replay.
    response: Response
    #: True when the key was already completed and the function did not run.
    replayed: bool
    #: True when this run took over an orphaned claim.
    resumed: bool
    attempt: int
    fencing_token: int
    #: The wait, in whole seconds, the server applied to the claim that got
    #: this outcome (see ClaimResult.wait_applied); a front door answers it
    #: as Preference-Applied.
    wait_applied: int = 0
    #: On a replay, ClaimResult.replay_left of the claim that got it; 0 otherwise.
    replay_left: float = 0.0


@dataclass(frozen=True)
class KeyPage:
    """One page of records, newest first; next_cursor is "" on the last page."""

    items: list[Record]
    next_cursor: str = ""
