#!/usr/bin/env python3
"""Cold start of `envworker serve`: spawn -> GET /readyz 200 against a devserver
(started from the first binary), and the process's CPU time.

usage: scripts/coldstart.py RUNS LABEL=BIN[:otel] ...
  e.g. scripts/coldstart.py 400 before=/tmp/envworker-main after=target/release/envworker \
           traced=target/release/envworker:otel
Runs are interleaved across the binaries; `:otel` sets OTEL_EXPORTER_OTLP_ENDPOINT to a
socket that accepts and never answers (traces on). Prints median, p10, p25, p90."""
import base64, json, os, socket, subprocess, sys, tempfile, time, urllib.request

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def readyz(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
    except OSError:
        return False
    try:
        s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False
    finally:
        s.close()

runs = int(sys.argv[1])
variants = []
for a in sys.argv[2:]:
    label, spec = a.split("=", 1)
    bin_, _, otel = spec.partition(":")
    variants.append((label, bin_, otel == "otel"))
dev = subprocess.Popen([variants[0][1], "devserver", "--listen", "127.0.0.1:0", "--admin-key", "k"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
url = dev.stdout.readline().split()[-1]
req = urllib.request.Request(url + "/dev/environments", data=b"{}", method="POST",
                             headers={"x-api-key": "k", "content-type": "application/json"})
env = json.load(urllib.request.urlopen(req))
secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
work = tempfile.mkdtemp()
sink = socket.socket(); sink.bind(("127.0.0.1", 0)); sink.listen(64)  # OTLP endpoint nobody answers
times = {v[0]: [] for v in variants}
cpu = {}
for i in range(runs):
    for label, bin_, otel in variants:
        port = free_port()
        e = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        e.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_ENVIRONMENT_ID=env["environment_id"],
                 ANTHROPIC_ENVIRONMENT_KEY=env["environment_key"],
                 ANTHROPIC_WEBHOOK_SIGNING_KEY=secret, ENVWORKER_WORKDIR=work, RUST_LOG="warn")
        if otel:
            e["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:%d" % sink.getsockname()[1]
        t0 = time.perf_counter()
        p = subprocess.Popen([bin_, "serve", "--listen", "127.0.0.1:%d" % port, "--queue-check-interval", "off"],
                             env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not readyz(port):
            time.sleep(0.0002)
        times[label].append((time.perf_counter() - t0) * 1e3)
        p.kill(); _, _, ru = os.wait4(p.pid, 0); p.returncode = -9
        cpu.setdefault(label, []).append((ru.ru_utime + ru.ru_stime) * 1e3)
dev.kill()
for label, xs in times.items():
    xs.sort(); n = len(xs)
    c = sorted(cpu[label])
    print(f"{label:>12}: spawn->readyz median {xs[n//2]:6.2f} ms  p10 {xs[n//10]:6.2f}  p25 {xs[n//4]:6.2f}  p90 {xs[(9*n)//10]:6.2f}  | cpu median {c[n//2]:5.2f} ms  (n={n})")
