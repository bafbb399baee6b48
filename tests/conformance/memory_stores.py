"""Drive the devserver's memory stores API with the official Python SDK.

Run by tests/it/sdk_conformance.rs with ENVWORKER_URL and ENVWORKER_ADMIN_KEY set.
Every check runs even when an earlier one fails; the exit status is 1 when any
failed. The SDK parses every answer into its own models, so a shape it cannot
read fails here exactly as it would for a user.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from datetime import datetime, timedelta, timezone

import anthropic
from anthropic.types.beta.memory_stores import (
    BetaManagedAgentsMemory,
    BetaManagedAgentsMemoryPrefix,
)

assert anthropic.__version__ == "2.10.0", anthropic.__version__

client = anthropic.Anthropic(
    api_key=os.environ["ENVWORKER_ADMIN_KEY"],
    base_url=os.environ["ENVWORKER_URL"],
    max_retries=0,
)
stores = client.beta.memory_stores
memories = client.beta.memory_stores.memories
versions = client.beta.memory_stores.memory_versions


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def expect_status(exc_type, status, error_type, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        assert e.status_code == status, (e.status_code, e.body)
        assert e.body["error"]["type"] == error_type, e.body
        assert e.body["type"] == "error", e.body
        return e
    raise AssertionError(f"expected {exc_type.__name__} {status} {error_type}")


def pages_of(page):
    """All pages of a listing, following next_page the way the SDK does."""
    out = [page]
    while page.has_next_page():
        page = page.get_next_page()
        out.append(page)
    return out


def check_store_lifecycle():
    created = stores.create(name="SDK Store", description="made by the SDK", metadata={"k": "v"})
    assert created.id.startswith("memstore_")
    assert created.type == "memory_store"
    assert created.metadata == {"k": "v"}
    assert created.archived_at is None
    assert isinstance(created.created_at, datetime)
    got = stores.retrieve(created.id)
    assert got == created, (got, created)
    updated = stores.update(created.id, name="Renamed", metadata={"k": None, "team": "core"})
    assert updated.name == "Renamed"
    assert updated.metadata == {"team": "core"}
    cleared = stores.update(created.id, description="")
    assert cleared.description == ""
    listed = [s.id for s in stores.list()]
    assert created.id in listed
    archived = stores.archive(created.id)
    assert archived.archived_at is not None
    assert stores.archive(created.id).archived_at == archived.archived_at
    assert created.id not in [s.id for s in stores.list()]
    assert created.id in [s.id for s in stores.list(include_archived=True)]
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error", stores.update, created.id, name="no")
    deleted = stores.delete(created.id)
    assert deleted.type == "memory_store_deleted" and deleted.id == created.id
    expect_status(anthropic.NotFoundError, 404, "not_found_error", stores.retrieve, created.id)


def check_store_listing_pages_and_filters():
    made = [stores.create(name=f"page store {i}") for i in range(5)]
    ids = [m.id for m in made]
    first = stores.list(limit=2)
    all_pages = pages_of(first)
    assert len(all_pages) >= 3, len(all_pages)
    seen = [s.id for p in all_pages for s in p.data]
    assert [i for i in seen if i in ids] == list(reversed(ids)), "newest first"
    since = made[2].created_at
    recent = [s.id for s in stores.list(created_at_gte=since)]
    assert set(ids[2:]) <= set(recent) and not set(ids[:2]) & set(recent), recent
    before = [s.id for s in stores.list(created_at_lte=since - timedelta(microseconds=1))]
    assert not set(ids[2:]) & set(before)


def check_memory_crud_and_views():
    store = stores.create(name="crud")
    content = "Prefer short answers.\n"
    m = memories.create(store.id, path="/style.md", content=content)
    assert isinstance(m, BetaManagedAgentsMemory)
    assert m.content is None, "create answers in the basic view"
    assert m.content_sha256 == sha(content)
    assert m.content_size_bytes == len(content.encode())
    full = memories.retrieve(m.id, memory_store_id=store.id)
    assert full.content == content
    basic = memories.retrieve(m.id, memory_store_id=store.id, view="basic")
    assert basic.content is None and basic.content_sha256 == sha(content)
    with_view = memories.create(store.id, path="/v.md", content="v", view="full")
    assert with_view.content == "v"
    empty = memories.create(store.id, path="/empty.md", content="")
    assert empty.content_size_bytes == 0 and empty.content_sha256 == sha("")

    updated = memories.update(
        m.id,
        memory_store_id=store.id,
        content="Be brief.\n",
        precondition={"type": "content_sha256", "content_sha256": m.content_sha256},
    )
    assert updated.content_sha256 == sha("Be brief.\n")
    assert updated.memory_version_id != m.memory_version_id
    renamed = memories.update(m.id, memory_store_id=store.id, path="/prefs/style.md")
    assert renamed.id == m.id and renamed.path == "/prefs/style.md"
    deleted = memories.delete(m.id, memory_store_id=store.id, expected_content_sha256=sha("Be brief.\n"))
    assert deleted.type == "memory_deleted" and deleted.id == m.id
    expect_status(anthropic.NotFoundError, 404, "not_found_error", memories.retrieve, m.id, memory_store_id=store.id)


def check_pagination_in_both_views():
    store = stores.create(name="paged")
    paths = sorted(f"/docs/{i:03}.md" for i in range(47))
    for p in paths:
        memories.create(store.id, path=p, content=f"body {p}")
    basic_pages = pages_of(memories.list(store.id, limit=10))
    assert len(basic_pages) == 5, len(basic_pages)
    basic_items = [i for p in basic_pages for i in p.data]
    assert [i.path for i in basic_items] == paths
    assert all(i.content is None for i in basic_items)
    full_pages = pages_of(memories.list(store.id, view="full", limit=100))
    assert [len(p.data) for p in full_pages] == [20, 20, 7], [len(p.data) for p in full_pages]
    full_items = [i for p in full_pages for i in p.data]
    assert [i.content for i in full_items] == [f"body {p}" for p in paths]
    # Auto-pagination through iteration.
    assert [i.path for i in memories.list(store.id, limit=9)] == paths


def check_prefixes_and_depth():
    store = stores.create(name="tree")
    for p in ["/notes/a.md", "/notes/sub/b.md", "/notes/sub/c.md", "/notes-archive/x.md", "/root.md"]:
        memories.create(store.id, path=p, content="x")
    under = [i.path for i in memories.list(store.id, path_prefix="/notes/")]
    assert under == ["/notes/a.md", "/notes/sub/b.md", "/notes/sub/c.md"], under
    top = list(memories.list(store.id, depth=1, limit=1))
    kinds = [(type(i).__name__, i.path) for i in top]
    assert kinds == [
        ("BetaManagedAgentsMemoryPrefix", "/notes-archive/"),
        ("BetaManagedAgentsMemoryPrefix", "/notes/"),
        ("BetaManagedAgentsMemory", "/root.md"),
    ], kinds
    assert isinstance(top[0], BetaManagedAgentsMemoryPrefix)


def check_precondition_conflicts():
    store = stores.create(name="conflicts")
    m = memories.create(store.id, path="/race.md", content="one")
    memories.update(m.id, memory_store_id=store.id, content="two")
    stale = {"type": "content_sha256", "content_sha256": sha("one")}
    e = expect_status(
        anthropic.ConflictError, 409, "memory_precondition_failed_error",
        memories.update, m.id, memory_store_id=store.id, content="three", precondition=stale,
    )
    assert "content_sha256" in e.body["error"]["message"]
    # The state already equals the request: 200 even with a stale precondition.
    same = memories.update(m.id, memory_store_id=store.id, content="two", precondition=stale)
    assert same.content_sha256 == sha("two")
    expect_status(
        anthropic.ConflictError, 409, "memory_precondition_failed_error",
        memories.delete, m.id, memory_store_id=store.id, expected_content_sha256=sha("one"),
    )
    assert memories.retrieve(m.id, memory_store_id=store.id).content == "two"
    e = expect_status(
        anthropic.ConflictError, 409, "memory_path_conflict_error",
        memories.create, store.id, path="/race.md", content="dup",
    )
    assert e.body["error"]["details"]["conflicting_memory_id"] == m.id
    expect_status(
        anthropic.ConflictError, 409, "memory_path_conflict_error",
        memories.create, store.id, path="/race.md/inner.md", content="x",
    )


def check_path_rejections():
    store = stores.create(name="paths")
    for bad in ["no-slash.md", "/", "/a//b", "/a/./b", "/a/../b", "/tab\there", "/zw\u200bsp", "/cafe\u0301",
                "/" + "x" * 1024, "/s" * 21]:
        expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                      memories.create, store.id, path=bad, content="x")
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                  memories.create, store.id, path="/big.md", content="a" * 102_401)
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                  memories.list, store.id, path_prefix="/no-trailing-slash")
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                  memories.list, store.id, depth=3)
    assert list(memories.list(store.id)) == [], "nothing was created"


def check_versions_and_redaction():
    store = stores.create(name="history")
    m = memories.create(store.id, path="/h.md", content="v1")
    memories.update(m.id, memory_store_id=store.id, content="v2")
    memories.update(m.id, memory_store_id=store.id, content="v3")
    history = list(versions.list(store.id, memory_id=m.id, view="full", limit=2))
    assert [v.content for v in history] == ["v3", "v2", "v1"], [v.content for v in history]
    assert [v.operation for v in history] == ["modified", "modified", "created"]
    assert history[0].created_by.type == "api_actor"
    key_id = history[0].created_by.api_key_id
    assert [v.id for v in versions.list(store.id, api_key_id=key_id)] == [v.id for v in history]
    assert list(versions.list(store.id, session_id="sesn_nobody")) == []
    assert len(list(versions.list(store.id, operation="created"))) == 1
    basic = list(versions.list(store.id))
    assert all(v.content is None and v.content_sha256 for v in basic)

    oldest = history[-1]
    got = versions.retrieve(oldest.id, memory_store_id=store.id)
    assert got.content == "v1"
    red = versions.redact(oldest.id, memory_store_id=store.id)
    assert red.redacted_at is not None and red.redacted_by is not None
    assert red.content is None and red.path is None and red.content_sha256 is None and red.content_size_bytes is None
    assert versions.retrieve(oldest.id, memory_store_id=store.id).redacted_at == red.redacted_at
    head = memories.retrieve(m.id, memory_store_id=store.id).memory_version_id
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                  versions.redact, head, memory_store_id=store.id)

    memories.delete(m.id, memory_store_id=store.id)
    after = list(versions.list(store.id, memory_id=m.id))
    assert after[0].operation == "deleted" and after[0].content_sha256 is None, after[0]


def check_versions_since_a_time_newest_first_paginated():
    """What the worker's version feed relies on (issue 16): created_at[gte]
    with pagination and a small limit, newest first, basic view, a deleted
    op's null hash, a redacted version still listed with its path gone."""
    store = stores.create(name="feed")
    made = [memories.create(store.id, path=f"/f{i}.md", content=f"c{i}") for i in range(3)]
    first = list(versions.list(store.id))
    since = min(v.created_at for v in first)
    memories.update(made[0].id, memory_store_id=store.id, content="c0 again")
    memories.update(made[1].id, memory_store_id=store.id, path="/moved.md")
    memories.delete(made[2].id, memory_store_id=store.id)
    page = versions.list(store.id, created_at_gte=since, limit=2)
    pages = pages_of(page)
    assert len(pages) == 3, [len(p.data) for p in pages]
    listed = [v for p in pages for v in p.data]
    assert len(listed) == 6 and len({v.id for v in listed}) == 6, listed
    stamps = [v.created_at for v in listed]
    assert stamps == sorted(stamps, reverse=True), stamps
    assert all(t >= since for t in stamps)
    assert [v.operation for v in listed[:3]] == ["deleted", "modified", "modified"], listed
    assert listed[0].content_sha256 is None and listed[0].path == "/f2.md", listed[0]
    assert listed[1].path == "/moved.md" and listed[1].memory_id == made[1].id
    assert all(v.content is None for v in listed), "basic view: no content"
    # Only what is at or after the time: the three writes after `since` at most.
    late = listed[2].created_at
    assert {v.id for v in versions.list(store.id, created_at_gte=late)} == {v.id for v in listed[:3]}
    # A redacted version stays listed in its window, its path gone.
    old = [v for v in listed if v.memory_id == made[0].id and v.operation == "created"][0]
    versions.redact(old.id, memory_store_id=store.id)
    again = list(versions.list(store.id, created_at_gte=since))
    red = [v for v in again if v.id == old.id][0]
    assert red.redacted_at is not None and red.path is None and red.content_sha256 is None, red
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                  versions.list, store.id, extra_query={"created_at[gte]": "not a time"})


def check_auth_and_betas():
    bad = anthropic.Anthropic(api_key="wrong", base_url=os.environ["ENVWORKER_URL"], max_retries=0)
    expect_status(anthropic.AuthenticationError, 401, "authentication_error", bad.beta.memory_stores.list)
    # Asking for the managed-agents beta too puts both betas on the wire: refused.
    expect_status(anthropic.BadRequestError, 400, "invalid_request_error",
                  stores.list, betas=["managed-agents-2026-04-01"])
    expect_status(anthropic.NotFoundError, 404, "not_found_error", stores.retrieve, "memstore_missing")


CHECKS = [v for k, v in sorted(globals().items()) if k.startswith("check_")]

failed = 0
for check in CHECKS:
    try:
        check()
        print(f"ok   {check.__name__}")
    except Exception:  # noqa: BLE001 - report every failure, keep going
        failed += 1
        print(f"FAIL {check.__name__}")
        traceback.print_exc(file=sys.stdout)
print(f"{len(CHECKS) - failed} of {len(CHECKS)} SDK checks passed")
sys.exit(1 if failed else 0)
