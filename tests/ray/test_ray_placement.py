"""Which shard owns a session: the same answer in every front end and every version, spread
evenly, and moving only the sessions a new shard takes (rendezvous hashing)."""

from __future__ import annotations

from collections import Counter

import pytest

from ctxactors.ray._hashing import owner, score


def test_scores_and_owners_are_fixed_values_every_front_end_computes_alike() -> None:
    # Pinned: front ends and shards of different versions (or restarted with another hash
    # seed) must agree on every owner, so the hash is part of the wire contract.
    assert [score(("alice", "s1"), shard) for shard in range(3)] == [
        0x8C36EBDC1A20B3A6,
        0x62632BFA66020643,
        0xEEDD82EA085BBC7D,
    ]
    assert [score((None, "s1"), shard) for shard in range(3)] == [
        0xCB6292481482EC70,
        0x5A516DB15B4D1F92,
        0x44E4005FACA1D020,
    ]
    assert [owner(("alice", "s1"), n) for n in (1, 2, 3, 4, 5)] == [0, 0, 2, 2, 2]
    assert [owner(("bob", "s1"), n) for n in (1, 2, 3, 4, 5)] == [0, 1, 1, 1, 1]
    assert [owner((None, "s1"), n) for n in (1, 2, 3, 4, 5)] == [0, 0, 0, 0, 0]


def test_the_principal_is_part_of_the_placement() -> None:
    # A's "s1" is not B's: the same session id of two principals lands independently, so
    # about a quarter of them agree on 4 shards (not all, as if the principal were ignored).
    same = sum(owner((None, f"s{i}"), 4) == owner(("p", f"s{i}"), 4) for i in range(4000))
    assert same == 1022
    assert score(("a", "b"), 0) != score(("b", "b"), 0) != score(("b", "a"), 0)


def test_sessions_spread_evenly_over_the_shards() -> None:
    counts = Counter(owner((None, f"s{i}"), 4) for i in range(4000))
    assert sorted(counts.items()) == [(0, 979), (1, 1019), (2, 984), (3, 1018)]
    # Whatever the pinned counts, the property they show: each shard within 5% of a quarter.
    assert all(abs(n - 1000) < 50 for n in counts.values())


def test_a_new_shard_takes_only_its_share_and_the_others_keep_theirs() -> None:
    sessions = [(None, f"s{i}") for i in range(4000)]
    moved = [s for s in sessions if owner(s, 4) != owner(s, 5)]
    # Every session that moves goes to the new shard, and it takes about a fifth of them.
    assert {owner(s, 5) for s in moved} == {4}
    assert len(moved) == 800


def test_one_shard_owns_everything_and_no_shard_is_refused() -> None:
    assert {owner((p, f"s{i}"), 1) for p in (None, "a") for i in range(50)} == {0}
    for shards in (0, -3):
        with pytest.raises(ValueError, match=f"^shards must be at least 1, got {shards}$"):
            owner((None, "s1"), shards)
