"""The search index's high-water marks (engine/store/search_index.py): how far a mark may move
when PostgreSQL commits ids out of order, and the range one batch takes."""

from __future__ import annotations

from engine.store.search_index import Horizon, Marks, next_range, usable_needle


def test_one_writer_settles_what_it_sees():
    assert Horizon().settled(500, None, None) == 500


def test_a_sighting_settles_once_every_transaction_running_then_has_ended():
    horizon = Horizon()
    assert horizon.settled(100, xmin=10, xmax=15) is None  # 10..14 may still commit a lower seq
    assert horizon.settled(180, xmin=12, xmax=20) is None  # 12..14 still running: 100 not final yet
    assert horizon.settled(250, xmin=15, xmax=22) == 100  # all of them ended: up to 100 is final
    assert horizon.settled(300, xmin=21, xmax=30) is None  # the sighting at 250 waits for xid 21
    assert horizon.settled(310, xmin=22, xmax=31) == 250


def test_a_batch_takes_at_most_its_size_and_never_passes_the_settled_id():
    assert next_range(0, 12_000, 5_000) == (0, 5_000)
    assert next_range(10_000, 12_000, 5_000) == (10_000, 12_000)
    assert next_range(12_000, 12_000, 5_000) is None
    assert next_range(12_000, 11_000, 5_000) is None  # a mark never goes back


def test_a_search_scans_directly_only_a_short_tail():
    assert Marks(seq=10, failure_id=0, newest_seq=10 + 50_000, newest_failure_id=0).caught_up
    assert not Marks(seq=10, failure_id=0, newest_seq=10 + 50_001, newest_failure_id=0).caught_up
    assert not Marks(seq=10, failure_id=0, newest_seq=10, newest_failure_id=50_001).caught_up


def test_needles_a_trigram_index_can_answer():
    assert usable_needle("abc") and usable_needle("é✓x")
    assert not usable_needle("ab") and not usable_needle("a\x00bc")
