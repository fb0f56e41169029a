"""The object store client against a real SeaweedFS (tests/s3server.py).

URL parsing is checked on its own; every other test talks to a real S3 gateway:
conditional writes (and races between them), reads, listings, batch deletes,
and failures (wrong credentials, a missing bucket, a dead, restarted or frozen
server) that must come out as vfsd's own exceptions, never botocore's.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import botocore.exceptions
import pytest
from remote_helpers import settings_for
from s3server import s3_private_server, s3_server  # noqa: F401 - fixtures

from vfsd.remote.objstore import (
    BadRemoteURL,
    ObjectStore,
    RemoteAccessDenied,
    RemoteConflict,
    RemoteError,
    RemoteNotFound,
    RemoteSettings,
    RemoteUnavailable,
    RemoteURL,
)


@pytest.fixture
def store(s3_server):  # noqa: F811
    st = ObjectStore(s3_server.unique_url("objstore"), settings_for(s3_server))
    yield st
    st.close()


def race(n: int, fn) -> list:
    """Run fn(i) in n threads released at the same moment; their results."""
    barrier = threading.Barrier(n)

    def go(i):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


# ------------------------------------------------------------------ URL parsing


@pytest.mark.parametrize(
    "text, bucket, prefix",
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my.bucket.01/runs", "my.bucket.01", "runs"),
        ("s3://abc/team=a/vfsd/", "abc", "team=a/vfsd"),
        ("s3://abc/a-b_c.d=e", "abc", "a-b_c.d=e"),
    ],
)
def test_good_urls_parse_and_normalize(text, bucket, prefix):
    url = RemoteURL.parse(text)
    assert (url.bucket, url.prefix) == (bucket, prefix)
    assert RemoteURL.parse(str(url)) == url
    assert url.key("chunks/ab/cd") == (f"{prefix}/chunks/ab/cd" if prefix else "chunks/ab/cd")


@pytest.mark.parametrize(
    "text, says",
    [
        ("my-bucket/x", "s3://BUCKET"),
        ("S3://my-bucket", "s3://BUCKET"),
        ("http://my-bucket/x", "s3://BUCKET"),
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://ab", "3 to 63"),
        ("s3://" + "a" * 64, "3 to 63"),
        ("s3://My-Bucket", "lowercase"),
        ("s3://my_bucket", "lowercase"),
        ("s3://-bucket", "begin and end"),
        ("s3://bucket-", "begin and end"),
        ("s3://my..bucket", "'..'"),
        ("s3://my.-bucket", "'.-'"),
        ("s3://192.168.1.10", "IP address"),
        ("s3://xn--bucket", "reserves"),
        ("s3://bucket-s3alias", "reserves"),
        ("s3://bucket//x", "must not start with '/'"),
        ("s3://bucket/a//b", "empty segment"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket/./b", "'.'"),
        ("s3://bucket/a b", "spaces"),
        ("s3://bucket/a\nb", "control"),
        ("s3://bucket/a?x=1", "query"),
        ("s3://bucket/a#frag", "query or fragment"),
        ("s3://bucket/caf\u00e9", "contains"),
        ("s3://bucket/a*b", "contains '*'"),
        ("s3://bucket/a+b", "contains '+'"),
        ("s3://bucket/" + "a" * 300, "over 255 bytes"),
        ("s3://bucket/" + "/".join(["a" * 200] * 3), "at most 512"),
    ],
)
def test_bad_urls_are_refused_with_a_reason(text, says):
    with pytest.raises(BadRemoteURL) as info:
        RemoteURL.parse(text)
    assert says in str(info.value)


def test_relative_keys_cannot_escape_the_prefix(store):
    for key in ("", "/abs", "a//b", "a/../b", "..", "a/", "./a"):
        with pytest.raises(ValueError):
            store.head(key)


# ------------------------------------------------------- SeaweedFS's own behaviour


def test_seaweedfs_honours_if_none_match_star(s3_server):  # noqa: F811
    client = s3_server.client()
    key = "raw/" + s3_server.unique_url("inm").rsplit("/", 1)[1]
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"first"


def test_seaweedfs_honours_if_match(s3_server):  # noqa: F811
    client = s3_server.client()
    key = "raw/" + s3_server.unique_url("im").rsplit("/", 1)[1]
    etag = client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"v1")["ETag"]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"x", IfMatch='"0123abcd"')
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    etag2 = client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"v2", IfMatch=etag)["ETag"]
    with pytest.raises(botocore.exceptions.ClientError):  # the old ETag is stale now
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"v3", IfMatch=etag)
    assert etag2 != etag
    assert client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"v2"


# ------------------------------------------------------------ conditional writes


def test_put_if_absent_creates_once(store):
    assert store.put_if_absent("chunks/aa/one", b"payload") is True
    assert store.put_if_absent("chunks/aa/one", b"payload") is False
    assert store.get("chunks/aa/one").data == b"payload"


def test_put_if_absent_race_has_exactly_one_winner(store):
    for rounds, writers in ((30, 2), (5, 4)):
        for r in range(rounds):
            key = f"race/{writers}/{r}"
            results = race(writers, lambda i, key=key: store.put_if_absent(key, b"w%d" % i * 999))
            assert results.count(True) == 1, results
            winner = results.index(True)
            assert store.get(key).data == b"w%d" % winner * 999


def test_compare_and_swap(store):
    etag1 = store.put("ptr", b"v1", if_none_match=True)
    with pytest.raises(RemoteConflict):
        store.put("ptr", b"again", if_none_match=True)
    etag2 = store.put("ptr", b"v2", if_match=etag1)
    with pytest.raises(RemoteConflict):
        store.put("ptr", b"v3", if_match=etag1)  # stale
    fetched = store.get("ptr")
    assert (fetched.data, fetched.etag) == (b"v2", etag2)
    with pytest.raises((RemoteConflict, RemoteNotFound)):  # AWS says 404, SeaweedFS 412
        store.put("absent", b"x", if_match=etag2)
    assert not store.exists("absent")


def test_compare_and_swap_race_has_exactly_one_winner(store):
    store.put("counter", b"0")
    for r in range(25):
        etag = store.head("counter").etag

        def swap(i, etag=etag, r=r):
            try:
                store.put("counter", b"%d by %d" % (r + 1, i), if_match=etag)
                return i
            except RemoteConflict:
                return None

        winners = [w for w in race(2, swap) if w is not None]
        assert len(winners) == 1
        assert store.get("counter").data == b"%d by %d" % (r + 1, winners[0])


# ------------------------------------------------------------ reads and listings


def test_get_range_head_and_size_limit(store):
    data = bytes(range(256)) * 40
    store.put("blob", data)
    assert store.get("blob").data == data
    assert store.get("blob", start=100, length=50).data == data[100:150]
    assert store.get("blob", start=10_000).data == data[10_000:]
    info = store.head("blob")
    assert info.size == len(data) and info.key == "blob" and info.etag
    fetched = store.get("blob")
    assert fetched.server_time is not None and fetched.last_modified > 0
    with pytest.raises(RemoteError, match="at most 1000"):
        store.get("blob", max_bytes=1000)
    with pytest.raises(RemoteError, match="not satisfiable"):
        store.get("blob", start=len(data) + 10, length=5)


def test_missing_objects(store):
    with pytest.raises(RemoteNotFound):
        store.get("nothing/here")
    with pytest.raises(RemoteNotFound):
        store.head("nothing/here")
    assert store.exists("nothing/here") is False
    assert list(store.list("nothing/")) == []


def test_list_pages_and_batch_delete(store):
    keys = [f"many/{i:05d}" for i in range(2100)]  # three pages, three delete batches
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put_if_absent(k, k.encode()), keys))
    store.put("other/x", b"x")
    listed = list(store.list("many/"))
    assert [o.key for o in listed] == keys
    assert all(o.size == len(o.key) for o in listed)
    assert {o.key for o in store.list()} == {*keys, "other/x"}
    assert store.delete(keys + ["many/not-there"]) == 2101
    assert list(store.list("many/")) == []
    assert store.exists("other/x")


def test_prefixes_do_not_see_each_other(s3_server):  # noqa: F811
    base = s3_server.unique_url("iso") + "/team=a.b_c-d"
    a = ObjectStore(base + "/a", settings_for(s3_server))
    ab = ObjectStore(base + "/ab", settings_for(s3_server))
    a.put("k", b"a")
    ab.put("k", b"ab")
    assert [o.key for o in a.list()] == ["k"]
    assert a.get("k").data == b"a" and ab.get("k").data == b"ab"


# ---------------------------------------------------------------- configuration


def test_credentials_from_the_standard_environment(s3_server, monkeypatch, tmp_path):  # noqa: F811
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    store = ObjectStore(s3_server.unique_url("env"), RemoteSettings(max_attempts=1))
    assert store.endpoint == s3_server.endpoint_url
    store.check()
    assert store.put_if_absent("k", b"v") is True


def test_credentials_from_a_profile_and_a_credentials_file(s3_server, monkeypatch, tmp_path):  # noqa: F811
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    creds = tmp_path / "creds"
    creds.write_text(f"[vfsd]\naws_access_key_id = {s3_server.access_key}\n"
                     f"aws_secret_access_key = {s3_server.secret_key}\n")
    settings = RemoteSettings(endpoint_url=s3_server.endpoint_url, profile="vfsd",
                              credentials_file=str(creds), max_attempts=1)
    ObjectStore(s3_server.unique_url("prof"), settings).check()
    with pytest.raises(RemoteAccessDenied, match="profile 'other'"):
        ObjectStore(s3_server.url(), RemoteSettings(endpoint_url=s3_server.endpoint_url,
                                                    profile="other",
                                                    credentials_file=str(creds)))
    with pytest.raises(RemoteAccessDenied, match="does not exist"):
        ObjectStore(s3_server.url(), RemoteSettings(credentials_file=str(tmp_path / "nope")))


def test_wrong_credentials_are_access_denied(s3_server):  # noqa: F811
    store = ObjectStore(s3_server.unique_url("bad"),
                        settings_for(s3_server, secret_access_key="wrong" * 8))
    for call in (store.check, lambda: store.put("k", b"v"), lambda: store.get("k"),
                 lambda: list(store.list())):
        with pytest.raises(RemoteAccessDenied, match="credentials"):
            call()


def test_missing_bucket_is_named(s3_server):  # noqa: F811
    store = ObjectStore("s3://no-such-bucket-here/x", settings_for(s3_server))
    for call in (store.check, lambda: store.put_if_absent("k", b"v"), lambda: store.get("k")):
        with pytest.raises(RemoteError, match="no-such-bucket-here") as info:
            call()
        assert not isinstance(info.value, RemoteNotFound)


# ------------------------------------------------------------------------ faults


def test_unreachable_endpoint_is_unavailable_after_bounded_retries(s3_private_server):  # noqa: F811
    store = ObjectStore(s3_private_server.unique_url("down"),
                        settings_for(s3_private_server, max_attempts=3))
    s3_private_server.kill()
    with pytest.raises(RemoteUnavailable, match="unreachable"):
        store.put_if_absent("k", b"v")
    assert store.stats["retries"] == 2 and store.stats["requests"] == 3
    s3_private_server.restart()
    assert store.put_if_absent("k", b"v") is True  # the same client works again


def test_frozen_server_times_out_instead_of_hanging(s3_private_server):  # noqa: F811
    store = ObjectStore(s3_private_server.unique_url("frozen"),
                        settings_for(s3_private_server, read_timeout=0.5, connect_timeout=0.5,
                                     max_attempts=2))
    store.put("k", b"v")
    with s3_private_server.paused_for_a_while():
        with pytest.raises(RemoteUnavailable):
            store.get("k")
        with pytest.raises(RemoteUnavailable):
            store.put("k2", b"x" * (4 << 20))  # a body larger than the socket buffers
    assert store.get("k").data == b"v"


def test_closed_store_stops_retrying(s3_private_server):  # noqa: F811
    store = ObjectStore(s3_private_server.unique_url("closed"),
                        settings_for(s3_private_server, max_attempts=100,
                                     retry_base_delay=5, retry_max_delay=5))
    s3_private_server.kill()
    failed = threading.Event()

    def call():
        try:
            store.get("k")
        except RemoteUnavailable:
            failed.set()

    t = threading.Thread(target=call)
    t.start()
    store.close()
    t.join(timeout=60)
    assert failed.is_set()
