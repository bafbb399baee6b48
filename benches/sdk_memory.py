"""One measured operation of the official SDK's SessionMemoryStores, for
benches/memory.rs: `python sdk_memory.py OP URL KEY SESSION_ID WORKDIR NONCE`.
OP is mount, noop_sync, steady_sync or flush. Prints one JSON line: wall and CPU time of
the operation, and the process's peak RSS.
"""

import asyncio
import json
import os
import resource
import sys
import time

import anthropic
from anthropic.lib.tools._memories import SessionMemoryStores

op, url, key, session_id, workdir, nonce = sys.argv[1:7]


async def main() -> None:
    client = anthropic.AsyncAnthropic(api_key=key, base_url=url)
    session = await client.beta.sessions.retrieve(session_id)
    stores = SessionMemoryStores(client, workdir=workdir, sync_interval=5.0)

    async def measured(coro):
        w, c = time.perf_counter(), time.process_time()
        await coro
        return (time.perf_counter() - w) * 1e3, (time.process_time() - c) * 1e3

    if op == "mount":
        wall, cpu = await measured(stores.download(session))
    else:
        await stores.download(session)
        if op in ("noop_sync", "steady_sync"):
            if op == "steady_sync":
                await asyncio.sleep(5.5)
                await stores._sync_all(final=False)
            wall, cpu = await measured(stores._sync_all(final=False))
        else:
            root = stores.roots[0]
            for dirpath, _dirs, files in os.walk(root):
                for name in files:
                    if name != ".anthropic-memory-store":
                        with open(os.path.join(dirpath, name), "a") as f:
                            f.write(f"\nedited {nonce}\n")
            wall, cpu = await measured(stores.flush_writes())
    await stores.dispose()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall_ms": wall, "cpu_ms": cpu, "peak_rss_kb": peak_kb}))


asyncio.run(main())
