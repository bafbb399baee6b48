"""Serve devserver work with the official SDK's EnvironmentWorker, in the
webhook-dispatch shape the docs give: drain the queue with the SDK's poller
(non-blocking, reclaim_older_than_ms=2000, drain=True, auto_stop=False) and
hand each item to `EnvironmentWorker.handle_item`.

Environment: ENVWORKER_URL, ENVWORKER_ENVIRONMENT_ID, ENVWORKER_ENVIRONMENT_KEY,
ENVWORKER_WORKDIR; optional SDK_WORKER_ITEMS (items to serve, default 1),
SDK_WORKER_TIMEOUT (seconds, default 120), SDK_MAX_IDLE (default 1),
SDK_SYNC_INTERVAL (default 5), SDK_FLUSH_TIMEOUT (the bound of the final
sync and of the flush, seconds; default the SDK's own, 30).

SIGTERM and SIGINT cancel the task serving the item, as the SDK tells an
embedding program to do (it installs no handlers of its own); the script then
exits 0 after printing "cancelled by SIGTERM".
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import anthropic
from anthropic.lib.environments import _worker

logging.basicConfig(
    level=logging.INFO,
    stream=sys.stderr,
    format="%(asctime)s %(name)s %(levelname)s %(message)s",
)
logging.getLogger("httpx").setLevel(logging.WARNING)

URL = os.environ["ENVWORKER_URL"]
ENV = os.environ["ENVWORKER_ENVIRONMENT_ID"]
KEY = os.environ["ENVWORKER_ENVIRONMENT_KEY"]
WORKDIR = os.environ["ENVWORKER_WORKDIR"]
ITEMS = int(os.environ.get("SDK_WORKER_ITEMS", "1"))
if "SDK_FLUSH_TIMEOUT" in os.environ:
    # The worker reads the module's constant at each teardown.
    _worker.MEMORY_FLUSH_TIMEOUT = float(os.environ["SDK_FLUSH_TIMEOUT"])
TIMEOUT = float(os.environ.get("SDK_WORKER_TIMEOUT", "120"))


async def main() -> int:
    client = anthropic.AsyncAnthropic(api_key="not-used-by-the-worker", base_url=URL, max_retries=2)
    worker = client.beta.environments.work.worker(
        environment_key=KEY,
        workdir=WORKDIR,
        max_idle=float(os.environ.get("SDK_MAX_IDLE", "1")),
        memory_sync_interval=float(os.environ.get("SDK_SYNC_INTERVAL", "5")),
    )
    handled = 0
    deadline = time.monotonic() + TIMEOUT
    while handled < ITEMS:
        if time.monotonic() > deadline:
            print(f"timed out after serving {handled} of {ITEMS} work items")
            return 1
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
            handled += 1
            print(f"served {work.id} for {work.data.id}", flush=True)
        await asyncio.sleep(0.2)
    return 0


async def serve_until_signalled() -> int:
    task = asyncio.ensure_future(main())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        print("cancelled by SIGTERM", flush=True)
        return 0


sys.exit(asyncio.run(serve_until_signalled()))
