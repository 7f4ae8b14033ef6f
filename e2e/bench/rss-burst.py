#!/usr/bin/env python3
"""RSS of the sidecar before, during and after a burst of slow uploads.

    python3 e2e/bench/rss-burst.py SIDECAR [N]

Starts SIDECAR standalone in front of a loopback upstream (asyncio, reads
each body and answers 200), sends N (default 1,000) concurrent uploads of
1 MiB in 64 KiB pieces 50 ms apart, then prints the process's RSS at
idle, at its peak, and 1, 5, 15 and 30 s after the burst. What the
allocator keeps after a burst shows in the last lines. Everything on
loopback; bounded by N and the fixed waits. Needs `ulimit -n` above 2 N.
"""
import asyncio
import signal
import subprocess
import sys

SIDECAR = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
UPSTREAM, LISTEN, ADMIN = 18500, 18600, 18601
CONFIG = "/tmp/reprise-rss-burst.yaml"


async def upstream(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


async def upload():
    reader, writer = await asyncio.open_connection("127.0.0.1", LISTEN)
    writer.write(b"POST / HTTP/1.1\r\nHost: up\r\nContent-Length: 1048576\r\n\r\n")
    piece = b"x" * 65536
    for _ in range(16):
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.05)
    await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(2)
    writer.close()


async def main():
    with open(CONFIG, "w") as f:
        f.write(
            "upstreams:\n  - name: up\n"
            f"    endpoints: [{{ address: 127.0.0.1, port: {UPSTREAM} }}]\n"
            "proxy:\n  access_log: false\n"
        )
    server = await asyncio.start_server(upstream, "127.0.0.1", UPSTREAM, backlog=4096)
    proc = subprocess.Popen(
        [SIDECAR, "--config", CONFIG, "--listen", f"127.0.0.1:{LISTEN}",
         "--admin", f"127.0.0.1:{ADMIN}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(1)
        print(f"idle        {rss_mib(proc.pid):6.1f} MiB")
        peak = 0.0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, rss_mib(proc.pid))
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(upload() for _ in range(N)))
        watcher.cancel()
        print(f"peak        {peak:6.1f} MiB ({N} uploads)")
        waited = 0
        for at in (1, 5, 15, 30):
            await asyncio.sleep(at - waited)
            waited = at
            print(f"after {at:2} s  {rss_mib(proc.pid):6.1f} MiB")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        server.close()


asyncio.run(main())
