"""The run lease against a real SeaweedFS: one writer per run.

Races between workers (threads, each its own Lease and owner token), expiry
and takeover after a real SIGKILL of the holder, loss detection when the
object store is frozen past the TTL, a frozen holder that wakes up after a
takeover, and skewed worker clocks (expiry is judged on the server's clock).
Waits are for events, with generous limits; nothing asserts a duration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import trio
from remote_helpers import settings_for
from s3server import s3_private_server, s3_server  # noqa: F401 - fixtures

from vfsd.remote.layout import lease_key
from vfsd.remote.lease import Lease, LeaseHeld, LeaseLost
from vfsd.remote.objstore import ObjectStore


@pytest.fixture
def store(s3_server):  # noqa: F811
    st = ObjectStore(s3_server.unique_url("lease"), settings_for(s3_server))
    yield st
    st.close()


def wait_for(predicate, limit: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {limit} s")
        time.sleep(0.05)


def race(n: int, fn) -> list:
    barrier = threading.Barrier(n)

    def go(i):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


def try_acquire(lease: Lease) -> bool:
    try:
        lease.acquire()
        return True
    except LeaseHeld:
        return False


# ---------------------------------------------------------------- basic life


def test_acquire_renew_release_and_the_next_owner(store):
    a = Lease(store, "run-1", ttl=30)
    assert not a.valid
    with pytest.raises(LeaseLost, match="never acquired"):
        a.check()
    a.acquire()
    assert a.valid and a.generation == 1
    a.check()
    b = Lease(store, "run-1", ttl=30)
    with pytest.raises(LeaseHeld) as held:
        b.acquire()
    assert held.value.holder["owner"]["pid"] == os.getpid()
    assert "held by" in str(held.value)
    a.renew()
    a.renew()
    assert a.valid
    a.release()
    assert not a.valid
    b.acquire()  # a released lease is taken at once
    assert b.valid and b.generation == 2
    with pytest.raises(LeaseLost):
        a.renew()
    body = json.loads(store.get(lease_key("run-1")).data)
    assert body["owner"]["token"] == b.owner.token and body["generation"] == 2


def test_a_release_during_a_renewal_in_flight_still_releases(store):
    # A run's end abandons its background renewal (a worker thread) and
    # releases. When the renewal's write landed but its answer had not yet come
    # back, the release once wrote with the ETag that write replaced: refused,
    # the lease stayed renewed, and the next replica waited out a TTL.
    a = Lease(store, "ending", ttl=30)
    a.acquire()
    landed, go_on = threading.Event(), threading.Event()
    real_put = store.put

    def put_then_pause(key, body, **kw):
        etag = real_put(key, body, **kw)
        if threading.current_thread().name == "renewal":
            landed.set()
            go_on.wait(10)  # the answer is still on its way
        return etag

    store.put = put_then_pause
    renewal = threading.Thread(target=a.renew, name="renewal")
    renewal.start()
    assert landed.wait(10)
    releasing = ThreadPoolExecutor(1).submit(a.release)
    time.sleep(0.2)  # the release is under way (it waits for the renewal)
    go_on.set()
    renewal.join(10)
    assert releasing.result(10) is True
    assert json.loads(store.get(lease_key("ending")).data)["released"]
    b = Lease(store, "ending", ttl=30)
    b.acquire()  # at once: no TTL to wait out
    assert b.generation == 2


def test_bad_run_ids_are_refused(store):
    for bad in ("", "..", "a/b", "-x", "x" * 129, "a b"):
        with pytest.raises(ValueError):
            Lease(store, bad)


# -------------------------------------------------------------------- races


def test_two_workers_racing_for_a_new_run_one_wins(store):
    for r in range(30):
        leases = [Lease(store, f"new-{r}", ttl=30) for _ in range(2)]
        won = race(2, lambda i, leases=leases: try_acquire(leases[i]))
        assert won.count(True) == 1, (r, won)
        assert [lease.valid for lease in leases] == won
        winner = leases[won.index(True)]
        assert json.loads(store.get(lease_key(f"new-{r}")).data)["owner"]["token"] == \
            winner.owner.token


def test_workers_racing_to_take_over_a_released_run_one_wins(store):
    previous = Lease(store, "handover", ttl=30)
    previous.acquire()
    for r in range(20):
        previous.release()
        n = 3 if r % 5 == 0 else 2
        leases = [Lease(store, "handover", ttl=30) for _ in range(n)]
        won = race(n, lambda i, leases=leases: try_acquire(leases[i]))
        assert won.count(True) == 1, (r, won)
        previous = leases[won.index(True)]
        assert previous.generation == r + 2


# -------------------------------------------------------- expiry and takeover


def test_renewals_keep_the_lease_past_its_ttl(store):
    holder = Lease(store, "long-lived", ttl=3)
    holder.acquire()
    taker = Lease(store, "long-lived", ttl=3)
    refused = 0
    end = time.monotonic() + 2 * holder.ttl + 1  # well past the first expiry
    while time.monotonic() < end:
        holder.renew()
        with pytest.raises(LeaseHeld):
            taker.acquire()
        refused += 1
        time.sleep(0.5)
    assert holder.valid and holder.generation == 1 and refused

HOLDER = textwrap.dedent("""
    import sys, trio, structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    from vfsd.remote.lease import Lease
    from vfsd.remote.objstore import ObjectStore, RemoteSettings
    store = ObjectStore(sys.argv[1], RemoteSettings(max_attempts=2, read_timeout=2))
    lease = Lease(store, "crashy", ttl=float(sys.argv[2]))
    lease.acquire()
    async def main():
        async with trio.open_nursery() as n:
            await n.start(lease.keep_renewed)
            print("HELD", lease.generation, flush=True)
    trio.run(main)
