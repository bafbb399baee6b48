"""Call the official SDK's file tools (`agent_toolset_20260401`) directly.

Run by tests/it/tools_symlinks.rs with AGENT_TOOLS_REQUEST naming a JSON file:
{"workdir": ..., "allowed_roots": [...], "read_only_roots": [...],
 "calls": [[tool, input], ...]}. Prints one JSON list on stdout, one entry per
call in order: {"ok": true|false, "text": ...} (the result's text, or the
ToolError's message). The calls run one after another on the same tree, so a
later call sees what an earlier one wrote. Run it with a PATH that holds no
`rg`, so `grep` is the SDK's built-in walker (the one envworker's grep follows).
"""

from __future__ import annotations

import os
import sys
import json
import asyncio
from pathlib import Path

import anthropic
from anthropic.lib.tools.agent_toolset import (
    AgentToolContext,
    beta_read_tool,
    beta_edit_tool,
    beta_glob_tool,
    beta_grep_tool,
    beta_write_tool,
)
from anthropic.lib.tools._beta_functions import ToolError

assert anthropic.__version__ == "2.10.0", anthropic.__version__


def text_of(out: object) -> str:
    if isinstance(out, str):
        return out
    # Content blocks (an image or a document): their types, as the Rust side summarises them.
    return "\n".join(b.get("text", f"[{b.get('type', '?')} block]") for b in out)  # type: ignore[union-attr]


async def main() -> None:
    request = json.loads(Path(os.environ["AGENT_TOOLS_REQUEST"]).read_text())
    ctx = AgentToolContext(
        workdir=request["workdir"],
        allowed_roots=[Path(r) for r in request["allowed_roots"]],
        read_only_roots=[Path(r) for r in request["read_only_roots"]],
    )
    tools = {
        t.name: t
        for t in (beta_read_tool(ctx), beta_write_tool(ctx), beta_edit_tool(ctx), beta_glob_tool(ctx), beta_grep_tool(ctx))
    }
    answers = []
    for tool, given in request["calls"]:
        try:
            answers.append({"ok": True, "text": text_of(await tools[tool].call(given))})
        except ToolError as e:
            answers.append({"ok": False, "text": text_of(e.content)})
    json.dump(answers, sys.stdout)


asyncio.run(main())
