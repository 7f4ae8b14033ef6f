#!/usr/bin/env python3
"""Runs the benchmark scenarios of issue 7 (and scenario 8, TLS to the
upstream, from issue 43) against reprise-sidecar and its peers (Envoy,
HAProxy, nginx, Traefik), with the direct (no proxy) figure alongside.
Started by run.sh, which installs the peers and builds the binaries first;
see README.md in this folder.

Everything listens on 127.0.0.1. Every proxy runs one worker thread pinned to
CPU PROXY_CPU; load generators and upstreams are pinned to CPU LOAD_CPU. Every
load run is bounded in time (and every subprocess has a timeout).
"""

import argparse
import datetime
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CONF = os.path.join(HERE, "configs")
CACHE = os.environ.get("REPRISE_BENCH_CACHE", os.path.expanduser("~/.cache/reprise-bench"))

PROXY_CPU = os.environ.get("PROXY_CPU", "0")
LOAD_CPU = os.environ.get("LOAD_CPU", "1")
# Everything the harness starts runs at this nice level (the same for every
# system), so unrelated work on the machine (a build) disturbs it less.
NICE = os.environ.get("BENCH_NICE", "-20")

# BENCH_PEERS=nginx,haproxy measures a subset of the peers (a shorter run).
PEERS = [p for p in os.environ.get("BENCH_PEERS", "envoy,haproxy,nginx,traefik").split(",") if p]
# REPRISE_BASELINE=/path/to/reprise-sidecar adds `reprise-base`, a second
# Reprise build run in the same rounds (same config, interleaved), so a change
# is measured before and after under the same conditions of the host;
# REPRISE_BASELINE_LABEL names it in the results (a commit, say).
BASELINE = os.environ.get("REPRISE_BASELINE")
PORTS = {
    "reprise": 17001,
    "reprise-base": 17041,
    "reprise+log": 17011,
    "envoy": 17002,
    "haproxy": 17003,
    "nginx": 17004,
    "traefik": 17005,
    # Scenario 1's reference ceiling, not a peer: see s1_passthrough.
    "bare-forwarder": 17021,
    # Scenario 7's reference ceiling (h2c only), not a peer: see s7_h2.
    "bare-forwarder-h2": 17022,
}
# Systems that speak only h2c to clients: readiness is a listening port.
H2C_ONLY = {"bare-forwarder-h2"}
# Direct (no proxy) addresses of each upstream pool, by Host.
DIRECT = {
    "bench": ["127.0.0.1:18080"],
    "flaky": ["127.0.0.1:18101", "127.0.0.1:18102", "127.0.0.1:18103"],
    "outage": ["127.0.0.1:18111", "127.0.0.1:18112", "127.0.0.1:18113"],
    "big": ["127.0.0.1:18121", "127.0.0.1:18122"],
    "h2": ["127.0.0.1:18082"],
    # Scenario 8: nginx over TLS (nginx-upstream-tls.conf); direct is https.
    "tls-ecdsa": ["127.0.0.1:18443"],
    "tls-rsa": ["127.0.0.1:18444"],
    "tls-ecdsa-close": ["127.0.0.1:18445"],
    "tls-rsa-close": ["127.0.0.1:18446"],
    "tls-slow": ["127.0.0.1:18447"],
}
# Scenario 8's variants: (Host, certificate, upstream connections).
TLS_VARIANTS = [
    ("tls-ecdsa", "ECDSA P-256", "keep-alive"),
    ("tls-rsa", "RSA-2048", "keep-alive"),
    ("tls-ecdsa-close", "ECDSA P-256", "a new connection per request"),
    ("tls-rsa-close", "RSA-2048", "a new connection per request"),
]
TLS_NAME = "upstream.bench"  # SNI and the name every proxy verifies
FLAKY_ADMIN = "127.0.0.1:18100"


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


class Proc:
    """A process this harness started; stopped by its own pid only."""

    def __init__(self, name, argv, cpu, env=None, cwd=None, stdout=None):
        self.name = name
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.logpath = os.path.join(RUN_DIR, f"{name.replace('+', '_')}.log")
        self.logf = open(self.logpath, "ab")
        out = self.logf if stdout is None else stdout
        self.p = subprocess.Popen(
            ["nice", "-n", NICE, "taskset", "-c", cpu] + argv,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=self.logf,
            start_new_session=True,
        )
        self.pid = self.p.pid  # nice and taskset exec the program: same pid

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.p.wait(timeout=8)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(timeout=5)
        self.logf.close()


def children_of():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def process_tree(pid):
    """pid and all its descendants (nginx: master + worker)."""
    kids = children_of()
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(kids.get(p, []))
    return tree


def rss_kib(pid, tree=None):
    """VmRSS of pid and all its descendants (or of `tree`, a process_tree
    taken earlier), KiB."""
    total = 0
    for p in tree or process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_seconds(pid):
    """(user, kernel) CPU seconds used so far by pid and all its descendants."""
    hz = os.sysconf("SC_CLK_TCK")
    user = kernel = 0.0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11]) / hz
            kernel += int(fields[12]) / hz
        except OSError:
            pass
    return user, kernel


def steal_ms(cpu):
    """Time the hypervisor has kept CPU `cpu` from running so far ("steal" in
    /proc/stat), in ms. 0 on bare metal."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                return int(line.split()[8]) * 1000 / os.sysconf("SC_CLK_TCK")
    return 0.0


def wakeup_ipis(cpu):
    """Rescheduling and function-call interrupts CPU `cpu` has taken so far
    (/proc/interrupts RES + CAL): how often another CPU had to wake it, here
    a sender waking a process that sleeps on an idle CPU."""
    n = 0
    with open("/proc/interrupts") as f:
        cpus = f.readline().split()
        col = cpus.index(f"CPU{cpu}") + 1
        for line in f:
            fields = line.split()
            if fields and fields[0] in ("RES:", "CAL:"):
                n += int(fields[col])
    return n


def idle_ms(cpu):
    """Time CPU `cpu` has been idle so far (/proc/stat), in ms."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                return int(line.split()[4]) * 1000 / os.sysconf("SC_CLK_TCK")
    return 0.0


def http_get(addr, host, path="/", timeout=2.0):
    req = urllib.request.Request(f"http://{addr}{path}", headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_ready(addr, host, proc, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.logpath}")
        if http_get(addr, host, timeout=1.0) == 200:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{addr} (Host {host}) not ready after {timeout}s")


def wait_listening(addr, proc, timeout=20.0):
    host, port = addr.rsplit(":", 1)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.logpath}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
            sk.settimeout(0.5)
            if sk.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{addr} not listening after {timeout}s")


