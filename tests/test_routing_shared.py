"""The shared-memory structures of `kvgate serve --workers N`, on plain buffers: the seqlock
slots (never a torn read, a writer that died mid-write reads as empty), the host's ledger table
and the per-backend ledgers on it, the scrape board, and a Fleet deciding on the host's totals."""

from __future__ import annotations

import sys
import threading

import pytest

from routing.fleet import Fleet
from routing.kv_hold import Hold
from routing.ledger import Ledger
from routing.shared_ledger import BASE, INFLIGHT, OWN, SPREAD2, TOP, HostLedger, LedgerTable
from routing.shared_slots import Slots, SlotTooSmall
from routing.shared_snapshots import (
    FAILED,
    OK,
    UNREACHABLE,
    ScrapeBoard,
    ScrapeEvent,
    decode,
    encode,
)
from routing.state import BackendSnapshot, BackendSpec


def slots(count: int = 2, size: int = 64) -> Slots:
    return Slots(memoryview(bytearray(Slots.nbytes(count, size))), count, size)


def test_a_slot_reads_what_was_last_written_and_none_before() -> None:
    s = slots()
    assert s.read(0) is None and s.sequence(0) == 0
    assert s.write(0, b"one") == 2
    assert s.write(0, b"three") == 4
    assert s.read(0) == (4, b"three")
    assert s.read(1) is None


def test_a_slot_refuses_a_payload_larger_than_itself() -> None:
    s = slots(size=8)
    with pytest.raises(SlotTooSmall):
        s.write(0, b"x" * 9)
    s.write(0, b"x" * 8)
    assert s.read(0) == (2, b"x" * 8)


def test_slots_must_fit_their_buffer() -> None:
    with pytest.raises(ValueError):
        Slots(memoryview(bytearray(10)), 1, 64)
    with pytest.raises(IndexError):
        slots().read(2)


def test_a_write_under_way_reads_as_empty_and_the_next_write_heals_it() -> None:
    """A writer that died between making the sequence odd and even again."""
    buf = memoryview(bytearray(Slots.nbytes(1, 16)))
    s = Slots(buf, 1, 16)
    s.write(0, b"good")
    buf[0] = 3  # sequence 3: odd, a write under way that never ends
    assert s.read(0) is None
    assert s.write(0, b"again") == 6
    assert s.read(0) == (6, b"again")


def test_a_reader_racing_a_writer_never_sees_a_torn_payload() -> None:
    """Each payload is one byte repeated, its length varying: half of one write and half of
    another, or one's length with another's bytes, would show as mixed bytes or a wrong
    length. The switch interval is made tiny so the threads interleave inside writes."""
    s = slots(count=1, size=256)
    stop = threading.Event()

    def write() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            s.write(0, bytes([k % 251]) * (1 + k % 256))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    try:
        for _ in range(20_000):
            got = s.read(0)
            if got is None:
                continue
            seq, payload = got
            assert seq % 2 == 0
            k = payload[0]
            assert payload == bytes([k]) * len(payload)
            reads += 1
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(old)
    assert reads > 0


def table(workers: int = 2, backends: int = 2) -> LedgerTable:
    return LedgerTable(memoryview(bytearray(LedgerTable.nbytes(workers, backends))),
                       workers, backends)


def test_the_table_sums_every_workers_row() -> None:
    t = table()
    t.write(0, 1, 5, 2, Hold(30, 20, 9), 6)
    t.write(1, 1, 7, 3, Hold(10, 8, 16), 2)
    assert t.total(1, INFLIGHT) == 5 and t.total(1, OWN) == 40
    assert (t.total(1, BASE), t.total(1, SPREAD2), t.largest(1, TOP)) == (28, 25, 6)
    assert t.total(0, INFLIGHT) == 0
    t.clear_row(0)
    assert t.row(0, 1) == (6, 0, Hold(0, 0, 0), 0)
    assert t.total(1, INFLIGHT) == 3


def test_host_ledgers_count_every_workers_requests_and_keep_their_own_entries() -> None:
    t = table()
    mine, theirs = HostLedger(t, 0, 0), HostLedger(t, 1, 0)
    a = mine.open(1.0, 10)
    theirs.open(2.0, 5)
    assert mine.inflight == theirs.inflight == 2
    assert mine.reserved_blocks == 15
    assert mine.local_inflight == 1
    assert mine.since(0.0) == (1, 10)  # what this worker dispatched since a scrape
    before = mine.version
    theirs.open(3.0, 1)
    assert mine.version != before  # another worker's dispatch changes what this one reads
    mine.resize(a, 20)
    assert theirs.reserved_blocks == 26
    mine.close(a)
    assert theirs.inflight == 2 and theirs.reserved_blocks == 6


def test_host_ledgers_pool_the_holds_of_every_worker_as_one_ledger_would() -> None:
    t = table(backends=1)
    mine, theirs, alone = HostLedger(t, 0, 0), HostLedger(t, 1, 0), Ledger()
    holds = [Hold(30, 20, 36), Hold(30, 20, 36), Hold(12, 12, 0), Hold(50, 40, 100)]
    tickets = [(mine if i % 2 else theirs).open(float(i), hold) for i, hold in enumerate(holds)]
    for i, hold in enumerate(holds):
        alone.open(float(i), hold)
    # 92 expected blocks plus ceil(sqrt(172)) = 14 over the host, not the 122 of their own.
    assert mine.reserved_blocks == theirs.reserved_blocks == alone.reserved_blocks == 106
    mine.close(tickets[3])
    # 52 expected blocks plus the largest own margin, 10 blocks, in the other worker's row
    # (above ceil(sqrt(72)) = 9).
    assert theirs.reserved_blocks == 62 and t.largest(0, TOP) == 10
    mine.close(tickets[1])
    theirs.close(tickets[0])
    theirs.close(tickets[2])
    assert mine.reserved_blocks == 0
    assert t.total(0, OWN) == t.total(0, BASE) == t.total(0, SPREAD2) == t.largest(0, TOP) == 0


