"""A loopback TCP proxy that drops chosen answers: it forwards a request to
the target, lets the target handle it, and then closes the client's
connection instead of sending the answer back - the "done, reply lost"
case a retry must survive. It can also refuse chosen requests: close the
connection without forwarding them (the target unreachable for them)."""

from __future__ import annotations

import socket
import threading
from typing import Callable


class FaultProxy:
    """Proxies 127.0.0.1:<port> to target (host, port). drop(request_head)
    decides per HTTP request whether its answer is dropped; every
    connection carries one request (the proxy sends Connection: close)."""

    def __init__(self, target: tuple[str, int], drop: Callable[[bytes], bool],
                 refuse: Callable[[bytes], bool] | None = None) -> None:
        self.target = target
        self.drop = drop
        self.refuse = refuse
        self.refused = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head, body = _read_request(conn)
            if head is None:
                return
            # One request per connection: ask both sides to close.
            if self.refuse is not None and self.refuse(head):
                with self._lock:
                    self.refused += 1
                return  # closed before forwarding: the target never sees it
            lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
            head = b"\r\n".join(lines) + b"\r\nConnection: close"
            with socket.create_connection(self.target) as up:
                up.sendall(head + b"\r\n\r\n" + body)
                answer = b""
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            if self.drop(head):
                with self._lock:
                    self.dropped += 1
                return  # the target did the work; the answer is lost
            conn.sendall(answer)


def _read_request(conn: socket.socket) -> tuple[bytes | None, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head, rest


def first_answer_to(op: str) -> Callable[[bytes], bool]:
    """A drop rule: drop the answer to the first request whose request line
    names /<op> (e.g. "claim", "complete"), and no other."""
    needle = f"/{op} ".encode()
    left = [1]

    def drop(head: bytes) -> bool:
        if needle in head.split(b"\r\n", 1)[0] and left[0]:
            left[0] -= 1
            return True
        return False

    return drop