def run(argv, timeout, cpu=LOAD_CPU, check=True):
    r = subprocess.run(
        ["nice", "-n", NICE, "taskset", "-c", cpu] + argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {r.returncode}: {r.stdout[-2000:]}")
    return r.stdout


class ForeignCpu:
    """CPU time used on this machine by processes the harness did not start,
    over a scenario, as a share of all CPUs: busy time from /proc/stat minus
    this process's, its waited-for children's and the live upstreams'."""

    def __init__(self, upstream_pids):
        self.pids = upstream_pids
        self.hz = os.sysconf("SC_CLK_TCK")

    def sample(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (v[0] + v[1] + v[2]) / self.hz  # user, nice, system
        total = sum(v[:8]) / self.hz
        t = os.times()
        ours = t.user + t.system + t.children_user + t.children_system
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ours += (int(fields[11]) + int(fields[12])) / self.hz
            except OSError:
                pass
        return busy, total, ours

    def __enter__(self):
        self.a = self.sample()
        return self

    def __exit__(self, *exc):
        b = self.sample()
        total = max(1e-9, b[1] - self.a[1])
        self.share = max(0.0, ((b[0] - self.a[0]) - (b[2] - self.a[2])) / total)


# ---------------------------------------------------------------- fleet


ALL_PORTS = sorted(
    set(PORTS.values()) | {p + 100 for p in (17001, 17011, 17002)}
    | {18080, 18081, 18082, 18100, 18101, 18102, 18103, 18111, 18112, 18113, 18121, 18122}
    | {18443, 18444, 18445, 18446, 18447})


def check_ports_free():
    """Fails fast when something already listens on a port the benchmark uses
    (a leftover instance would silently answer in place of ours)."""
    busy = []
    for port in ALL_PORTS:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
            sk.settimeout(0.2)
            if sk.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    if busy:
        sys.exit(f"ports already in use on 127.0.0.1: {busy}; stop whatever listens there "
                 f"(e.g. `ss -ltnp`) and run again")


def start_upstreams():
    ups = []
    ups.append(Proc("nginx-upstream", ["nginx", "-p", nginx_prefix("nginx-upstream"),
                                       "-e", "stderr", "-c", os.path.join(CONF, "nginx-upstream.conf")], LOAD_CPU))
    ups.append(Proc("haproxy-upstream-h2", ["haproxy", "-db", "-f", os.path.join(CONF, "haproxy-upstream-h2.cfg")], LOAD_CPU))
    listen = ",".join([
        "127.0.0.1:18101=0", "127.0.0.1:18102=0", "127.0.0.1:18103=50",
        "127.0.0.1:18111=100", "127.0.0.1:18112=100", "127.0.0.1:18113=100",
        "127.0.0.1:18121=0", "127.0.0.1:18122=0",
    ])
    ups.append(Proc("flaky", [os.path.join(CACHE, "bin", "flaky"), "-admin", FLAKY_ADMIN, "-listen", listen],
                    LOAD_CPU, env={"GOMAXPROCS": "1"}))
    wait_ready("127.0.0.1:18080", "bench", ups[0])
    wait_ready("127.0.0.1:18101", "flaky", ups[2])
    time.sleep(0.5)
    for u in ups:
        if not u.alive():
            raise RuntimeError(f"{u.name} exited; see {u.logpath}")
    return ups


def nginx_prefix(name):
    """nginx's prefix (pid file, temp dirs). Under /tmp, because nginx's workers
    run as nobody and could not enter a private home directory."""
    path = os.path.join(NGINX_TMP, name)
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o755)
    return path + "/"


def reprise_log_config():
    path = os.path.join(RUN_DIR, "reprise-log.yaml")
    with open(os.path.join(CONF, "reprise.yaml")) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("access_log: false", "access_log: true"))
    return path


def start_proxy(name, tls=False):
    """Starts `name` with its configuration in configs/, or with its
    scenario 8 configuration (the *-tls files, rendered) when tls."""
    port = PORTS[name]
    if name in ("reprise", "reprise+log", "reprise-base"):
        if tls:
            cfg = tls_config("reprise-tls.yaml")
        else:
            cfg = reprise_log_config() if name == "reprise+log" else os.path.join(CONF, "reprise.yaml")
        # Access log lines go to /dev/null: the cost measured is producing them.
        out = subprocess.DEVNULL if name == "reprise+log" else None
        binary = TOOLS["reprise-base"] if name == "reprise-base" else TOOLS["reprise"]
        p = Proc(name, [binary, "--config", cfg, "--listen", f"127.0.0.1:{port}",
                        "--admin", f"127.0.0.1:{port + 100}"], PROXY_CPU,
                 env={"TOKIO_WORKER_THREADS": "1", "REPRISE_LOG": "info"}, stdout=out)
    elif name == "envoy":
        cfg = tls_config("envoy-tls.yaml") if tls else os.path.join(CONF, "envoy.yaml")
        p = Proc(name, [TOOLS["envoy"], "-c", cfg, "--concurrency", "1",
                        "--disable-hot-restart", "-l", "error"], PROXY_CPU)
    elif name == "haproxy":
        cfg = tls_config("haproxy-tls.cfg") if tls else os.path.join(CONF, "haproxy.cfg")
        p = Proc(name, ["haproxy", "-db", "-f", cfg], PROXY_CPU)
    elif name == "nginx":
        cfg = tls_config("nginx-proxy-tls.conf") if tls else os.path.join(CONF, "nginx-proxy.conf")
        p = Proc(name, ["nginx", "-p", nginx_prefix("nginx-proxy"), "-e", "stderr", "-c", cfg], PROXY_CPU)
    elif name == "traefik":
        if tls:
            tls_config("traefik-tls-dynamic.yml")
            p = Proc(name, [TOOLS["traefik"], f"--configfile={tls_config('traefik-tls.yml')}"], PROXY_CPU,
                     cwd=RUN_DIR, env={"GOMAXPROCS": "1"})
        else:
            p = Proc(name, [TOOLS["traefik"], "--configfile=traefik.yml"], PROXY_CPU, cwd=CONF,
                     env={"GOMAXPROCS": "1"})
    elif name == "bare-forwarder":
        p = Proc(name, [TOOLS["bare-forwarder"], f"127.0.0.1:{port}", DIRECT["bench"][0]], PROXY_CPU)
    elif name == "bare-forwarder-h2":
        p = Proc(name, [TOOLS["bare-forwarder-h2"], f"127.0.0.1:{port}", DIRECT["h2"][0]], PROXY_CPU)
    else:
        raise ValueError(name)
    return p


class Fleet:
    def __init__(self, names, tls=False):
        self.names = list(names)
        self.procs = {}
        self.failed = set()
        # Scenario 8's configurations, ready when a request reaches the TLS upstream.
        self.tls = tls
        self.ready_host = "tls-ecdsa" if tls else "bench"

    def start(self):
        """Starts every proxy; one that does not come up is left out of the
        scenario (its cells show a dash) instead of ending the run."""
        self.failed = set()
        for n in self.names:
            self.procs[n] = start_proxy(n, self.tls)
        for n in self.names:
            try:
                if n in H2C_ONLY:
                    wait_listening(f"127.0.0.1:{PORTS[n]}", self.procs[n])
                else:
                    wait_ready(f"127.0.0.1:{PORTS[n]}", self.ready_host, self.procs[n])
            except RuntimeError as e:
                log(f"{n} did not start: {e}")
                self.failed.add(n)

    def stop(self):
        for p in self.procs.values():
            p.stop()
        self.procs = {}

    def pid(self, name):
        return self.procs[name].pid


# ---------------------------------------------------------------- load tools


def to_ms(s):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", s)
    v, u = float(m.group(1)), m.group(2)
    return v * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[u]


