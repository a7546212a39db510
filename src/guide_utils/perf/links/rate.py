"""A link's rate and latency, measured with one TCP connection (what iperf and ping report).

``serve`` runs on one host, ``send`` on another: first ``pings`` one-byte round trips (the
median, halved, is the one-way latency of an idle link), then ``size`` bytes in one stream,
timed from the first byte sent to the receiver's acknowledgement that the last one arrived
(so the queue in the shaper counts: what arrives, not what left the sender's buffer).
``python -m guide_utils.perf.links.rate send|serve ...`` is how :mod:`guide_utils.perf.links.study`
starts them inside the namespaces; ``send`` prints one JSON line.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import time

CHUNK = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = conn.recv(min(CHUNK, n - len(buf)))
        if not part:
            raise ConnectionError(f"the peer closed after {len(buf)} of {n} bytes")
        buf += part
    return bytes(buf)


def serve(addr: str, port: int, timeout: float = 120.0) -> None:
    """Answer one ``send``: echo its pings, read its bytes, acknowledge them."""
    with socket.create_server((addr, port)) as server:
        server.settimeout(timeout)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pings, size = struct.unpack("!IQ", _recv_exact(conn, 12))
            for _ in range(pings):
                conn.sendall(_recv_exact(conn, 1))
            left = size
            while left:
                part = conn.recv(min(CHUNK, left))
                if not part:
                    raise ConnectionError("the sender closed early")
                left -= len(part)
            conn.sendall(b"k")


def _connect(addr: str, port: int, wait: float) -> socket.socket:
    deadline = time.monotonic() + wait
    while True:  # the server starts at the same moment in the other namespace
        try:
            return socket.create_connection((addr, port), timeout=wait)
        except (ConnectionRefusedError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def send(addr: str, port: int, size: int, pings: int = 50, wait: float = 20.0) -> dict:
    """Measure against ``serve`` at ``addr:port``: latency, then rate."""
    with _connect(addr, port, wait) as conn:
        conn.settimeout(300)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(struct.pack("!IQ", pings, size))
        rtts = []
        for _ in range(pings):
            t = time.perf_counter()
            conn.sendall(b"p")
            _recv_exact(conn, 1)
            rtts.append(time.perf_counter() - t)
        block = b"\0" * CHUNK
        start, left = time.perf_counter(), size
        while left:
            left -= conn.send(block[:min(CHUNK, left)])
        _recv_exact(conn, 1)
        seconds = time.perf_counter() - start
    rtt = statistics.median(rtts)
    return {"bytes": size, "seconds": seconds, "rate_Bps": size / seconds, "rate_Mbit": size * 8 / seconds / 1e6,
            "rtt_s": rtt, "latency_s": rtt / 2}


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["send"]:
        print(json.dumps(send(argv[1], int(argv[2]), int(argv[3]))), flush=True)
        return 0
    print("usage: python -m guide_utils.perf.links.rate serve ADDR PORT | send ADDR PORT BYTES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
