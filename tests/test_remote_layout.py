"""Key names of the bucket layout (vfsd/remote/layout.py): the only place they are built."""

from __future__ import annotations

import pytest

from vfsd.remote.layout import (
    check_run_id,
    chunk_key,
    digest_of_chunk_key,
    intent_key,
    intent_of_name,
    lease_key,
    parse_run_key,
    run_prefix,
)
from vfsd.store.chunks import chunk_hash


def test_chunk_keys_round_trip_and_match_the_local_names():
    digest = chunk_hash(b"some chunk")
    key = chunk_key(digest)
    assert key == f"chunks/{digest.hex()[:2]}/{digest.hex()}"
    assert digest_of_chunk_key(key) == digest
    with pytest.raises(ValueError):
        chunk_key(digest[:8])


@pytest.mark.parametrize("key", [
    "chunks/ab/abc", "chunks/00/" + "ab" * 16, "chunk/ab/" + "ab" * 16,
    "chunks/ab/" + "AB" * 16, "chunks/ab/" + "ab" * 16 + "/x", "runs/x/lease",
])
def test_other_keys_are_not_chunks(key):
    assert digest_of_chunk_key(key) is None


def test_run_keys():
    assert run_prefix("run-1.a_b") == "runs/run-1.a_b"
    assert lease_key("r1") == "runs/r1/lease"
    for bad in ("", ".", "..", "a..b", "a/b", "-a", "_a", "a b", "x" * 129, "é"):
        with pytest.raises(ValueError):
            check_run_id(bad)


def test_intent_keys_of_each_attempt_are_unique_and_parse():
    plain = intent_key("r1", 12, 3)
    one, two = intent_key("r1", 12, 3, "0" * 16), intent_key("r1", 12, 3, "ab" * 8)
    assert len({plain, one, two}) == 3
    for key in (plain, one, two):
        run, kind, rest = parse_run_key(key)
        assert (run, kind, intent_of_name(rest)) == ("r1", "intents", (12, 3))
    for bad in ("x" * 16, "0" * 15, "A" * 16):
        with pytest.raises(ValueError):
            intent_key("r1", 12, 3, bad)
    assert intent_of_name("12-3-" + "0" * 15) is None