""")


def test_a_killed_holders_lease_expires_and_is_taken_over(s3_server, store):  # noqa: F811
    env = {**os.environ, **s3_server.env}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.url), "6"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                             text=True)
    try:
        assert child.stdout.readline().split() == ["HELD", "1"]
        wait_for(lambda: json.loads(store.get(lease_key("crashy")).data)["seq"] >= 2,
                 what="a background renewal")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    taker = Lease(store, "crashy", ttl=6)
    with pytest.raises(LeaseHeld):  # not yet: the dead holder renewed moments ago
        taker.acquire()
    taker.acquire(wait=60)
    assert taker.valid and taker.generation == 2
    body = json.loads(store.get(lease_key("crashy")).data)
    assert body["owner"]["token"] == taker.owner.token


def test_a_damaged_lease_object_is_taken_over_after_a_ttl(s3_server, store):  # noqa: F811
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=store.url.key(lease_key("junk")),
                                  Body=b"not json at all")
    lease = Lease(store, "junk", ttl=3)
    with pytest.raises(LeaseHeld, match="damaged"):
        lease.acquire()
    lease.acquire(wait=60)
    assert lease.valid and lease.generation == 1


def test_a_stalled_holder_has_stopped_before_it_is_taken_over(store):
    a = Lease(store, "frozen-holder", ttl=3)
    a.acquire()
    # A stops renewing (a stalled process); B waits for the lease to lapse.
    b = Lease(store, "frozen-holder", ttl=3)
    b.acquire(wait=60)
    assert b.generation == 2
    assert not a.valid  # its own clock ran out first: it had already stopped
    with pytest.raises(LeaseLost):
        a.renew()
    assert b.valid


def test_a_restarted_owner_takes_its_lease_with_a_new_generation(store):
    """A daemon restarted with its owner token takes its lease back at once, but
    as a new generation: the earlier holder (an older process still running, a
    copied store) loses it at its next renewal instead of sharing generation 1."""
    first = Lease(store, "same-token", ttl=30)
    first.acquire()
    again = Lease(store, "same-token", ttl=30, owner=first.owner)
    again.acquire()  # no wait: it is its own token
    assert again.generation == first.generation + 1
    with pytest.raises(LeaseLost, match="generation 2"):
        first.renew()
    assert not first.valid and again.valid
    again.renew()
    body = json.loads(store.get(lease_key("same-token")).data)
    assert body["generation"] == 2 and body["session"] == again.session


def test_renewal_conflict_means_lost_at_once(s3_server, store):  # noqa: F811
    a = Lease(store, "stolen", ttl=60)
    a.acquire()
    # Someone rewrites the lease behind A's back (an operator, a buggy worker).
    intruder = Lease(store, "stolen", ttl=60)
    intruder._acquired_at = time.time()
    key = store.url.key(lease_key("stolen"))
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=intruder._body(7))
    assert a.valid  # A cannot know before it talks to the store
    with pytest.raises(LeaseLost, match="taken over"):
        a.renew()
    assert not a.valid and "generation 7" in a.lost_reason
    with pytest.raises(LeaseLost):
        a.check()


def test_a_renewal_whose_answer_was_lost_is_recognised(store):
    a = Lease(store, "lost-answer", ttl=30)
    a.acquire()
    a._etag = '"00000000000000000000000000000000"'  # as if our last write's answer was lost
    a.renew()
    assert a.valid
    a.renew()  # and the ETag it adopted works


def test_expiry_is_judged_on_the_server_clock_not_the_workers(store):
    # The holder's wall clock is an hour fast: its body claims a far expiry.
    fast = Lease(store, "skewed", ttl=3, wall_clock=lambda: time.time() + 3600)
    fast.acquire()
    assert json.loads(store.get(lease_key("skewed")).data)["expires_at"] > time.time() + 3000
    # A taker whose own clock is an hour fast cannot take a live lease early...
    early = Lease(store, "skewed", ttl=3, wall_clock=lambda: time.time() + 3600)
    with pytest.raises(LeaseHeld):
        early.acquire()
    # ...and a taker with an exact clock still takes it once the server says it lapsed.
    slow = Lease(store, "skewed", ttl=3, wall_clock=lambda: time.time() - 3600)
    slow.acquire(wait=60)
    assert slow.generation == 2


# ---------------------------------------------- background renewal and faults


def test_background_renewal_keeps_the_lease_and_a_frozen_store_loses_it(s3_private_server):  # noqa: F811
    store = ObjectStore(s3_private_server.unique_url("pause"),
                        settings_for(s3_private_server, read_timeout=1.0, connect_timeout=1.0))
    lease = Lease(store, "paused", ttl=4)
    lease.acquire()
    reasons: list[str] = []
    seen_renewals = []

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(lease.keep_renewed, reasons.append)
            # Renewals happen in the background and keep the lease.
            first = json.loads(store.get(lease_key("paused")).data)["seq"]
            while json.loads(store.get(lease_key("paused")).data)["seq"] < first + 2:
                await trio.sleep(0.1)
            seen_renewals.append(True)
            assert lease.valid
            # Freeze the store for longer than the TTL: the renewal hangs.
            s3_private_server.pause()
            try:
                with trio.fail_after(60):
                    while not reasons:
                        await trio.sleep(0.05)
                assert not lease.valid
                with pytest.raises(LeaseLost, match="not renewed"):
                    lease.check()
            finally:
                s3_private_server.resume()

    trio.run(main)
    assert seen_renewals and len(reasons) == 1 and "not renewed" in reasons[0]
    # The store is back, but a lost lease stays lost...
    with pytest.raises(LeaseLost):
        lease.renew()
    assert not lease.valid
    # ...and another worker takes the run over once the server says it lapsed.
    other = Lease(store, "paused", ttl=4)
    other.acquire(wait=60)
    assert other.generation == 2
