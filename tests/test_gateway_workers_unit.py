"""The pure pieces of `kvgate serve --workers N`: the host's `/metrics` merge, each worker's
share of the caps, the `server.workers` key and the `--workers` flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_settings
from gateway.serve import overrides_of, register
from gateway.workers.metrics import merge
from gateway.workers.worker import share_of, worker_settings

ONE = """# HELP kvgate_requests_total Requests.
# TYPE kvgate_requests_total counter
kvgate_requests_total{code="200"} 3
# HELP kvgate_queue_depth Waiting.
# TYPE kvgate_queue_depth gauge
kvgate_queue_depth 2
# HELP kvgate_backend_inflight In flight.
# TYPE kvgate_backend_inflight gauge
kvgate_backend_inflight{kvgate_backend="b0"} 7
# TYPE lat histogram
lat_bucket{le="0.1"} 1
lat_bucket{le="+Inf"} 2
lat_sum 0.25
lat_count 2
"""
TWO = """# TYPE kvgate_requests_total counter
kvgate_requests_total{code="200"} 4
kvgate_requests_total{code="429"} 1
# TYPE kvgate_queue_depth gauge
kvgate_queue_depth 1
# TYPE kvgate_backend_inflight gauge
kvgate_backend_inflight{kvgate_backend="b0"} 7
# TYPE lat histogram
lat_bucket{le="0.1"} 0
lat_bucket{le="+Inf"} 1
lat_sum 0.5
lat_count 1
# TYPE only_there counter
only_there 9
"""


def samples(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_counters_histograms_and_own_gauges_are_summed_shared_gauges_kept() -> None:
    merged = merge(ONE, [TWO])
    got = samples(merged)
    assert got['kvgate_requests_total{code="200"}'] == "7"
    assert got['kvgate_requests_total{code="429"}'] == "1"
    assert got["kvgate_queue_depth"] == "3"  # each worker's own queue
    assert got['kvgate_backend_inflight{kvgate_backend="b0"}'] == "7"  # the host's already
    assert got['lat_bucket{le="+Inf"}'] == "3" and got["lat_sum"] == "0.75"
    assert got["lat_count"] == "3" and got["only_there"] == "9"
    assert merged.index("# TYPE kvgate_requests_total") < merged.index(
        'kvgate_requests_total{code="429"}') < merged.index("# HELP kvgate_queue_depth")


def test_merging_nothing_keeps_the_exposition() -> None:
    assert samples(merge(ONE, [])) == samples(ONE)


def test_each_worker_gets_a_fair_share_of_the_caps() -> None:
    assert [share_of(n, 2) for n in (0, 1, 1024, 1025)] == [0, 1, 512, 513]
    settings = load_settings(None, overrides={"backends": [{"url": "http://127.0.0.1:1"}]})
    mine = worker_settings(settings, 4)
    assert mine.routing.queue.max_depth == settings.routing.queue.max_depth // 4
    assert mine.server.max_connections == 2500
    assert mine.server.port == settings.server.port


def test_the_workers_key_takes_a_count_or_auto() -> None:
    base = {"backends": [{"url": "http://127.0.0.1:1"}]}
    assert load_settings(None, overrides=base).server.worker_count() == 1
    auto = load_settings(None, overrides={**base, "server": {"workers": "auto"}})
    assert auto.server.worker_count() >= 1
    two = load_settings(None, overrides={**base, "server": {"workers": 2}})
    assert two.server.worker_count() == 2
    for bad in (0, "many"):
        with pytest.raises(ConfigError):
            load_settings(None, overrides={**base, "server": {"workers": bad}})


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_the_workers_flag_sets_the_key() -> None:
    assert overrides_of(parse("--workers", "3"))["server"] == {"workers": 3}
    assert overrides_of(parse("--workers", "auto"))["server"] == {"workers": "auto"}
    assert "server" not in overrides_of(parse())
    with pytest.raises(SystemExit):
        parse("--workers", "0")


def test_feeds_share_scrapes_and_one_workers_hold_off_with_every_worker() -> None:
    from gateway.workers.feed import BoardFeed
    from routing.fleet import Fleet
    from routing.shared_health import HoldTable
    from routing.shared_slots import Slots
    from routing.shared_snapshots import OK, ScrapeBoard, ScrapeEvent
    from routing.state import BackendSnapshot, BackendSpec

    specs = [BackendSpec("b0", "http://127.0.0.1:9000", ("m",))]
    board_buf = memoryview(bytearray(ScrapeBoard.nbytes(1)))
    holds = HoldTable(memoryview(bytearray(HoldTable.nbytes(2, 1))), 2, 1)
    poller_side = ScrapeBoard(Slots(board_buf, 1, 4096), ["b0"])
    fleets = [Fleet(specs) for _ in range(2)]
    feeds = [BoardFeed(f, ScrapeBoard(Slots(board_buf, 1, 4096), ["b0"]), 0.05, holds, w)
             for w, f in enumerate(fleets)]
    snapshot = BackendSnapshot(taken_at=1.0, format="vllm", kv_total_blocks=100,
                               kv_free_blocks=90, models=("m",))
    poller_side.publish("b0", ScrapeEvent(OK, 1.0, True, snapshot))
    assert [feed.read() for feed in feeds] == [1, 1]
    assert all(f.snapshot("b0") == snapshot for f in fleets)
    assert [feed.read() for feed in feeds] == [0, 0]  # nothing new
    fleets[0].hold_off("b0", 30.0)  # a 429 with Retry-After seen by worker 0
    feeds[0].read()
    feeds[1].read()
    assert fleets[1].held_until("b0") == 30.0 and fleets[1].candidates("m", 2.0) == []


def test_the_supervisors_fleet_publishes_each_outcome_and_one_worker_counts_failures() -> None:
    from gateway.workers.feed import BoardFeed
    from gateway.workers.supervisor import PublishingFleet
    from routing.fleet import Fleet, OutlierRules
    from routing.shared_slots import Slots
    from routing.shared_snapshots import ScrapeBoard
    from routing.state import BackendSpec

    specs = (BackendSpec("b0", "http://127.0.0.1:9000", ("m",)),)
    buf = memoryview(bytearray(ScrapeBoard.nbytes(1)))
    host = PublishingFleet(specs, ScrapeBoard(Slots(buf, 1, 4096), ["b0"]),
                           max_snapshot_age=1.0, rules=OutlierRules())
    counted: list[tuple[str, str]] = []
    worker = Fleet(specs)
    feed = BoardFeed(worker, ScrapeBoard(Slots(buf, 1, 4096), ["b0"]), 0.05,
                     on_error=lambda b, e: counted.append((b, e)))
    host.record_unreachable("b0", 1.0)
    assert feed.read() == 0  # published once the poller named the error
    host.failed("b0", "ScrapeConnectError")
    assert feed.read() == 1 and counted == [("b0", "ScrapeConnectError")]
    assert not worker.health("b0").reachable
    host.record_scrape_failure("b0", 2.0, answered=True)
    host.failed("b0", "ScrapeError")
    feed.read()
    assert counted[-1] == ("b0", "ScrapeError") and worker.health("b0").reachable
    assert worker.scrape_failures("b0") == 1


def test_a_worker_writes_its_figures_only_when_an_epoch_it_has_not_written_was_asked(
        tmp_path: Path) -> None:
    from gateway.workers.metrics import Epochs, HostMetrics

    epochs = Epochs(memoryview(bytearray(Epochs.nbytes(2))), 2)
    renders = [0, 0]

    def render(w: int) -> bytes:
        renders[w] += 1
        return f"# TYPE n counter\nn {renders[w]}\n".encode()

    workers = [HostMetrics(tmp_path, w, lambda w=w: render(w), epochs) for w in range(2)]
    for worker in workers:
        worker.check()
    assert renders == [0, 0]  # nobody asked
    epoch = epochs.ask()
    workers[1].check()
    workers[1].check()
    assert renders == [0, 1] and epochs.written(1) == epoch
    assert samples(merge(workers[0]._render().decode(), workers[0].others()))["n"] == "2"
