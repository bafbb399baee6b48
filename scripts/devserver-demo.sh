#!/usr/bin/env bash
# Quick start: build envworker, start its local control plane (the devserver)
# on a free port, and walk through the memory stores API with curl: a store,
# memories, listings, an update guarded by content_sha256, a stale update
# refused with 409, and the version history. Stops the devserver on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet
ADMIN_KEY=demo-admin-key
LOG=$(mktemp)
./target/debug/envworker devserver --listen 127.0.0.1:0 --admin-key "$ADMIN_KEY" >"$LOG" 2>/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 100); do grep -q listening "$LOG" && break; sleep 0.1; done
URL=$(grep -o 'http://[0-9.:]*' "$LOG")
echo "devserver at $URL"

api() { # api METHOD PATH [JSON]
  curl -sS -X "$1" "$URL$2" \
    -H "x-api-key: $ADMIN_KEY" -H "anthropic-version: 2023-06-01" \
    -H "anthropic-beta: agent-memory-2026-07-22" -H "content-type: application/json" \
    ${3:+-d "$3"}
}
step() { printf '\n== %s\n' "$1"; }

step "create a memory store"
STORE=$(api POST /v1/memory_stores '{"name":"User Preferences","description":"How the user likes answers"}')
echo "$STORE" | jq .
SID=$(echo "$STORE" | jq -r .id)

step "create two memories"
MEM=$(api POST "/v1/memory_stores/$SID/memories" '{"path":"/style.md","content":"Prefer short answers.\n"}')
echo "$MEM" | jq '{id, path, content_sha256, content_size_bytes}'
api POST "/v1/memory_stores/$SID/memories" '{"path":"/projects/envworker.md","content":"Rust, axum, SQLite.\n"}' | jq '{id, path}'
MID=$(echo "$MEM" | jq -r .id)
SHA=$(echo "$MEM" | jq -r .content_sha256)

step "list the store (basic view: hashes, no content) and one level deep"
api GET "/v1/memory_stores/$SID/memories" | jq '.data[] | {path, content, content_sha256}'
api GET "/v1/memory_stores/$SID/memories?depth=1" | jq -c '.data[] | {type, path}'

step "update guarded by the hash we read"
api POST "/v1/memory_stores/$SID/memories/$MID?view=full" \
  "{\"content\":\"Be brief.\\n\",\"precondition\":{\"type\":\"content_sha256\",\"content_sha256\":\"$SHA\"}}" | jq '{path, content}'

step "the same update again, with the now stale hash: 409, nothing changes"
api POST "/v1/memory_stores/$SID/memories/$MID" \
  "{\"content\":\"Be verbose.\\n\",\"precondition\":{\"type\":\"content_sha256\",\"content_sha256\":\"$SHA\"}}" | jq .

step "the memory's history, newest first"
api GET "/v1/memory_stores/$SID/memory_versions?memory_id=$MID&view=full" | jq -c '.data[] | {operation, content, created_by}'
