#!/usr/bin/env bash
# Sign a Lambda envelope (events/lambda/*.json) afresh, so it can be invoked:
#
#   events/sign-envelope.sh KEY SAMPLE ENVELOPE > /tmp/event.json
#   sam local invoke -e /tmp/event.json            # or: cargo lambda invoke --data-file /tmp/event.json
#
# KEY is the endpoint's signing key (whsec_…), or `-` to take it from
# ANTHROPIC_WEBHOOK_SIGNING_KEY (keeps it off the command line). SAMPLE is the
# webhook body (events/webhooks/*.json), ENVELOPE the Lambda event to fill.
#
# The envelope is printed with the SAMPLE's exact bytes as its body, fresh
# webhook-id / webhook-timestamp / webhook-signature headers from
# `envworker webhook sign` (valid for five minutes), and its request time set
# to now. Nothing else changes; the files given are not modified.
#
# envworker is found as $ENVWORKER, else on PATH, else the newer of target/{release,debug}/envworker.
# Needs bash and python3 only.
set -euo pipefail

if [ "$#" -ne 3 ]; then
    echo "usage: $0 KEY|- SAMPLE ENVELOPE > signed-envelope.json" >&2
    exit 2
fi
key=$1 sample=$2 envelope=$3
for f in "$sample" "$envelope"; do
    [ -r "$f" ] || { echo "$0: cannot read $f" >&2; exit 2; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
envworker=${ENVWORKER:-}
if [ -z "$envworker" ]; then
    if command -v envworker >/dev/null 2>&1; then
        envworker=envworker
    else
        # The most recently built of the two.
        for candidate in "$root/target/release/envworker" "$root/target/debug/envworker"; do
            if [ -x "$candidate" ] && { [ -z "$envworker" ] || [ "$candidate" -nt "$envworker" ]; }; then
                envworker=$candidate
            fi
        done
    fi
fi
if [ -z "$envworker" ]; then
    echo "$0: envworker not found: set ENVWORKER, put it on PATH, or run cargo build" >&2
    exit 2
fi

if [ "$key" = "-" ]; then
    : "${ANTHROPIC_WEBHOOK_SIGNING_KEY:?KEY is - but ANTHROPIC_WEBHOOK_SIGNING_KEY is not set}"
    signed=$("$envworker" webhook sign "$sample")
else
    signed=$("$envworker" webhook sign --key "$key" "$sample")
fi

SIGNED_HEADERS=$signed python3 - "$sample" "$envelope" <<'PY'
import base64, json, os, sys, time

sample_path, envelope_path = sys.argv[1], sys.argv[2]
headers = {}
for line in os.environ["SIGNED_HEADERS"].splitlines():
    name, sep, value = line.partition(": ")
    if sep and name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        headers[name] = value
missing = {"webhook-id", "webhook-timestamp", "webhook-signature"} - headers.keys()
if missing:
    sys.exit("envworker webhook sign printed no " + ", ".join(sorted(missing)))

with open(sample_path, "rb") as f:
    body = f.read()
with open(envelope_path, encoding="utf-8") as f:
    envelope = json.load(f)

def put(table, name, value, multi=False):
    """Set header `name` (any case already there is replaced)."""
    if not isinstance(table, dict):
        return
    for existing in [k for k in table if k.lower() == name and k != name]:
        del table[existing]
    table[name] = [value] if multi else value  # keeps its place when already there

if not isinstance(envelope.get("headers"), dict):
    envelope["headers"] = {}
for name, value in headers.items():
    put(envelope["headers"], name, value)
    put(envelope.get("multiValueHeaders"), name, value, multi=True)
for table, multi in ((envelope["headers"], False), (envelope.get("multiValueHeaders"), True)):
    if isinstance(table, dict) and any(k.lower() == "content-length" for k in table):
        put(table, "content-length", str(len(body)), multi)

try:
    envelope["body"] = body.decode("utf-8")
    envelope["isBase64Encoded"] = False
except UnicodeDecodeError:
    envelope["body"] = base64.b64encode(body).decode("ascii")
    envelope["isBase64Encoded"] = True

now = time.time()
context = envelope.get("requestContext")
if isinstance(context, dict):
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now))
    if "timeEpoch" in context:          # Function URL / HTTP API (v2)
        context["timeEpoch"] = int(now * 1000)
        context["time"] = stamp
    if "requestTimeEpoch" in context:   # REST API (v1)
        context["requestTimeEpoch"] = int(now * 1000)
        context["requestTime"] = stamp

json.dump(envelope, sys.stdout, indent=2, ensure_ascii=False)
sys.stdout.write("\n")
PY