def wrk(addr, host, seconds, conns=50, scheme="http"):
    out = run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-H", f"Host: {host}",
               f"{scheme}://{addr}/"], timeout=seconds + 30)
    res = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
           "requests": int(re.search(r"(\d+) requests in", out).group(1))}
    for pct, key in (("50", "p50"), ("99", "p99")):
        res[key] = to_ms(re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errs = re.search(r"Socket errors: (.*)", out)
    res["errors"] = int(bad.group(1)) if bad else 0
    if errs:
        res["errors"] += sum(int(x) for x in re.findall(r"\d+", errs.group(1)))
    return res


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def h2load(addr, authority, seconds, clients, rps=None, streams=1, h1=True, skip_s=1.0, tag="h2load"):
    """Runs h2load for `seconds`; latencies (ms) from its per-request log, skipping
    the first skip_s seconds (warm-up). Returns a dict."""
    logfile = os.path.join(RUN_DIR, f"{tag}.tsv")
    if os.path.exists(logfile):
        os.remove(logfile)
    argv = ["h2load", "-t1", f"-c{clients}", f"-m{streams}", "-D", str(seconds), "-H", f":authority: {authority}",
            f"--log-file={logfile}", "-T", "10"]
    if h1:
        argv.append("--h1")
    if rps:
        argv.append(f"--rps={rps}")
    argv.append(f"http://{addr}/")
    out = run(argv, timeout=seconds + 40)
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    res = {
        "done": int(m.group(3)),
        "failed": int(m.group(5)) + int(m.group(6)) + int(m.group(7)),
        "2xx": int(codes.group(1)),
        "4xx": int(codes.group(3)),
        "5xx": int(codes.group(4)),
    }
    rows = []
    with open(logfile) as f:
        for line in f:
            parts = line.split("\t")
            if len(parts) >= 3:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    if rows:
        t0 = min(r[0] for r in rows)
        t1 = max(r[0] for r in rows)
        window = [r for r in rows if r[0] >= t0 + skip_s * 1e6]
        lat = sorted(r[2] / 1000.0 for r in window)
        span = max(1e-6, (t1 - (t0 + skip_s * 1e6)) / 1e6)
        res.update({
            "rps": len(window) / span,
            "p50": pct(lat, 50),
            "p99": pct(lat, 99),
            "p999": pct(lat, 99.9),
            "logged": len(rows),
        })
    return res


def oha(addr, host, seconds, rate, conns=50):
    """Open-loop fixed-rate load with oha: `rate` req/s spread evenly over time
    (one global schedule, not per connection), latency measured from each
    request's scheduled send time (--latency-correction: no coordinated omission)."""
    out = run([TOOLS["oha"], "--no-tui", "--output-format", "json", "--latency-correction", "-z", f"{seconds}s",
               "-q", str(rate), "-c", str(conns), "-H", f"Host: {host}", f"http://{addr}/"], timeout=seconds + 40)
    j = json.loads(out[out.index("{"):])
    lp = j["latencyPercentiles"]
    codes = j.get("statusCodeDistribution", {})
    ok = sum(v for k, v in codes.items() if k.startswith("2"))
    total = sum(codes.values())
    errors = sum(v for k, v in j.get("errorDistribution", {}).items() if "deadline" not in k)
    def ms(v):
        return float("nan") if v is None else v * 1000.0

    if ok == 0:
        log(f"oha {addr}: no successful response: {codes} {j.get('errorDistribution')}")
    return {
        "rps": j["summary"]["requestsPerSec"],
        "p50": ms(lp["p50"]),
        "p99": ms(lp["p99"]),
        "p999": ms(lp["p99.9"]),
        "errors": (total - ok) + errors,
    }


def warm_fixed_rate(addr, args):
    oha(addr, "bench", 1, args.rate)


def flaky_counts():
    with urllib.request.urlopen(f"http://{FLAKY_ADMIN}/counts", timeout=5) as r:
        return json.loads(r.read())


def flaky_reset():
    with urllib.request.urlopen(urllib.request.Request(f"http://{FLAKY_ADMIN}/reset", method="POST"), timeout=5) as r:
        r.read()


# ---------------------------------------------------------------- scenarios


def interleave(systems, rounds, fn, label, skip=()):
    """Runs fn(system, round) for every round, systems rotated each round. A
    system in skip, or whose run raises, gets an empty result for that round."""
    results = {s: [] for s in systems}
    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for s in order:
            if s in skip:
                results[s].append({})
                continue
            try:
                res = fn(s, r)
            except (RuntimeError, subprocess.TimeoutExpired, OSError, AttributeError, ValueError) as e:
                log(f"{label} round {r + 1}/{rounds} {s}: FAILED: {e}")
                res = {}
            log(f"{label} round {r + 1}/{rounds} {s}: {fmt_res(res)}")
            results[s].append(res)
    return results


def fmt_res(res):
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items())


def addr_of(system, pool="bench"):
    return DIRECT[pool][0] if system == "direct" else f"127.0.0.1:{PORTS[system]}"


def s1_passthrough(args, systems):
    """wrk through each system, with the proxy's CPU time per request split into
    user and kernel. `bare-forwarder` (e2e/src/bin/bench-bare-forwarder.rs) is
    a reference, not a peer: it makes the same socket calls per request as a
    keep-alive proxy and does nothing else, so its req/s is the most any proxy
    can reach on this CPU split (CPU 1 also runs wrk and the upstream)."""
    fleet = Fleet([s for s in systems if s != "direct"])
    fleet.start()
    try:
        for s in systems:  # warm-up: connection pools, allocators
            if s not in fleet.failed:
                wrk(addr_of(s), "bench", 1)

        def one(s, r):
            if s == "direct":
                return wrk(addr_of(s), "bench", args.s1_seconds, args.s1_conns)
            u0, k0, st0 = *cpu_seconds(fleet.pid(s)), steal_ms(PROXY_CPU)
            ipi0, idle0 = wakeup_ipis(LOAD_CPU), idle_ms(LOAD_CPU)
            res = wrk(addr_of(s), "bench", args.s1_seconds, args.s1_conns)
            u1, k1 = cpu_seconds(fleet.pid(s))
            res["steal_ms"] = steal_ms(PROXY_CPU) - st0
            res["load_idle_pct"] = (idle_ms(LOAD_CPU) - idle0) / (10 * args.s1_seconds)
            n = res["rps"] * args.s1_seconds
            if n > 0:
                res["user_us"] = (u1 - u0) / n * 1e6
                res["kernel_us"] = (k1 - k0) / n * 1e6
                res["load_ipis"] = (wakeup_ipis(LOAD_CPU) - ipi0) / n * 1000
            return res

        return interleave(systems, args.rounds, one, "s1 pass-through", fleet.failed)
    finally:
        fleet.stop()


def s2_fixed_rate(args, systems):
    fleet = Fleet([s for s in systems if s != "direct"])
    fleet.start()
    try:
        for s in systems:
            if s not in fleet.failed:
                warm_fixed_rate(addr_of(s), args)

        def one(s, r):
            before = steal_ms(PROXY_CPU)
            res = oha(addr_of(s), "bench", args.s2_seconds, args.rate)
            res["steal_ms"] = steal_ms(PROXY_CPU) - before
            return res

        res = interleave(systems, args.rounds, one, "s2 fixed rate", fleet.failed)
    finally:
        fleet.stop()
    # Added latency over direct, per round, then the median over rounds.
    for s in systems:
        for r, row in enumerate(res[s]):
            d = res["direct"][r]
            for k in ("p50", "p99", "p999"):
                if k in row and k in d:
                    row[f"add_{k}"] = row[k] - d[k]
    return res


