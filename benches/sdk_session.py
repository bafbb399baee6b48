"""The official SDK's worker (anthropic==2.10.0) as benches/session.rs runs it.

    python sdk_session.py webhook   # a webhook receiver: GET /readyz, POST /webhooks/default
    python sdk_session.py poll      # the SDK's always-on poller: EnvironmentWorker.run()

`webhook` is the webhook-dispatch shape the SDK documents, built the way a
user would build it on the SDK alone: the client and the EnvironmentWorker
are made once at start; a delivery is verified with
`client.beta.webhooks.unwrap`, answered 202 at once, and then the queue is
drained in the background (`poller(block_ms=None, reclaim_older_than_ms=2000,
drain=True, auto_stop=False)`, each item given to `worker.handle_item`),
which is what `envworker serve` does on the same delivery.

Environment: ENVWORKER_URL, ENVWORKER_ENVIRONMENT_ID, ENVWORKER_ENVIRONMENT_KEY,
ENVWORKER_WORKDIR; SDK_MAX_IDLE and SDK_SYNC_INTERVAL (seconds); for
`webhook` also WEBHOOK_SECRET (whsec_…) and LISTEN_PORT.

Prints `imported` once `import anthropic` is done and, in `webhook` mode,
`listening` once the server accepts connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import anthropic

print("imported", flush=True)

logging.basicConfig(
    level=logging.INFO,
    stream=sys.stderr,
    format="%(asctime)s %(name)s %(levelname)s %(message)s",
)
logging.getLogger("httpx").setLevel(logging.WARNING)

MODE = sys.argv[1]
URL = os.environ["ENVWORKER_URL"]
ENV = os.environ["ENVWORKER_ENVIRONMENT_ID"]
KEY = os.environ["ENVWORKER_ENVIRONMENT_KEY"]
WORKDIR = os.environ["ENVWORKER_WORKDIR"]


async def webhook(client: anthropic.AsyncAnthropic, worker) -> None:
    secret = os.environ["WEBHOOK_SECRET"]
    wake = asyncio.Event()

    async def drainer() -> None:
        while True:
            await wake.wait()
            wake.clear()
            try:
                async for work in client.beta.environments.work.poller(
                    environment_id=ENV,
                    environment_key=KEY,
                    block_ms=None,
                    reclaim_older_than_ms=2000,
                    drain=True,
                    auto_stop=False,
                ):
                    await worker.handle_item(
                        work_id=work.id,
                        environment_id=ENV,
                        session_id=work.data.id,
                        environment_key=KEY,
                        work_secret=work.secret,
                    )
                    print(f"served {work.id}", flush=True)
            except Exception:  # keep serving later deliveries
                logging.exception("drain failed")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path in ("/readyz", "/healthz"):
                status, out = 200, b'{"status":"ready"}'
            elif method == "POST" and path == "/webhooks/default":
                try:
                    event = client.beta.webhooks.unwrap(body.decode(), headers=headers, key=secret)
                except Exception:
                    status, out = 401, b'{"status":"unauthorized"}'
                else:
                    if event.data.type == "session.status_run_started":
                        wake.set()
                        status, out = 202, b'{"status":"accepted"}'
                    else:
                        status, out = 200, b'{"status":"ignored"}'
            else:
                status, out = 404, b'{"status":"not found"}'
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(out)}\r\nconnection: close\r\n\r\n".encode()
                + out
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", int(os.environ["LISTEN_PORT"]))
    task = asyncio.create_task(drainer())
    print("listening", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), task)


async def main() -> None:
    client = anthropic.AsyncAnthropic(api_key="not-used-by-the-worker", base_url=URL, max_retries=2)
    worker = client.beta.environments.work.worker(
        environment_id=ENV,
        environment_key=KEY,
        workdir=WORKDIR,
        max_idle=float(os.environ.get("SDK_MAX_IDLE", "1")),
        memory_sync_interval=float(os.environ.get("SDK_SYNC_INTERVAL", "5")),
    )
    if MODE == "poll":
        await worker.run()
    elif MODE == "webhook":
        await webhook(client, worker)
    else:
        sys.exit(f"unknown mode {MODE!r}")


asyncio.run(main())