def test_a_successor_ledger_reads_as_changed_after_its_row_was_cleared() -> None:
    t = table(backends=1)
    first = HostLedger(t, 0, 0)
    first.open(1.0, 4)
    seen = first.version
    t.clear_row(0)
    second = HostLedger(t, 0, 0)
    assert second.inflight == 0 and second.version > seen


def spec(i: int) -> BackendSpec:
    return BackendSpec(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",))


def snap(at: float, free: int) -> BackendSnapshot:
    return BackendSnapshot(taken_at=at, format="vllm", kv_total_blocks=100, kv_free_blocks=free,
                           block_size=16, running=1, waiting=0, models=("m",))


def test_fleets_on_one_table_decide_on_the_hosts_totals() -> None:
    t = table()
    fleets = [Fleet([spec(0), spec(1)]) for _ in range(2)]
    for w, fleet in enumerate(fleets):
        fleet.share_ledgers(lambda i, _id, w=w: HostLedger(t, w, i))
    with fleets[0].lease("b0", 8, 1.0), fleets[1].lease("b0", 2, 1.0):
        for fleet in fleets:
            candidate = fleet.candidate("b0", 1.5)
            assert (candidate.inflight, candidate.reserved_blocks) == (2, 10)
        assert fleets[1].admin_rows(1.5)[0]["inflight"] == 2
    assert fleets[0].candidate("b0", 2.0).inflight == 0


def test_ledgers_are_shared_only_before_the_first_lease() -> None:
    fleet = Fleet([spec(0)])
    with fleet.lease("b0", 1, 0.0):
        pass
    with pytest.raises(RuntimeError):
        fleet.share_ledgers(lambda i, _id: HostLedger(table(1, 1), 0, i))


def test_scrape_events_survive_the_trip() -> None:
    for event in (ScrapeEvent(OK, 1.5, True, snap(1.5, 40)),
                  ScrapeEvent(FAILED, 2.0, True, None, "ScrapeTimeout"),
                  ScrapeEvent(UNREACHABLE, 3.0)):
        assert decode(encode(event)) == event


def test_a_board_gives_each_reader_what_is_new_once() -> None:
    buf = memoryview(bytearray(ScrapeBoard.nbytes(2)))
    ids = ("b0", "b1")
    writer = ScrapeBoard(Slots(buf, 2, 4096), ids)
    readers = [ScrapeBoard(Slots(buf, 2, 4096), ids) for _ in range(2)]
    assert readers[0].fresh() == [] and not readers[0].all_published()
    writer.publish("b0", ScrapeEvent(OK, 1.0, True, snap(1.0, 50)))
    writer.publish("b0", ScrapeEvent(OK, 1.1, True, snap(1.1, 45)))  # the newer one only
    writer.publish("b1", ScrapeEvent(UNREACHABLE, 1.1))
    assert readers[0].all_published()
    for reader in readers:
        got = dict(reader.fresh())
        assert got["b0"].snapshot == snap(1.1, 45) and got["b1"].kind == UNREACHABLE
        assert reader.fresh() == []


def test_a_board_feeds_a_fleet_as_its_poller_would() -> None:
    from routing.shared_snapshots import apply

    fleet = Fleet([spec(0)])
    apply(fleet, "b0", ScrapeEvent(UNREACHABLE, 1.0))
    assert fleet.candidates("m", 1.0) == []
    apply(fleet, "b0", ScrapeEvent(OK, 2.0, True, snap(2.0, 70)))
    assert [c.snapshot for c in fleet.candidates("m", 2.0)] == [snap(2.0, 70)]
    apply(fleet, "b0", ScrapeEvent(FAILED, 3.0, True))
    assert fleet.scrape_failures("b0") == 1


def test_the_hold_table_gives_the_latest_of_every_worker_and_zeros_read_as_past() -> None:
    from routing.shared_health import HoldTable

    t = HoldTable(memoryview(bytearray(HoldTable.nbytes(2, 1))), 2, 1)
    assert t.latest(0) == (0.0, 0.0)
    t.write(0, 0, 10.0, float("-inf"))
    t.write(1, 0, 5.0, 7.0)
    assert t.latest(0) == (10.0, 7.0)


def test_a_fleet_adopts_a_later_ejection_or_hold_and_keeps_its_own_counts() -> None:
    fleet = Fleet([spec(0)])
    fleet.record_success("b0", 0.0)
    fleet.adopt_holds("b0", 0.0, 0.0)  # long past: nothing changes
    assert [c.spec.id for c in fleet.candidates("m", 1.0)] == ["b0"]
    fleet.adopt_holds("b0", 5.0, 3.0)
    assert fleet.candidates("m", 4.0) == [] and not fleet.is_healthy("b0", 4.0)
    assert fleet.health("b0").ejections == 0 and fleet.consecutive_failures("b0") == 0
    fleet.adopt_holds("b0", 2.0, 1.0)  # earlier than its own: kept
    assert fleet.health("b0").ejected_until == 5.0
    assert [c.spec.id for c in fleet.candidates("m", 5.0)] == ["b0"]
