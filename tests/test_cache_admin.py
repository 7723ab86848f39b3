"""`kvgate cache`: the admin commands, run for real against a redis-server this module starts on
loopback (tests/redis_server.py).

Each command goes through `gateway.cli.main` as the shell would call it (its exit code, stdout and
stderr are the spec); one test runs the installed entry point in a subprocess. `main` runs every
command under its own `asyncio.run`, so the tests are synchronous: `running_redis_sync` keeps the
server's loop in a thread, and the helpers below fill and read the cache through `RedisStore`, as
a gateway would, each under its own `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from gateway.cache.answer import CachedAnswer
from gateway.cache.redis_store import RedisStore
from gateway.cache.store import Entry
from gateway.cache.vectors import normalised
from gateway.cli import main
from tests.paths import free_port
from tests.redis_server import running_redis_sync

DEFAULT_PREFIX = "kvgate:cache:"
# FIRST and SECOND share their first 6 characters ("abcdef"): an ambiguous prefix.
FIRST = "abcdef01" + "0" * 56
SECOND = "abcdef23" + "1" * 56
THIRD = "fedcba45" + "2" * 56
UNKNOWN = "0123456789abcdef"


def answer(text: str) -> bytes:
    return CachedAnswer(kind="chat", model="llama-3-8b", text=text, finish_reason="stop",
                        prompt_tokens=12, completion_tokens=3).to_bytes()


def three_entries(now: float) -> list[Entry]:
    """FIRST, SECOND and THIRD, created 300, 200 and 100 s before `now` (recent, because `put`
    drops from the listing any id created more than its ttl ago, and import's ttl is 3600 s);
    THIRD is exact-only (no vector)."""
    return [
        Entry(id=FIRST, namespace="hashing/ns-a", vector=normalised({1: 3.0, 7: 4.0}),
              answer=answer("Paris."), model="llama-3-8b", query="capital of France?",
              created=now - 300.0),
        Entry(id=SECOND, namespace="hashing/ns-a", vector=normalised({2: 1.0, 9: 2.0, 11: 2.0}),
              answer=answer("Rome."), model="llama-3-8b", query="capital of Italy?",
              created=now - 200.0),
        Entry(id=THIRD, namespace=f"exact/{THIRD}", vector=None, answer=answer("Berlin."),
              model="qwen-7b", query="", created=now - 100.0),
    ]


def put(url: str, entries: list[Entry], prefix: str = DEFAULT_PREFIX,
        counters: dict[str, int] | None = None) -> None:
    async def fill() -> None:
        store = RedisStore.from_url(url, prefix=prefix, ttl_s=None)
        try:
            for entry in entries:
                await store.put(entry)
            for name, times in (counters or {}).items():
                for _ in range(times):
                    await store.bump(name)
        finally:
            await store.close()

    asyncio.run(fill())


def stored(url: str, prefix: str = DEFAULT_PREFIX) -> list[Entry]:
    """Every entry under `prefix`, newest first, as a gateway reads them."""
    async def read() -> list[Entry]:
        store = RedisStore.from_url(url, prefix=prefix, ttl_s=None)
        try:
            return await store.entries()
        finally:
            await store.close()

    return asyncio.run(read())


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return orjson.loads(self.out)

    def json_lines(self) -> list[Any]:
        return [orjson.loads(line) for line in self.out.splitlines()]


Kvgate = Callable[..., Run]


@pytest.fixture
def kvgate(capsys: pytest.CaptureFixture[str]) -> Iterator[Kvgate]:
    """`kvgate(*args)`: `kvgate cache *args` in-process, with what it printed."""
    def run(*args: str) -> Run:
        capsys.readouterr()
        code = main(["cache", *args])
        out, err = capsys.readouterr()
        return Run(code, out, err)

    yield run


@pytest.fixture
def url() -> Iterator[str]:
    with running_redis_sync() as redis_url:
        yield redis_url


@pytest.fixture
def entries(url: str) -> list[Entry]:
    """Three entries in the default prefix's cache, as Redis gives them back (vectors float32),
    newest first."""
    put(url, three_entries(time.time()))
    found = stored(url)
    assert [entry.id for entry in found] == [THIRD, SECOND, FIRST]
    return found


@pytest.fixture
def raw(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert "Traceback" not in err
    return err


# stats


def test_stats_text_shows_entries_lookups_by_result_and_the_hit_rate(url: str,
                                                                      kvgate: Kvgate) -> None:
    put(url, three_entries(time.time()),
        counters={"exact": 2, "semantic": 1, "miss": 1, "store": 3})
    run = kvgate("stats", "--redis", url)
    assert (run.code, run.err) == (0, "")
    assert run.out == ("entries   3\n"
                       "lookups   4: 2 exact, 1 semantic, 1 missed (hit rate 75.0%)\n"
                       "stored    3\n")


def test_stats_json_gives_entries_every_counter_and_the_hit_rate(url: str, kvgate: Kvgate) -> None:
    put(url, three_entries(time.time()),
        counters={"exact": 1, "semantic": 1, "miss": 4, "store": 5})
    run = kvgate("stats", "--redis", url, "--json")
    assert run.code == 0
    assert run.json() == {"entries": 3, "exact": 1, "semantic": 1, "miss": 4, "store": 5,
                          "hit_rate": round(2 / 6, 4)}


def test_stats_hit_rate_is_null_before_any_lookup(url: str, kvgate: Kvgate) -> None:
    put(url, three_entries(time.time()), counters={"store": 3})
    run = kvgate("stats", "--redis", url, "--json")
    assert run.code == 0
    assert run.json() == {"entries": 3, "exact": 0, "semantic": 0, "miss": 0, "store": 3,
                          "hit_rate": None}
    assert "(hit rate -)" in kvgate("stats", "--redis", url).out


# ls


def test_ls_lists_entries_newest_first_under_a_header(url: str, entries: list[Entry],
                                                       kvgate: Kvgate) -> None:
    run = kvgate("ls", "--redis", url)
    assert run.code == 0
    header, *rows = run.out.splitlines()
    assert header.split() == ["ID", "AGE", "MODEL", "QUERY"]
    assert [row.split()[0] for row in rows] == [THIRD[:16], SECOND[:16], FIRST[:16]]
    assert rows[0].split()[2:] == ["qwen-7b", "-"]  # no query: a dash
    assert rows[2].split()[2:] == ["llama-3-8b", "capital", "of", "France?"]


def test_ls_json_is_one_object_per_entry_newest_first(url: str, entries: list[Entry],
                                                      kvgate: Kvgate) -> None:
    run = kvgate("ls", "--redis", url, "--json")
    assert run.code == 0
    assert run.json_lines() == [
        {"id": e.id, "model": e.model, "query": e.query, "created": e.created} for e in entries]


@pytest.mark.parametrize("output", [pytest.param([], id="text"), pytest.param(["--json"],
                                                                               id="json")])
def test_ls_limit_keeps_only_the_newest_n(url: str, entries: list[Entry], kvgate: Kvgate,
                                          output: list[str]) -> None:
    run = kvgate("ls", "--redis", url, "--limit", "2", *output)
    assert run.code == 0
    if output:
        assert [row["id"] for row in run.json_lines()] == [THIRD, SECOND]
    else:
        assert [row.split()[0] for row in run.out.splitlines()[1:]] == [THIRD[:16], SECOND[:16]]


# show


@pytest.mark.parametrize("given, expected", [
    pytest.param(FIRST, FIRST, id="a full id"),
    pytest.param(FIRST[:7], FIRST, id="a unique 7-character prefix"),
    pytest.param(THIRD[:6], THIRD, id="a unique 6-character prefix"),
])
def test_show_prints_the_whole_entry_as_json(url: str, entries: list[Entry], kvgate: Kvgate,
                                             given: str, expected: str) -> None:
    run = kvgate("show", "--redis", url, given)
    assert (run.code, run.err) == (0, "")
    entry = next(e for e in entries if e.id == expected)
    assert run.json() == {
        "id": entry.id, "namespace": entry.namespace, "model": entry.model,
        "query": entry.query, "answer": orjson.loads(entry.answer),
        "created": datetime.fromtimestamp(entry.created, UTC).isoformat(),
        "vector": None if entry.vector is None else f"{len(entry.vector)} entries",
    }
    assert datetime.fromisoformat(run.json()["created"]).timestamp() == pytest.approx(
        entry.created)


def test_show_an_ambiguous_prefix_exits_2_with_one_line(url: str, entries: list[Entry],
                                                        kvgate: Kvgate) -> None:
    run = kvgate("show", "--redis", url, "abcdef")
    assert (run.code, run.out) == (2, "")
    assert "matches 2 entries" in one_line(run.err)


def test_show_an_unknown_id_exits_1(url: str, entries: list[Entry], kvgate: Kvgate) -> None:
    run = kvgate("show", "--redis", url, UNKNOWN)
    assert (run.code, run.out) == (1, "")
    assert f"no cache entry {UNKNOWN!r}" in one_line(run.err)


# rm


def test_rm_removes_the_entry_and_the_count_drops(url: str, entries: list[Entry],
                                                  kvgate: Kvgate) -> None:
    run = kvgate("rm", "--redis", url, FIRST[:7])
    assert (run.code, run.out) == (0, "removed 1 entry\n")
    assert [entry.id for entry in stored(url)] == [THIRD, SECOND]
    assert kvgate("stats", "--redis", url, "--json").json()["entries"] == 2
    assert kvgate("show", "--redis", url, FIRST).code == 1


def test_rm_with_an_unknown_id_exits_1_and_removes_nothing(url: str, entries: list[Entry],
                                                           kvgate: Kvgate) -> None:
    run = kvgate("rm", "--redis", url, FIRST, UNKNOWN, SECOND)
    assert (run.code, run.out) == (1, "")
    assert f"no cache entry {UNKNOWN!r}" in one_line(run.err)
    assert stored(url) == entries


def test_rm_counts_an_entry_named_twice_once(url: str, entries: list[Entry],
                                             kvgate: Kvgate) -> None:
    run = kvgate("rm", "--redis", url, FIRST, FIRST[:7])
    assert (run.code, run.out) == (0, "removed 1 entry\n")
    assert [entry.id for entry in stored(url)] == [THIRD, SECOND]


# flush


def test_flush_without_yes_exits_2_and_removes_nothing(url: str, entries: list[Entry],
                                                       kvgate: Kvgate) -> None:
    run = kvgate("flush", "--redis", url)
    assert (run.code, run.out) == (2, "")
    assert "--yes" in one_line(run.err)
    assert stored(url) == entries


def test_flush_yes_removes_every_key_under_the_prefix_and_no_other(
        url: str, entries: list[Entry], kvgate: Kvgate, raw: redis.Redis) -> None:
    put(url, [], counters={"miss": 2})
    raw.set("app:session:1", b"someone else's")
    raw.set("kvgate:cachet", b"a prefix is not a substring match")
    run = kvgate("flush", "--redis", url, "--yes")
    assert (run.code, run.out) == (0, "removed 3 entries\n")
    assert sorted(raw.keys("*")) == [b"app:session:1", b"kvgate:cachet"]
    assert kvgate("stats", "--redis", url, "--json").json() == {
        "entries": 0, "exact": 0, "semantic": 0, "miss": 0, "store": 0, "hit_rate": None}


# export and import


@pytest.mark.parametrize("through", ["file", "stdout and stdin"])
def test_export_flush_import_round_trips_every_entry_exactly(
        url: str, entries: list[Entry], kvgate: Kvgate, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, through: str) -> None:
    path = tmp_path / "cache.jsonl"
    if through == "file":
        run = kvgate("export", "--redis", url, str(path))
        assert (run.code, run.out) == (0, f"exported 3 entries to {path}\n")
    else:
        run = kvgate("export", "--redis", url)
        assert run.code == 0
        assert len(run.json_lines()) == 3
        monkeypatch.setattr(sys, "stdin", io.StringIO(run.out))
    assert kvgate("flush", "--redis", url, "--yes").code == 0
    assert stored(url) == []
    run = kvgate("import", "--redis", url, str(path) if through == "file" else "-")
    assert (run.code, run.out) == (0, "imported 3 entries\n")
    # ids, namespaces, vectors (and their absence), answers' bytes, models, queries, created
    assert stored(url) == entries


def export_lines(url: str, kvgate: Kvgate) -> list[dict[str, Any]]:
    run = kvgate("export", "--redis", url)
    assert run.code == 0
    lines: list[dict[str, Any]] = run.json_lines()
    return lines


@pytest.mark.parametrize("line3", [
    pytest.param("{not json", id="not JSON"),
    pytest.param('["a", "list"]', id="not an object"),
    pytest.param({"answer": None}, id="no answer"),
    pytest.param({"answer": {"kind": "chat", "model": "m", "text": "x",
                             "finish_reason": "tool_calls"}}, id="an answer it cannot replay"),
    pytest.param({"id": ""}, id="an empty id"),
    pytest.param({"created": "yesterday"}, id="created not a number"),
    pytest.param({"created": "nan"}, id="created NaN, which Redis would refuse mid-import"),
    pytest.param({"vector": "!!not base64!!"}, id="a vector not base64"),
    pytest.param({"vector": "AAAA"}, id="a vector that does not decode"),
])
def test_import_with_a_malformed_line_3_exits_2_naming_it_and_imports_nothing(
        url: str, entries: list[Entry], kvgate: Kvgate, tmp_path: Path,
        line3: str | dict[str, Any]) -> None:
    good = export_lines(url, kvgate)
    assert kvgate("flush", "--redis", url, "--yes").code == 0
    if isinstance(line3, dict):
        bad = {**good[2], **line3}
        line3 = orjson.dumps({k: v for k, v in bad.items() if v is not None}).decode()
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([orjson.dumps(good[0]).decode(), orjson.dumps(good[1]).decode(),
                               line3]) + "\n", encoding="utf-8")
    run = kvgate("import", "--redis", url, str(path))
    assert (run.code, run.out) == (2, "")
    assert "import line 3: not a cache entry" in one_line(run.err)
    assert stored(url) == []


def test_import_of_a_missing_file_exits_2(url: str, kvgate: Kvgate, tmp_path: Path) -> None:
    run = kvgate("import", "--redis", url, str(tmp_path / "nowhere.jsonl"))
    assert (run.code, run.out) == (2, "")
    assert "cannot read" in one_line(run.err)


def test_export_to_an_unwritable_file_exits_2_without_blaming_redis(
        url: str, entries: list[Entry], kvgate: Kvgate, tmp_path: Path) -> None:
    run = kvgate("export", "--redis", url, str(tmp_path / "no-such-dir" / "cache.jsonl"))
    assert (run.code, run.out) == (2, "")
    assert "cannot write" in one_line(run.err)
    assert "Redis" not in run.err


# --prefix


def test_prefix_isolates_two_caches_in_one_redis(url: str, kvgate: Kvgate) -> None:
    first, second, third = three_entries(time.time())
    put(url, [first, second])
    put(url, [third], prefix="team-b:", counters={"miss": 1})
    assert [row["id"] for row in kvgate("ls", "--redis", url, "--json").json_lines()] == [
        SECOND, FIRST]
    b = ["--redis", url, "--prefix", "team-b:"]
    assert [row["id"] for row in kvgate("ls", *b, "--json").json_lines()] == [THIRD]
    assert kvgate("stats", *b, "--json").json()["entries"] == 1
    assert kvgate("stats", "--redis", url, "--json").json()["miss"] == 0
    assert kvgate("show", *b, FIRST).code == 1
    assert kvgate("flush", *b, "--yes").code == 0
    assert [entry.id for entry in stored(url)] == [SECOND, FIRST]
    assert stored(url, prefix="team-b:") == []


# failures and usage


@pytest.mark.parametrize("args", [
    pytest.param(["stats"], id="stats"),
    pytest.param(["ls", "--json"], id="ls"),
    pytest.param(["show", FIRST], id="show"),
    pytest.param(["rm", FIRST], id="rm"),
    pytest.param(["flush", "--yes"], id="flush"),
    pytest.param(["export"], id="export"),
])
def test_unreachable_redis_exits_2_with_one_line_and_no_traceback(kvgate: Kvgate,
                                                                  args: list[str]) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    run = kvgate(*args, "--redis", nobody)
    assert (run.code, run.out) == (2, "")
    assert f"cannot reach Redis at {nobody}" in one_line(run.err)


@pytest.mark.parametrize("redis_url", [
    pytest.param("unreachable", id="unreachable"),
    pytest.param("mysql://127.0.0.1/0", id="not a Redis URL"),
])
def test_shadow_report_on_a_wrong_or_unreachable_redis_exits_2_with_one_line(
        kvgate: Kvgate, redis_url: str) -> None:
    where = f"redis://127.0.0.1:{free_port()}/0" if redis_url == "unreachable" else redis_url
    run = kvgate("shadow-report", "--redis", where)
    assert (run.code, run.out) == (2, "")
    assert f"cannot read {where}" in one_line(run.err)


@pytest.mark.parametrize("args, message", [
    pytest.param(["ls", "--limit", "0"], "--limit must be at least 1", id="ls --limit 0"),
    pytest.param(["import", "-", "--ttl", "0"], "--ttl must be > 0", id="import --ttl 0"),
    pytest.param(["show", "abc"], "at least 6 characters", id="an ID prefix under 6 characters"),
])
def test_bad_usage_exits_2_with_one_line(url: str, entries: list[Entry], kvgate: Kvgate,
                                         args: list[str], message: str) -> None:
    run = kvgate(*args, "--redis", url)
    assert (run.code, run.out) == (2, "")
    assert message in one_line(run.err)
    assert stored(url) == entries


def test_a_redis_url_it_cannot_read_exits_2(kvgate: Kvgate) -> None:
    run = kvgate("stats", "--redis", "mysql://127.0.0.1/0")
    assert (run.code, run.out) == (2, "")
    assert "--redis 'mysql://127.0.0.1/0'" in one_line(run.err)


def test_a_server_that_is_not_redis_is_one_line_and_exit_2(kvgate: Kvgate) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer_as_http() -> None:
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer_as_http, daemon=True)
        thread.start()
        run = kvgate("stats", "--redis", f"redis://127.0.0.1:{port}/0")
        thread.join(timeout=10)
    assert (run.code, run.out) == (2, "")
    assert "does not answer as Redis does" in one_line(run.err)


# the entry point


@pytest.mark.parametrize("command", [
    pytest.param([str(Path(sys.executable).with_name("kvgate"))], id="the kvgate script"),
    pytest.param([sys.executable, "-m", "gateway.cli"], id="python -m gateway.cli"),
])
def test_the_installed_command_runs_cache_stats(url: str, entries: list[Entry],
                                                command: list[str]) -> None:
    done = subprocess.run([*command, "cache", "stats", "--redis", url, "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert orjson.loads(done.stdout)["entries"] == 3
