"""The lab's Python client: an app that knows nothing of proxies. Prints one
JSON line.

    probe.py http HOST PORT PATH HOSTHEADER COUNT
        COUNT GETs, each on a new http.client connection, with Host:
        HOSTHEADER: {"responses": [{"status", "body"}, ...]}
    probe.py https HOST PORT PATH HOSTHEADER COUNT CAFILE SNI
        As http, but the app starts TLS itself on each connection, trusting
        CAFILE and verifying SNI: each response also has "tls", the
        protocol version negotiated.
    probe.py tcp HOST PORT DATA
        Connects, sends DATA, shuts down its write side and reads until the
        peer closes: {"reply", "connect_ms"}; an empty DATA sends nothing and
        does not shut down.
    probe.py get URL
        One GET with urllib, proxies off (the sidecar's admin endpoint):
        {"status", "body"}.

A failure is {"error": NAME, "errno": N, "ms": time until it}.
"""
import http.client
import json
import socket
import ssl
import sys
import time
import urllib.request

TIMEOUT = 10


def fail(e, start):
    return {
        "error": type(e).__name__,
        "errno": getattr(e, "errno", None),
        "detail": str(e),
        "ms": (time.monotonic() - start) * 1000,
    }


def http_get(host, port, path, host_header, count, tls=None):
    responses = []
    for _ in range(count):
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        version = None
        if tls is not None:
            context, sni = tls
            raw = socket.create_connection((host, port), timeout=TIMEOUT)
            conn.sock = context.wrap_socket(raw, server_hostname=sni)
            version = conn.sock.version()
        conn.request("GET", path, headers={"Host": host_header})
        r = conn.getresponse()
        body = r.read().decode(errors="replace")
        try:
            body = json.loads(body)
        except ValueError:
            pass
        response = {"status": r.status, "body": body}
        if version is not None:
            response["tls"] = version
        responses.append(response)
        conn.close()
    return {"responses": responses}


def tcp(host, port, data):
    start = time.monotonic()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.connect((host, port))
    except OSError as e:
        return fail(e, start)
    connect_ms = (time.monotonic() - start) * 1000
    if data:
        s.sendall(data.encode())
        s.shutdown(socket.SHUT_WR)
    chunks = []
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    s.close()
    return {"reply": b"".join(chunks).decode(errors="replace"), "connect_ms": connect_ms}


def get(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=TIMEOUT) as r:
        return {"status": r.status, "body": r.read().decode(errors="replace")}


def main(argv):
    start = time.monotonic()
    try:
        if argv[0] == "http":
            return http_get(argv[1], int(argv[2]), argv[3], argv[4], int(argv[5]))
        if argv[0] == "https":
            context = ssl.create_default_context(cafile=argv[6])
            tls = (context, argv[7])
            return http_get(argv[1], int(argv[2]), argv[3], argv[4], int(argv[5]), tls)
        if argv[0] == "tcp":
            return tcp(argv[1], int(argv[2]), argv[3])
        if argv[0] == "get":
            return get(argv[1])
    except OSError as e:
        return fail(e, start)
    raise SystemExit(f"unknown command {argv[0]!r}")


print(json.dumps(main(sys.argv[1:])), flush=True)