def retry_scenario(args, systems, pool, label):
    fleet = Fleet([s for s in systems if s != "direct"])
    fleet.start()
    clients, per_client = 12, max(1, args.retry_rate // 12)
    ports = [a.rsplit(":", 1)[1] for a in DIRECT[pool]]

    def one(s, r):
        flaky_reset()
        if s == "direct":
            # No proxy: the client spreads its requests evenly over the endpoints, no retries.
            outs = []
            threads = []
            for i, a in enumerate(DIRECT[pool]):
                def go(a=a, i=i):
                    outs.append(h2load(a, pool, args.retry_seconds, clients // len(DIRECT[pool]), rps=per_client,
                                       skip_s=0, tag=f"{pool}-direct-{i}"))
                t = threading.Thread(target=go)
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            out = {k: sum(o[k] for o in outs) for k in ("done", "2xx", "5xx", "failed")}
            out["p99"] = max(o.get("p99", 0) for o in outs)
        else:
            out = h2load(addr_of(s), pool, args.retry_seconds, clients, rps=per_client, skip_s=0, tag=f"{pool}-{s}")
        time.sleep(0.3)  # let cancelled/backed-off attempts land before counting
        counts = flaky_counts()
        attempts = sum(v for k, v in counts.items() if k.rsplit(":", 1)[1] in ports)
        done = max(1, out["done"])
        return {
            "success": 100.0 * out["2xx"] / done,
            "attempts": attempts / done,
            "requests": out["done"],
            "p99": out.get("p99", float("nan")),
            "upstream": attempts,
        }

    try:
        return interleave(systems, args.rounds, one, label, fleet.failed)
    finally:
        fleet.stop()


def s3_flaky(args, systems):
    return retry_scenario(args, systems, "flaky", "s3 flaky pool")


def s4_outage(args, systems):
    return retry_scenario(args, systems, "outage", "s4 outage")


def big_file(nbytes):
    path = os.path.join(CACHE, f"upload-{nbytes}.bin")
    if not os.path.exists(path) or os.path.getsize(path) != nbytes:
        with open(path, "wb") as f:
            f.truncate(nbytes)  # sparse: reads as zeros, costs no disk
    return path


class RssSampler:
    def __init__(self, pid):
        self.pid = pid
        self.peak = 0
        # The proxy's processes, listed once: a process_tree scans all of
        # /proc (about 1 ms of CPU with the fleet up), which every 20 ms took
        # 5% of a CPU from the transfer being measured.
        self.tree = process_tree(pid)
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop_ev.is_set():
            self.peak = max(self.peak, rss_kib(self.pid, self.tree))
            time.sleep(0.02)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.t.join()
        self.peak = max(self.peak, rss_kib(self.pid))


def curl(argv, timeout):
    """Returns (status, bytes up, bytes down, seconds); a failed transfer
    (curl exits non-zero) comes back with status 0."""
    out = run(["curl", "-sS", "-o", "/dev/null", "--max-time", str(timeout),
               "-w", "\n%{http_code} %{size_upload} %{size_download} %{time_total}"] + argv,
              timeout=timeout + 10, check=False)
    last = out.strip().splitlines()[-1].split()
    try:
        code, up, down, t = int(last[0]), int(last[1]), int(last[2]), float(last[3])
    except (IndexError, ValueError):
        return 0, 0, 0, 0.0
    if "curl: (" in out:
        log(f"curl: {out.strip().splitlines()[0]}")
        code = 0
    return code, up, down, t


def s5_large(args, systems):
    fleet = Fleet([s for s in systems if s != "direct"])
    fleet.start()
    nbytes = args.big_mib << 20
    path = big_file(nbytes)
    tmo = 600
    # Growth is measured against each proxy's RSS right after it started (and
    # answered its readiness request), so memory kept from an earlier round's
    # transfer still counts in later rounds.
    fresh = {s: rss_kib(fleet.pid(s)) for s in systems if s != "direct" and s not in fleet.failed}

    def one(s, r):
        addr = addr_of(s, "big")
        pid = None if s == "direct" else fleet.pid(s)
        res = {}
        for kind in ("up", "down"):
            base = fresh[s] if pid else 0
            sampler = RssSampler(pid) if pid else None
            if sampler:
                sampler.__enter__()
            try:
                if kind == "up":
                    code, up, _, t = curl(["-T", path, "-H", "Host: big", "-H", "Expect:", f"http://{addr}/upload"], tmo)
                    ok = code == 200 and up == nbytes
                else:
                    code, _, down, t = curl(["-H", "Host: big", f"http://{addr}/big?bytes={nbytes}"], tmo)
                    ok = code == 200 and down == nbytes
            finally:
                if sampler:
                    sampler.__exit__(None, None, None)
            res[f"{kind}_mibs"] = (nbytes / (1 << 20)) / t if ok else 0.0
            res[f"{kind}_ok"] = ok
            res[f"{kind}_rss_growth"] = (sampler.peak - base) / 1024.0 if sampler else float("nan")
        return res

    try:
        return interleave(systems, args.rounds, one, "s5 large bodies", fleet.failed)
    finally:
        fleet.stop()


def s6_memory(args, systems):
    proxies = [s for s in systems if s != "direct"]
    results = {s: [] for s in proxies}
    for r in range(args.rounds):
        fleet = Fleet(proxies)
        fleet.start()  # fresh processes every round
        try:
            for s in proxies:
                for _ in range(10):
                    http_get(addr_of(s), "bench")
            time.sleep(2)
            order = proxies[r % len(proxies):] + proxies[:r % len(proxies)]
            for s in order:
                if s in fleet.failed:
                    results[s].append({})
                    continue
                pid = fleet.pid(s)
                idle = rss_kib(pid) / 1024.0
                p = subprocess.Popen(["nice", "-n", NICE, "taskset", "-c", LOAD_CPU, os.path.join(CACHE, "bin", "conns"),
                                      "-addr", addr_of(s), "-host", "bench", "-n", str(args.conns), "-hold", "60s"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                try:
                    line = p.stdout.readline()
                    m = re.match(r"ready (\d+) failed (\d+)", line)
                    opened = int(m.group(1)) if m else 0
                    time.sleep(1.0)
                    loaded = rss_kib(pid) / 1024.0
                finally:
                    p.stdin.close()
                    try:
                        p.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                res = {"idle_mib": idle, "conns_mib": loaded, "opened": opened}
                log(f"s6 memory round {r + 1}/{args.rounds} {s}: {fmt_res(res)}")
                results[s].append(res)
                time.sleep(1.0)
        finally:
            fleet.stop()
    return results


def s7_h2(args, systems):
    """h2load over h2c through each system to HAProxy answering over h2c.
    `bare-forwarder-h2` (e2e/src/bin/bench-bare-forwarder-h2.rs) is a
    reference, not a peer: it copies each stream onto one upstream HTTP/2
    connection with the h2 crate the sidecar uses, and does nothing else, so
    its req/s is about the most a proxy built on that crate reaches here."""
    systems = [s for s in systems if s != "nginx"]  # nginx cannot speak HTTP/2 to upstreams
    fleet = Fleet([s for s in systems if s != "direct"])
    fleet.start()
    try:
        probe = {s: http_get(addr_of(s), "h2nginx") for s in systems if s != "direct" and s not in H2C_ONLY}
        for s in systems:
            if s not in fleet.failed:
                h2load(addr_of(s, "h2"), "h2", 1, args.h2_clients, streams=args.h2_streams, h1=False, skip_s=0)

        def one(s, r):
            out = h2load(addr_of(s, "h2"), "h2", args.h2_seconds, args.h2_clients, streams=args.h2_streams,
                         h1=False, skip_s=1.0, tag=f"s7-{s}")
            out["ok_pct"] = 100.0 * out["2xx"] / max(1, out["done"])
            return out

        res = interleave(systems, args.rounds, one, "s7 h2", fleet.failed)
        for s in systems:
            for row in res[s]:
                row["nginx_h2c_probe"] = probe.get(s)
        return res
    finally:
        fleet.stop()


# ---------------------------------------------------------------- scenario 8: TLS


def tls_dir():
    return os.path.join(RUN_DIR, "tls")


def openssl(argv):
    subprocess.run(["openssl"] + argv, check=True, timeout=60, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_tls_material():
    """Certificates for scenario 8, made afresh with the openssl CLI in
    RUN_DIR/tls: a CA per key type (ECDSA P-256, RSA-2048), a certificate for
    upstream.bench from each (ecdsa.pem/.key, rsa.pem/.key; the key type of its
    CA), and ca.pem, both CAs, which every proxy trusts."""
    d = tls_dir()
    os.makedirs(d, exist_ok=True)
    ext = os.path.join(d, "leaf.ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{TLS_NAME}\n")
    bundle = []
    for serial, (kind, newkey) in enumerate((("ecdsa", ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]),
                                             ("rsa", ["-newkey", "rsa:2048"])), start=1):
        f = {x: os.path.join(d, f"{kind}{x}") for x in ("-ca.pem", "-ca.key", ".pem", ".key", ".csr")}
        openssl(["req", "-x509", *newkey, "-nodes", "-keyout", f["-ca.key"], "-out", f["-ca.pem"], "-days", "7",
                 "-subj", f"/CN=reprise-bench {kind} CA", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        openssl(["req", *newkey, "-nodes", "-keyout", f[".key"], "-out", f[".csr"], "-subj", f"/CN={TLS_NAME}"])
        openssl(["x509", "-req", "-in", f[".csr"], "-CA", f["-ca.pem"], "-CAkey", f["-ca.key"],
                 "-set_serial", str(serial), "-days", "7", "-sha256", "-extfile", ext, "-out", f[".pem"]])
        with open(f["-ca.pem"]) as ca:
            bundle.append(ca.read())
    with open(os.path.join(d, "ca.pem"), "w") as f:
        f.write("".join(bundle))


def tls_config(name):
    """configs/NAME with @TLS_DIR@ and @RUN_DIR@ filled in, written to RUN_DIR."""
    with open(os.path.join(CONF, name)) as f:
        text = f.read()
    path = os.path.join(RUN_DIR, name)
    with open(path, "w") as f:
        f.write(text.replace("@TLS_DIR@", tls_dir()).replace("@RUN_DIR@", RUN_DIR))
    return path


def handshake_log():
    return os.path.join(tls_dir(), "handshakes.log")


def handshakes_since(offset, port):
    """(full, resumed) TLS handshakes the upstream logged on `port` after byte
    `offset` of its log: one line per connection's first request, with
    nginx's $ssl_session_reused (r = resumed, . = full)."""
    full = resumed = 0
    with open(handshake_log()) as f:
        f.seek(offset)
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == str(port):
                if parts[1] == "r":
                    resumed += 1
                else:
                    full += 1
    return full, resumed


def log_size():
    try:
        return os.path.getsize(handshake_log())
    except OSError:
        return 0


def upstream_conns(pid, port):
    """Established TCP connections from pid's processes to 127.0.0.1:port
    (their sockets' inodes matched in /proc/net/tcp)."""
    inodes = set()
    for p in process_tree(pid):
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    link = os.readlink(f"/proc/{p}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                n += 1
    return n


def s8_tls(args, systems):
    """Plain HTTP/1.1 keep-alive from wrk to each proxy, TLS from the proxy
    to nginx (nginx-upstream-tls.conf) with verification on, four variants:
    ECDSA P-256 or RSA-2048 certificate, keep-alive upstream or one that
    closes after every answer. Direct is wrk speaking TLS to nginx itself.
    Handshakes are counted by the upstream (its log of each connection's
    first request); then the memory table (s8_memory)."""
    make_tls_material()
    if os.path.exists(handshake_log()):
        os.remove(handshake_log())
    up = Proc("nginx-upstream-tls", ["nginx", "-p", nginx_prefix("nginx-upstream-tls"), "-e", "stderr",
                                     "-c", tls_config("nginx-upstream-tls.conf")], LOAD_CPU)
    results = {}
    try:
        for a in DIRECT["tls-ecdsa"] + DIRECT["tls-rsa"] + DIRECT["tls-ecdsa-close"] + DIRECT["tls-rsa-close"]:
            wait_listening(a, up)
        fleet = Fleet([s for s in systems if s != "direct"], tls=True)
        fleet.start()
        try:
            for host, _, _ in TLS_VARIANTS:
                port = int(DIRECT[host][0].rsplit(":", 1)[1])
                for s in systems:  # warm-up: pools, session caches
                    if s not in fleet.failed:
                        wrk(addr_of(s, host), host, 1, args.tls_conns, "https" if s == "direct" else "http")

                def one(s, r, host=host, port=port):
                    mark = log_size()
                    if s == "direct":
                        res = wrk(addr_of(s, host), host, args.tls_seconds, args.tls_conns, "https")
                    else:
                        u0, k0 = cpu_seconds(fleet.pid(s))
                        res = wrk(addr_of(s, host), host, args.tls_seconds, args.tls_conns)
                        u1, k1 = cpu_seconds(fleet.pid(s))
                    time.sleep(0.3)  # the last answers' log lines
                    full, resumed = handshakes_since(mark, port)
                    n = res["requests"]
                    if n > 0:
                        if s != "direct":
                            res["user_us"] = (u1 - u0) / n * 1e6
                            res["kernel_us"] = (k1 - k0) / n * 1e6
                            res["cpu_us"] = res["user_us"] + res["kernel_us"]
                        res["full_hs"] = full / n * 1000
                        res["resumed_hs"] = resumed / n * 1000
                    return res

                results[host] = interleave(systems, args.rounds, one, f"s8 {host}", fleet.failed)
        finally:
            fleet.stop()
        results["tls-memory"] = s8_memory(args, [s for s in systems if s != "direct"])
        return results
    finally:
        up.stop()


def s8_memory(args, proxies):
    """As scenario 6, over TLS: fresh processes each round; then args.conns
    client connections whose requests are all in flight at once (conns
    -parallel) to an upstream that trickles each answer over about 3 s, so
    each proxy opens about as many upstream TLS connections; RSS once every
    answer is in and those connections sit idle in the proxy's pool."""
    port = int(DIRECT["tls-slow"][0].rsplit(":", 1)[1])
    results = {s: [] for s in proxies}
    for r in range(args.rounds):
        fleet = Fleet(proxies, tls=True)
        fleet.start()  # fresh processes every round
        try:
            for s in proxies:
                for _ in range(10):
                    http_get(addr_of(s), "tls-ecdsa")
            time.sleep(2)
            order = proxies[r % len(proxies):] + proxies[:r % len(proxies)]
            for s in order:
                if s in fleet.failed:
                    results[s].append({})
                    continue
                pid = fleet.pid(s)
                idle = rss_kib(pid) / 1024.0
                p = subprocess.Popen(["nice", "-n", NICE, "taskset", "-c", LOAD_CPU, os.path.join(CACHE, "bin", "conns"),
                                      "-addr", addr_of(s), "-host", "tls-slow", "-n", str(args.conns),
                                      "-parallel", str(args.conns), "-hold", "60s"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                try:
                    line = p.stdout.readline()
                    m = re.match(r"ready (\d+) failed (\d+)", line)
                    opened = int(m.group(1)) if m else 0
                    time.sleep(1.0)
                    loaded = rss_kib(pid) / 1024.0
                    pooled = upstream_conns(pid, port)
                finally:
                    p.stdin.close()
                    try:
                        p.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                res = {"idle_mib": idle, "conns_mib": loaded, "opened": opened, "upstream": pooled}
                log(f"s8 memory round {r + 1}/{args.rounds} {s}: {fmt_res(res)}")
                results[s].append(res)
                time.sleep(1.0)
        finally:
            fleet.stop()
    return results


# ---------------------------------------------------------------- report


def med(rows, key):
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
    return statistics.median(vals) if vals else float("nan")


def fmt(v, digits):
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    if isinstance(v, float) and abs(v) >= 1000 and digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def rounds_as_good(res, s, peer, key, hib):
    """"; k/n": in k of the n rounds both have, s did at least as well as
    peer in the same round (rounds are interleaved, so a pair shares the
    host's state). A median ratio near 1.00 says little on its own; the
    count says whether one system was ahead round after round."""
    pairs = [(a.get(key), b.get(key)) for a, b in zip(res[s], res[peer])]
    pairs = [(a, b) for a, b in pairs
             if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == a and b == b]
    if not pairs or s == peer:
        return ""
    k = sum(1 for a, b in pairs if (a >= b if hib else a <= b))
    return f"; {k}/{len(pairs)}"


def table(res, metrics, ratio_keys, note=""):
    """metrics: [(key, label, digits, higher_is_better)]."""
    systems = list(res.keys())
    medians = {s: {k: med(res[s], k) for k, *_ in metrics} for s in systems}
    peers = [s for s in systems if s in PEERS]
    best = {}
    for key, _, _, hib in metrics:
        vals = [(medians[s][key], s) for s in peers if medians[s][key] == medians[s][key]]
        if vals:
            best[key] = (max if hib else min)(vals)
    head = ["system"]
    for key, label, _, _ in metrics:
        head.append(label)
        if key in ratio_keys:
            head += [f"{label} ÷ best peer", f"{label} ÷ direct"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in systems:
        cells = [f"**{s}**" if s.startswith("reprise") else s]
        for key, label, digits, hib in metrics:
            v = medians[s][key]
            cells.append(fmt(v, digits))
            if key in ratio_keys:
                b = best.get(key)
                d = medians.get("direct", {}).get(key)
                k = rounds_as_good(res, s, b[1], key, hib) if b and s != "direct" else ""
                cells.append(f"{v / b[0]:.2f}× ({b[1]}{k})" if b and b[0] and v == v else "—")
                cells.append(f"{v / d:.2f}×" if d and d == d and v == v else "—")
        lines.append("| " + " | ".join(cells) + " |")
    if note:
        lines.append("")
        lines.append(note)
    return "\n".join(lines), medians


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 5)))
    ap.add_argument("--scenarios", default=os.environ.get("SCENARIOS", "6,1,2,3,4,5,7"))
    ap.add_argument("--s1-seconds", type=int, default=5)
    ap.add_argument("--s1-conns", type=int, default=50)
    ap.add_argument("--rate", type=int, default=int(os.environ.get("RATE", 2000)))
    ap.add_argument("--s2-seconds", type=int, default=6)
    ap.add_argument("--retry-rate", type=int, default=960)
    ap.add_argument("--retry-seconds", type=int, default=4)
    ap.add_argument("--big-mib", type=int, default=int(os.environ.get("BIG_MIB", 1024)))
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--h2-clients", type=int, default=4)
    ap.add_argument("--h2-streams", type=int, default=64)
    ap.add_argument("--h2-seconds", type=int, default=5)
    ap.add_argument("--tls-seconds", type=int, default=5)
    ap.add_argument("--tls-conns", type=int, default=50)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("rounds must be >= 1")

    global RUN_DIR, TOOLS, NGINX_TMP
    RUN_DIR = os.path.join(CACHE, "run")
    os.makedirs(RUN_DIR, exist_ok=True)
    NGINX_TMP = "/tmp/reprise-bench-nginx"
    os.makedirs(NGINX_TMP, exist_ok=True)
    os.chmod(NGINX_TMP, 0o755)
    TOOLS = {
        "reprise": os.path.join(CACHE, "target", "release", "reprise-sidecar"),
        "reprise-base": BASELINE,
        "envoy": os.environ["ENVOY_BIN"],
        "traefik": os.path.join(CACHE, "venv", "bin", "traefik"),
        "oha": os.path.join(CACHE, "oha", "bin", "oha"),
        "bare-forwarder": os.path.join(CACHE, "target", "release", "bench-bare-forwarder"),
        "bare-forwarder-h2": os.path.join(CACHE, "target", "release", "bench-bare-forwarder-h2"),
    }
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    t_start = time.time()
    base = ["direct", "reprise"] + (["reprise-base"] if BASELINE else []) + PEERS
    scen = [s.strip() for s in args.scenarios.split(",") if s.strip()]

    def version(argv, pattern):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            m = re.search(pattern, out.stdout + out.stderr)
            return m.group(1) if m else "?"
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    versions = {
        "reprise": git_rev(),
        **({"reprise-base": os.environ.get("REPRISE_BASELINE_LABEL", BASELINE)} if BASELINE else {}),
        "envoy": version([TOOLS["envoy"], "--version"], r"/(\d+\.\d+\.\d+)/"),
        "haproxy": version(["haproxy", "-v"], r"version (\S+)"),
        "nginx": version(["nginx", "-v"], r"nginx/(\S+)"),
        "traefik": version([TOOLS["traefik"], "version"], r"Version:\s+(\S+)"),
        "wrk": version(["wrk", "-v"], r"wrk (\S+)"),
        "h2load": version(["h2load", "--version"], r"nghttp2/(\S+)"),
        "oha": version([TOOLS["oha"], "--version"], r"oha (\S+)"),
    }
    log(f"versions: {versions}")

    # Stop cleanly (every process started here, by pid) on Ctrl-C or SIGTERM,
    # also when started in the background (where SIGINT may be ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    check_ports_free()
    ups = start_upstreams()
    raw, sections, medians_all = {}, [], {}
    try:
        for sc in scen:
            t0 = time.time()
            foreign = ForeignCpu([u.pid for u in ups])
            foreign.__enter__()
            if sc == "1":
                res = s1_passthrough(args, base + ["reprise+log", "bare-forwarder"])
                md, m = table(res, [("rps", "req/s", 0, True), ("p50", "p50 ms", 3, False),
                                    ("p99", "p99 ms", 3, False), ("errors", "errors", 0, False),
                                    ("user_us", "user CPU µs/req", 1, False),
                                    ("kernel_us", "kernel CPU µs/req", 1, False),
                                    ("load_ipis", f"wake-ups of CPU {LOAD_CPU} per 1,000 req", 0, False),
                                    ("load_idle_pct", f"CPU {LOAD_CPU} idle %", 1, False),
                                    ("steal_ms", f"CPU {PROXY_CPU} steal ms", 0, False)], {"rps", "p99"},
                              f"wrk, 1 thread, {args.s1_conns} keep-alive connections, {args.s1_seconds} s per round, "
                              f"128-byte body from nginx. `reprise+log` is Reprise with its default per-request access "
                              f"log on (to /dev/null); every other proxy has access logs off. CPU µs/req: the proxy's "
                              f"processes' user and kernel time over the round (/proc/PID/stat) ÷ requests served; the "
                              f"kernel share includes the loopback TCP receive work its sends trigger, and the "
                              f"interrupts that wake CPU {LOAD_CPU} when wrk and the upstream sleep there: its "
                              f"rescheduling and function-call interrupts per 1,000 requests (/proc/interrupts) and "
                              f"its idle share show which side of the split waits. A proxy that keeps CPU {LOAD_CPU} "
                              f"waiting pays for waking it, about 0.75 µs a wake-up here (`e2e/bench/wakecost.c`), a "
                              f"small part of its kernel time (`e2e/bench/results/2026-12-05-issue18-remaining.md`).\n\n"
                              f"`bare-forwarder` is a reference ceiling, not a peer "
                              f"(e2e/src/bin/bench-bare-forwarder.rs): it copies each request and response between a "
                              f"client connection and its own upstream connection, with no routing, header handling, "
                              f"retries, pool, logs or metrics. It makes the same socket calls per request as a "
                              f"keep-alive proxy, so its req/s is about the most any proxy reaches on this CPU split "
                              f"(wrk and the upstream share CPU {LOAD_CPU}).")
                title = "1. Pass-through, HTTP/1.1 keep-alive, small body"
            elif sc == "2":
                res = s2_fixed_rate(args, base + ["reprise+log"])
                md, m = table(res, [("rps", "achieved req/s", 0, True), ("p50", "p50 ms", 3, False),
                                    ("p99", "p99 ms", 3, False), ("p999", "p99.9 ms", 3, False),
                                    ("add_p50", "added p50 ms", 3, False), ("add_p99", "added p99 ms", 3, False),
                                    ("add_p999", "added p99.9 ms", 3, False), ("errors", "errors", 0, False),
                                    ("steal_ms", f"CPU {PROXY_CPU} steal ms", 0, False)],
                              {"add_p99"},
                              f"oha, open loop: {args.rate} req/s evenly spaced over 50 keep-alive connections, "
                              f"{args.s2_seconds} s per round, latency from each request's scheduled send time "
                              f"(--latency-correction). Added = proxy percentile − direct percentile of the same "
                              f"round, median over rounds. Steal = time the hypervisor kept CPU {PROXY_CPU} (the proxies') from running during "
                              f"the round (/proc/stat), as a sign of how busy the host was.")
                title = f"2. Fixed rate {args.rate} req/s: latency added over direct"
            elif sc == "3":
                res = s3_flaky(args, base)
                md, m = table(res, [("success", "client success %", 3, True), ("attempts", "upstream attempts / request", 3, False),
                                    ("requests", "client requests", 0, True), ("p99", "p99 ms", 2, False)],
                              {"success", "attempts"},
                              f"Three endpoints, one answers 503 to 50% of requests. h2load --h1, 12 connections, "
                              f"{args.retry_rate} req/s in all, {args.retry_seconds} s per round. Attempts counted by the upstreams.")
                title = "3. Flaky pool (one of three endpoints fails half its requests with 503)"
            elif sc == "4":
                res = s4_outage(args, base)
                md, m = table(res, [("attempts", "upstream attempts / request", 3, False),
                                    ("success", "client success %", 1, True), ("requests", "client requests", 0, True),
                                    ("p99", "p99 ms", 2, False)], {"attempts"},
                              f"All three endpoints answer 503. Same load as scenario 3. Retry budget 10% where the "
                              f"proxy has one (Reprise: rolling 10 s window; Envoy: concurrent retries ≤ 10% of active "
                              f"requests, min 3); HAProxy, nginx and Traefik have none.")
                title = "4. Full outage: retry amplification"
            elif sc == "5":
                res = s5_large(args, base)
                md, m = table(res, [("up_mibs", "upload MiB/s", 0, True), ("down_mibs", "download MiB/s", 0, True),
                                    ("up_rss_growth", "RSS growth upload MiB", 1, False),
                                    ("down_rss_growth", "RSS growth download MiB", 1, False)],
                              {"up_mibs", "down_mibs"},
                              f"One {args.big_mib} MiB PUT upload and one {args.big_mib} MiB GET download per round with curl; "
                              f"retries on, body far over the 16 KiB replay cap. RSS growth = peak RSS during the transfer "
                              f"(sampled every 20 ms, all processes of the proxy) − the proxy's RSS when freshly started "
                              f"for this scenario. 0 MiB/s = transfer failed. Direct uploads share CPU 1 between curl and "
                              f"the receiving server, so they can be slower than through a proxy.")
                title = f"5. Large bodies ({args.big_mib} MiB) with retries on"
            elif sc == "6":
                res = s6_memory(args, base)
                md, m = table(res, [("idle_mib", "RSS idle MiB", 1, False), ("conns_mib", f"RSS with {args.conns} conns MiB", 1, False),
                                    ("opened", "connections open", 0, True)], {"idle_mib", "conns_mib"},
                              f"Fresh process each round, after 10 requests; then {args.conns} keep-alive client "
                              f"connections, each having made one request, held open. RSS of all the proxy's processes "
                              f"(nginx: master + worker).")
                title = "6. Memory"
            elif sc == "7":
                res = s7_h2(args, base + ["bare-forwarder-h2"])
                probe = {s: res[s][0].get("nginx_h2c_probe") for s in res if s != "direct" and s not in H2C_ONLY}
                md, m = table(res, [("rps", "req/s", 0, True), ("p50", "p50 ms", 3, False), ("p99", "p99 ms", 3, False),
                                    ("ok_pct", "2xx %", 2, True)], {"rps", "p99"},
                              f"h2load, h2c prior knowledge, {args.h2_clients} connections × {args.h2_streams} concurrent "
                              f"streams, {args.h2_seconds} s per round; proxy → upstream h2c (HAProxy answering from memory). "
                              f"nginx is n/a: it cannot speak HTTP/2 to upstreams.\n\n"
                              f"`bare-forwarder-h2` is a reference ceiling, not a peer "
                              f"(e2e/src/bin/bench-bare-forwarder-h2.rs): it copies each stream onto one upstream "
                              f"HTTP/2 connection with the h2 crate the sidecar is built on, with no routing, header "
                              f"handling, retries, timeouts, logs or metrics; its req/s is about the most a proxy on "
                              f"that crate reaches on this CPU split.\n\n"
                              f"Probe, one request to nginx's h2c listener through each proxy (status): "
                              + ", ".join(f"{k}: {v}" for k, v in probe.items()))
                title = f"7. HTTP/2 (h2c) to the upstream, {args.h2_clients}×{args.h2_streams} concurrent streams"
            elif sc == "8":
                res = s8_tls(args, base)
                parts, m = [], {}
                for host, cert, conns in TLS_VARIANTS:
                    mdv, m[host] = table(res[host], [("rps", "req/s", 0, True), ("p99", "p99 ms", 3, False),
                                                     ("errors", "errors", 0, False),
                                                     ("user_us", "user CPU µs/req", 1, False),
                                                     ("kernel_us", "kernel CPU µs/req", 1, False),
                                                     ("cpu_us", "CPU µs/req", 1, False),
                                                     ("full_hs", "full handshakes / 1,000 req", 1, False),
                                                     ("resumed_hs", "resumed handshakes / 1,000 req", 1, False)],
                                         {"rps", "cpu_us"})
                    parts.append(f"### {cert} certificate, {conns} upstream (Host `{host}`)\n\n{mdv}")
                mdm, m["tls-memory"] = table(res["tls-memory"], [
                    ("idle_mib", "RSS idle MiB", 1, False),
                    ("conns_mib", f"RSS with {args.conns:,} client conns MiB", 1, False),
                    ("opened", "client requests answered", 0, True),
                    ("upstream", "upstream TLS conns pooled", 0, False)], {"conns_mib"})
                parts.append(f"### Memory with {args.conns:,} pooled upstream TLS connections (ECDSA P-256)\n\n{mdm}")
                md = "\n\n".join(parts) + (
                    f"\n\nClient → proxy plain HTTP/1.1 keep-alive: wrk, 1 thread, {args.tls_conns} connections, "
                    f"{args.tls_seconds} s per round. Proxy → upstream over TLS with verification on (the run's CAs, "
                    f"SNI and name `{TLS_NAME}`): nginx on CPU {LOAD_CPU} (configs/nginx-upstream-tls.conf), TLS 1.3 "
                    f"only, session cache and tickets on, the 128-byte body of scenario 1. `direct` is wrk speaking "
                    f"TLS to nginx itself. \"A new connection per request\": the upstream closes after every "
                    f"answer (`keepalive_requests 1`, `Connection: close`), the same for every proxy and "
                    f"independent of their pool settings, so each request pays a TCP connect and a handshake, "
                    f"resumed when the proxy keeps a session; nginx's handshake work shares CPU {LOAD_CPU} with wrk, "
                    f"so there req/s also follows how much work the proxy's handshakes give the upstream (a full "
                    f"RSA-2048 handshake costs it a signature). CPU µs/req: the proxy's user + kernel time "
                    f"(/proc/PID/stat) ÷ requests, as in scenario 1, TLS included. Handshakes: counted by the "
                    f"upstream, one log line per connection's first request with `$ssl_session_reused`, during "
                    f"the measured run only (after a 1 s warm-up), ÷ requests × 1,000.\n\n"
                    f"Memory: fresh processes each round, 10 requests; then {args.conns:,} client connections "
                    f"(`conns -parallel {args.conns}`) whose requests are all in flight at once to an upstream that "
                    f"trickles each answer over about 3 s (`limit_rate`), so each proxy opens up to {args.conns:,} "
                    f"upstream TLS connections; RSS of all the proxy's processes 1 s after the last answer, with "
                    f"the client connections held open and the upstream ones idle in the proxy's pool (counted "
                    f"from the proxy's sockets in /proc/net/tcp). Idle upstream pools are capped at 1,024 where "
                    f"the proxy has a cap (nginx `keepalive`, Traefik `maxIdleConnsPerHost`); HAProxy's "
                    f"`http-reuse safe` opens a connection for every client connection's first request.")
                title = "8. TLS to the upstream (HTTPS endpoint on loopback)"
            else:
                log(f"unknown scenario {sc}, skipped")
                continue
            foreign.__exit__(None, None, None)
            raw[sc] = res
            medians_all[sc] = m
            secs = time.time() - t0
            sections.append(f"## {title}\n\n{md}\n\n_{secs:.0f} s; CPU used by other processes on the machine "
                            f"meanwhile: {100 * foreign.share:.0f}% of both CPUs_\n")
            log(f"scenario {sc} done in {secs:.0f} s; foreign CPU {100 * foreign.share:.0f}%")
            print(f"\n## {title}\n\n{md}\n", flush=True)
    finally:
        for u in ups:
            u.stop()

    targets = check_targets(medians_all)
    total = time.time() - t_start
    header = (f"# Reprise benchmark, {stamp}\n\n"
              f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), {mem_gib():.0f} GiB. Proxies pinned to CPU {PROXY_CPU} "
              f"with one worker each (Reprise TOKIO_WORKER_THREADS=1, Envoy --concurrency 1, HAProxy nbthread 1, "
              f"nginx worker_processes 1, Traefik GOMAXPROCS=1); load generators and upstreams pinned to CPU {LOAD_CPU}. "
              f"{args.rounds} rounds interleaved across systems; medians shown. "
              f"\"÷ best peer\" divides by the best of Envoy, HAProxy, nginx and Traefik (named in brackets, with "
              f"k/n: the rounds, of n, in which the system did at least as well as that peer in the same round); "
              f"\"÷ direct\" by the no-proxy figure.\n\n"
              f"Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f". Total run time {total / 60:.1f} min.\n")
    doc = header + "\n" + "\n".join(sections) + "\n" + targets
    os.makedirs(args.out, exist_ok=True)
    stamp, f = claim_results(args.out, stamp)
    path = f.name
    with f:
        f.write(doc)
    with open(os.path.join(args.out, f"{stamp}.json"), "w") as f:
        json.dump({"versions": versions, "args": vars(args), "rounds": raw}, f, indent=1, default=str)
    print("\n" + targets)
    log(f"results: {path}")


def claim_results(out, stamp):
    """The results' name and its .md opened for writing: `stamp` (the minute
    the run started), or `stamp-2`, `-3`... when a run started in the same
    minute already wrote it, so no run overwrites another's files."""
    for n in range(1, 100):
        name = stamp if n == 1 else f"{stamp}-{n}"
        try:
            return name, open(os.path.join(out, f"{name}.md"), "x")
        except FileExistsError:
            continue
    raise RuntimeError(f"no free results name for {stamp} in {out}")


def check_targets(m):
    lines = ["## Issue 7 targets (Reprise, medians of this run)", "", "| target | measured | met |", "|---|---|---|"]

    def row(name, val, ok):
        lines.append(f"| {name} | {val} | {'yes' if ok else '**no**'} |")

    def g(sc, s, k):
        return m.get(sc, {}).get(s, {}).get(k, float("nan"))

    if "1" in m:
        best = max(g("1", p, "rps") for p in PEERS)
        r = g("1", "reprise", "rps")
        row("pass-through req/s ≥ 1.1 × best peer", f"{r:,.0f} vs {best:,.0f} ({r / best:.2f}×)", r >= 1.1 * best)
        c = g("1", "bare-forwarder", "rps")
        if c == c:
            lines.append(f"| (reference) pass-through ceiling: bare forwarder ÷ best peer | {c:,.0f} vs {best:,.0f} "
                         f"({c / best:.2f}×) | {'1.1× reachable' if c >= 1.1 * best else '**1.1× out of reach here**'} |")
    if "2" in m:
        r, e = g("2", "reprise", "add_p99"), g("2", "envoy", "add_p99")
        row("added p99 at fixed rate ≤ 0.7 × Envoy's", f"{r:.3f} ms vs {e:.3f} ms",
            e == e and r <= 0.7 * e)
    if "6" in m:
        row("RSS idle ≤ 10 MB", f"{g('6', 'reprise', 'idle_mib'):.1f} MiB", g("6", "reprise", "idle_mib") * 1.048576 <= 10)
        row("RSS with 1,000 connections ≤ 40 MB", f"{g('6', 'reprise', 'conns_mib'):.1f} MiB",
            g("6", "reprise", "conns_mib") * 1.048576 <= 40)
    if "5" in m:
        gr = max(g("5", "reprise", "up_rss_growth"), g("5", "reprise", "down_rss_growth"))
        row("RSS growth for a large stream ≤ 8 MB", f"{gr:.1f} MiB", gr * 1.048576 <= 8)
    if "3" in m:
        sr = g("3", "reprise", "success")
        row("flaky pool success ≥ 99.9%", f"{sr:.3f}%", sr >= 99.9)
    if "4" in m:
        a = g("4", "reprise", "attempts")
        # A 10% budget of all traffic (retries are requests too) allows
        # 1 / (1 - 0.10) = 1.111 upstream requests per client request.
        row("outage amplification ≤ 1.112", f"{a:.3f}", round(a, 3) <= 1.112)
    if "7" in m and g("7", "haproxy", "rps") > 0:
        r, h = g("7", "reprise", "rps"), g("7", "haproxy", "rps")
        row("h2c upstream req/s ≥ 1.0 × HAProxy's (issue 18)", f"{r:,.0f} vs {h:,.0f} ({r / h:.2f}×)", r >= h)
        c = g("7", "bare-forwarder-h2", "rps")
        if c > 0:
            lines.append(f"| (reference) h2c ceiling on the h2 crate: bare forwarder ÷ HAProxy | {c:,.0f} vs {h:,.0f} "
                         f"({c / h:.2f}×); Reprise ÷ bare {r / c:.2f}× | — |")
    return "\n".join(lines) + "\n"


def git_rev():
    def git(*a):
        return subprocess.run(["git", "-C", HERE] + list(a), capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        rev = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "../../sidecar", "../../crds", "../../Cargo.lock")
        return rev + ("+uncommitted-changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def mem_gib():
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / (1 << 20)


RUN_DIR = None
NGINX_TMP = None
TOOLS = {}

if __name__ == "__main__":
    main()
