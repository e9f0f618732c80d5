#!/usr/bin/env python3
"""Times `LRANGE KEY 0 -1` of a list loaded by `huge_reply.sh` (N elements of W bytes each,
so the reply is exactly `*N\\r\\n` + N * (`$W\\r\\n` + W + `\\r\\n`) bytes), ROUNDS times on
one connection, and prints one line per round: `TAG ROUND SECONDS`, the time from the
request's write to the reply's last byte.

    huge_reply.py TAG PORT KEY N W ROUNDS

Loopback only. The reply is read into one preallocated buffer (`recv_into`, no parsing), so
the client costs one syscall per read; its first and last bytes are checked, and its bytes
must be the same in every round (a CRC32 is printed to stderr to compare across targets).
"""
import socket
import sys
import time
import zlib

tag, port, key, n, w, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
expect = len(f"*{n}\r\n") + n * (len(f"${w}\r\n") + w + 2)
req = f"*4\r\n$6\r\nLRANGE\r\n${len(key)}\r\n{key}\r\n$1\r\n0\r\n$2\r\n-1\r\n".encode()
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
buf = bytearray(expect)
view = memoryview(buf)
crc = None
for r in range(rounds):
    t0 = time.perf_counter()
    s.sendall(req)
    got = 0
    while got < expect:
        k = s.recv_into(view[got:], expect - got)
        if k == 0:
            sys.exit(f"{tag}: connection closed after {got} of {expect} bytes")
        got += k
    t1 = time.perf_counter()
    if not buf.startswith(f"*{n}\r\n".encode()) or not buf.endswith(b"\r\n"):
        sys.exit(f"{tag}: not the expected reply")
    c = zlib.crc32(buf)
    if crc is not None and c != crc:
        sys.exit(f"{tag}: reply differs between rounds")
    crc = c
    print(f"{tag} {r} {t1 - t0:.4f}", flush=True)
s.settimeout(0.2)
try:
    extra = s.recv(1)
    if extra:
        sys.exit(f"{tag}: bytes after the reply")
except socket.timeout:
    pass
print(f"{tag} crc32 {crc:08x} bytes {expect}", file=sys.stderr)
