"""Key validation and derivation, the same rules as every idem SDK."""

from __future__ import annotations

import hashlib

from ._errors import InvalidKeyError

#: The longest key the service accepts, in bytes.
MAX_KEY_BYTES = 255
_SUFFIX = ":sha256="


def key_problem(key: str) -> str | None:
    """Why key is not 1-255 bytes of 0x21-0x7E, the way the service checks
    it; None when it is. The client and the front door raise their own
    error with it."""
    raw = key.encode("utf-8", "surrogatepass")
    if not raw:
        return "the key is empty"
    if len(raw) > MAX_KEY_BYTES:
        return f"the key is {len(raw)} bytes long; at most {MAX_KEY_BYTES} are allowed"
    for i, c in enumerate(raw):
        if c < 0x21 or c > 0x7E:
            return f"byte {i} of the key (0x{c:02X}) is outside printable ASCII 0x21-0x7E"
    return None


def validate_key(key: str) -> None:
    """Raise InvalidKeyError unless key is 1-255 bytes of 0x21-0x7E, the
    way the service checks it."""
    problem = key_problem(key)
    if problem is not None:
        raise InvalidKeyError(problem)


def derive_key(*parts: str) -> str:
    """Build an idempotency key from the parts that identify one business
    intent: ``derive_key("order-confirm", order_id)`` gives
    "order-confirm:ord_42". Derive keys from the event being handled, never
    from a random value per attempt: a retry must send the same key.

    Parts are joined with ':'; inside a part ':', '%' and every byte outside
    printable ASCII are percent-encoded, so different part lists never give
    the same key. A result over 255 bytes becomes its first 183 bytes +
    ":sha256=" + the hex SHA-256 of the whole key. No part, or an empty part,
    raises InvalidKeyError (an empty order id is a bug that would merge
    intents)."""
    if not parts:
        raise InvalidKeyError("a key needs at least one part")
    encoded: list[str] = []
    for i, p in enumerate(parts):
        if p == "":
            raise InvalidKeyError(f"part {i} of the key is empty")
        out = []
        for c in p.encode("utf-8", "surrogatepass"):
            if c < 0x21 or c > 0x7E or c in (0x3A, 0x25):  # ':' and '%'
                out.append(f"%{c:02X}")
            else:
                out.append(chr(c))
        encoded.append("".join(out))
    key = ":".join(encoded)
    if len(key) > MAX_KEY_BYTES:
        digest = hashlib.sha256(key.encode("ascii")).hexdigest()
        key = key[: MAX_KEY_BYTES - len(_SUFFIX) - len(digest)] + _SUFFIX + digest
    return key
