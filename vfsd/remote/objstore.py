"""The object store: the only module that talks S3 (through boto3).

`RemoteURL` parses and checks `s3://BUCKET/PREFIX`. `ObjectStore` is one bucket
prefix on one endpoint; its methods take keys *relative* to the prefix
(`chunks/ab/abcd...`), block, and are meant to run in worker threads
(`trio.to_thread.run_sync`), never on the trio thread. One boto3 client is made
at construction (sessions are not thread-safe, clients are) and shared by every
thread.

Every call is bounded: a connect timeout and a read timeout per attempt, at most
`max_attempts` attempts, and an optional `deadline` (a `time.monotonic()` value)
after which no new attempt starts. Only transient failures are retried
(connection errors, timeouts, truncated bodies, 5xx, 429 and the S3 throttling
codes), after an exponential delay with jitter. boto3 and botocore exceptions
never leave this module: callers see `RemoteError` and its subclasses, which say
what happened in words a user can act on.

Conditional writes: `put_if_absent` sends `If-None-Match: *` (content-addressed
objects: a second writer of the same name learns it is already there), `put`
with `if_match=ETAG` is a compare-and-swap for the few mutable objects (the
lease, run pointers). Both are honoured by AWS S3 and by SeaweedFS, which checks
the condition under a per-object lock on its filer (tests/test_objstore.py
races them).

Integrity: uploads carry Content-MD5 (the server refuses a body damaged in
transit); botocore's newer default trailing checksums are off because many
S3-compatible stores reject them. Objects read back are checked by the caller
against the name they were stored under (chunks by xxh3-128).
"""

from __future__ import annotations

import base64
import email.utils
import errno
import functools
import hashlib
import http.client
import ipaddress
import random
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import botocore.exceptions

# boto3 and botocore are imported by the first client made (`_make_client`) and by
# `_translate`: a daemon without a remote never loads them (~11 MiB, ~250 ms).

from vfsd.latency import Latencies

# --------------------------------------------------------------------- errors


class RemoteError(Exception):
    """The object store refused a request, or answered something unusable."""

    errno = errno.EIO


class RemoteUnavailable(RemoteError):
    """The object store cannot be reached or keeps failing; trying later may work."""


class RemoteNotFound(RemoteError):
    """No object under that key."""

    errno = errno.ENOENT


class RemoteConflict(RemoteError):
    """A conditional write lost: the object is not in the state it was asked to be in."""


class RemoteAccessDenied(RemoteError):
    """Credentials are missing, wrong, or not allowed to do this."""

    errno = errno.EACCES


class RemoteTooLarge(RemoteError):
    """An object is larger than the caller said it could be (damaged or hostile)."""


class BadRemoteURL(ValueError):
    """An `s3://BUCKET/PREFIX` URL that vfsd will not use; the message says why."""


# ------------------------------------------------------------------------ URL

MAX_PREFIX_BYTES = 512  # S3 keys are at most 1024 bytes; vfsd's names need the rest
MAX_SEGMENT_BYTES = 255
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Characters that need no care in any S3 implementation's key handling ('+',
# for one, is read as a space by some).
_SEGMENT = re.compile(r"[A-Za-z0-9._=-]+")
_BUCKET_PREFIXES_RESERVED = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_SUFFIXES_RESERVED = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


@dataclass(frozen=True)
class RemoteURL:
    """A bucket and a key prefix ('' or segments joined by '/', no slashes at the ends)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, text: str) -> RemoteURL:
        """Parse `s3://BUCKET[/PREFIX]`, strictly; raise BadRemoteURL saying what is wrong."""
        if not isinstance(text, str):
            raise BadRemoteURL(f"a remote URL must be a string, got {type(text).__name__}")
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
            raise BadRemoteURL(f"remote URL {text!r} contains spaces or control characters")
        if not text.startswith("s3://"):
            raise BadRemoteURL(f"remote URL {text!r} must look like s3://BUCKET/PREFIX")
        rest = text[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if "?" in rest or "#" in rest:
            raise BadRemoteURL(f"remote URL {text!r} must not have a query or fragment")
        check_bucket_name(bucket)
        return cls(bucket, normalize_prefix(prefix))

    def key(self, relative: str) -> str:
        """The full object key of `relative` under this prefix."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def check_bucket_name(bucket: str) -> str:
    """`bucket` if it follows S3's bucket naming rules, else BadRemoteURL."""
    if not bucket:
        raise BadRemoteURL("the remote URL names no bucket (s3://BUCKET/PREFIX)")
    if not 3 <= len(bucket) <= 63:
        raise BadRemoteURL(f"bucket name {bucket!r} must be 3 to 63 characters long")
    if not _BUCKET.fullmatch(bucket):
        raise BadRemoteURL(
            f"bucket name {bucket!r} may hold only lowercase letters, digits, '.' and '-', "
            "and must begin and end with a letter or digit")
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        raise BadRemoteURL(f"bucket name {bucket!r} must not have '..', '.-' or '-.'")
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        pass
    else:
        raise BadRemoteURL(f"bucket name {bucket!r} must not look like an IP address")
    if bucket.startswith(_BUCKET_PREFIXES_RESERVED) or bucket.endswith(_BUCKET_SUFFIXES_RESERVED):
        raise BadRemoteURL(f"bucket name {bucket!r} uses a prefix or suffix S3 reserves")
    return bucket


def normalize_prefix(prefix: str) -> str:
    """A key prefix without leading or trailing '/', checked segment by segment.

    Refused: empty segments ('a//b'), '.' and '..', characters outside
    letters, digits and `._=-`, segments over 255 bytes, prefixes over 512.
    """
    if prefix.startswith("/"):
        raise BadRemoteURL(f"prefix {prefix!r} must not start with '/' (s3://BUCKET/PREFIX)")
    stripped = prefix[:-1] if prefix.endswith("/") else prefix
    if not stripped:
        return ""
    if len(stripped.encode()) > MAX_PREFIX_BYTES:
        raise BadRemoteURL(f"prefix is {len(stripped.encode())} bytes long; at most "
                           f"{MAX_PREFIX_BYTES} are allowed")
    for segment in stripped.split("/"):
        if not segment:
            raise BadRemoteURL(f"prefix {prefix!r} has an empty segment ('//')")
        if segment in (".", ".."):
            raise BadRemoteURL(f"prefix {prefix!r} must not contain '.' or '..' segments")
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise BadRemoteURL(f"prefix segment {segment[:20]!r}... is over 255 bytes")
        if not _SEGMENT.fullmatch(segment):
            bad = sorted({c for c in segment if not _SEGMENT.fullmatch(c)})
            raise BadRemoteURL(
                f"prefix {prefix!r} contains {''.join(bad)!r}; use letters, digits and ._=-")
    return stripped


def _check_relative_key(key: str) -> str:
    if not key or key.startswith("/") or key.endswith("/") or "//" in key:
        raise ValueError(f"bad relative object key {key!r}")
    if any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"bad relative object key {key!r}")
    return key


# ------------------------------------------------------------------- settings


@dataclass
class RemoteSettings:
    """How to reach the store; `from_config` maps the daemon's `remote_*` options.

    None means "as the standard AWS chain says" (environment variables, the
    shared config and credentials files, instance metadata).
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    credentials_file: str | None = None
    addressing_style: str = "auto"
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_attempts: int = 5
    retry_base_delay: float = 0.1
    retry_max_delay: float = 10.0
    max_connections: int = 16
    # Explicit keys: for tests and embedding only (never from a config file).
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config) -> RemoteSettings:
        return cls(
            endpoint_url=config.remote_endpoint_url,
            region=config.remote_region,
            profile=config.remote_profile,
            credentials_file=config.remote_credentials_file,
            addressing_style=config.remote_addressing_style,
            connect_timeout=config.remote_connect_timeout,
            read_timeout=config.remote_read_timeout,
            max_attempts=config.remote_max_attempts,
            retry_base_delay=config.remote_retry_base_delay,
            retry_max_delay=config.remote_retry_max_delay,
            max_connections=max(16, 2 * config.remote_workers),
        )


# --------------------------------------------------------------------- results


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD or a listing says of an object. Times are epoch seconds."""

    key: str  # relative to the store's prefix
    size: int
    etag: str  # as the server sent it, quotes included: pass it back to if_match
    last_modified: float


@dataclass(frozen=True)
class Fetched:
    """An object's bytes (or the requested range of them) and what came with them.

    `server_time` is the server's clock when it answered (its Date header,
    one-second resolution), or None if it sent none.
    """

    data: bytes
    etag: str
    last_modified: float
    server_time: float | None


# ---------------------------------------------------------------- classification

# Error codes that mean "try again later", whatever the HTTP status says.
_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
    "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "BadDigest",
    "OperationAborted",
})
_DENIED_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
    "ExpiredToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem",
})
@functools.cache
def _boto_errors() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """botocore's (network-level, credential) failures; the first may or may
    not have been applied by the server."""
    import botocore.exceptions as bx

    network = (
        bx.ConnectionError,  # EndpointConnectionError, ConnectTimeout, ...
        bx.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ...
        bx.IncompleteReadError,
        bx.ResponseStreamingError,
    )
    credentials = (
        bx.NoCredentialsError,
        bx.PartialCredentialsError,
        bx.CredentialRetrievalError,
        bx.ProfileNotFound,
        bx.ConfigNotFound,
    )
    return network, credentials


def _status_and_code(exc: botocore.exceptions.ClientError) -> tuple[int, str, str]:
    response = exc.response or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
    error = response.get("Error", {}) or {}
    return int(status), str(error.get("Code", "")), str(error.get("Message", ""))


def _epoch(value) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else 0.0


def _carries_credentials(endpoint: str) -> bool:
    try:
        parts = urlsplit(endpoint or "")
        return parts.username is not None or parts.password is not None
    except ValueError:
        return "@" in (endpoint or "")


def _is_aws(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def _server_time(response: dict) -> float | None:
    raw = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not raw:
        return None
    try:
        return email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------- store


class ObjectStore:
    """One bucket prefix on one S3-compatible endpoint. Thread-safe."""

    def __init__(self, url: RemoteURL | str, settings: RemoteSettings | None = None) -> None:
        self.url = RemoteURL.parse(url) if isinstance(url, str) else url
        self.settings = settings or RemoteSettings()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "errors": 0, "bytes_up": 0, "bytes_down": 0}
        #: per request kind ("get", "put", "list", ...): each attempt's time, under `_lock`
        self.latency = Latencies()
        self._tally = threading.local()  # see `counted`
        self._client = self._make_client()

    # ------------------------------------------------------------- setup

    def _make_client(self):
        s = self.settings
        if s.credentials_file is not None:
            path = Path(s.credentials_file).expanduser()
            if not path.is_file():
                raise RemoteAccessDenied(f"credentials file {path} does not exist")
            try:
                path.open("rb").close()
            except OSError as exc:
                raise RemoteAccessDenied(f"credentials file {path} cannot be read: {exc}") from None
        import boto3.session
        import botocore.config
        import botocore.exceptions
        import botocore.session

        core = botocore.session.Session()
        if s.credentials_file is not None:
            core.set_config_variable("credentials_file", str(Path(s.credentials_file).expanduser()))
        try:
            session = boto3.session.Session(botocore_session=core, profile_name=s.profile)
        except botocore.exceptions.ProfileNotFound:
            raise RemoteAccessDenied(f"AWS profile {s.profile!r} is not in the AWS config or "
                                     "credentials files") from None
        region = s.region or session.region_name or "us-east-1"
        kwargs = {}
        if s.access_key_id is not None:
            kwargs = {"aws_access_key_id": s.access_key_id,
                      "aws_secret_access_key": s.secret_access_key}

        def client(style: str):
            config = botocore.config.Config(
                region_name=region,
                connect_timeout=s.connect_timeout,
                read_timeout=s.read_timeout,
                retries={"total_max_attempts": 1},  # retries are ours: classified, bounded
                max_pool_connections=s.max_connections,
                s3={"addressing_style": style},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                tcp_keepalive=True,
            )
            try:
                return session.client("s3", endpoint_url=s.endpoint_url, config=config, **kwargs)
            except (botocore.exceptions.BotoCoreError, ValueError) as exc:
                raise RemoteError(f"cannot set up the S3 client for {self.url}: {exc}") from None

        made = client("path" if s.addressing_style == "auto" else s.addressing_style)
        if _carries_credentials(made.meta.endpoint_url):
            made.close()
            # Whatever set it (the option refuses it; AWS_ENDPOINT_URL or a
            # profile's endpoint_url did not), it would be shown in every
            # message and log line that names the endpoint: never used.
            raise RemoteAccessDenied(
                "the S3 endpoint URL carries credentials (user:password@), from "
                "AWS_ENDPOINT_URL or the AWS profile's endpoint_url; vfsd takes none in a URL: "
                "remove them and use AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile or "
                "remote_credentials_file")
        self.endpoint = made.meta.endpoint_url
        if s.addressing_style == "auto" and _is_aws(self.endpoint):
            # AWS prefers the bucket in the host name; other stores (an endpoint
            # URL from the options, AWS_ENDPOINT_URL or a profile) rarely serve it.
            made.close()
            made = client("virtual")
        return made

    def close(self) -> None:
        """Stop retrying: calls in their backoff sleep give up at once."""
        self._closed.set()
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    def __repr__(self) -> str:
        return f"ObjectStore({self.url}, endpoint={self.endpoint!r})"

    # ------------------------------------------------------------ operations

    def check(self, deadline: float | None = None) -> None:
        """Prove the bucket is reachable with these credentials (HEAD bucket)."""
        self._call("check", "", lambda: self._client.head_bucket(Bucket=self.url.bucket),
                   deadline)

    def put_if_absent(self, key: str, data: bytes, deadline: float | None = None) -> bool:
        """Create `key` with `data` unless it exists: True if created, False if it was there.

        For content-addressed objects, where an object already under the name
        holds the same bytes. A retry after a lost answer may report False for
        an object this very call created.
        """
        full = self.url.key(_check_relative_key(key))
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()

        def op():
            return self._client.put_object(Bucket=self.url.bucket, Key=full, Body=data,
                                           ContentMD5=md5, IfNoneMatch="*")

        try:
            self._call("put", key, op, deadline, conflict_is_transient=True)
        except RemoteConflict:
            return False
        self._count("bytes_up", len(data))
        return True

    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: bool = False, deadline: float | None = None) -> str:
        """Write `key` and return its new ETag.

        `if_match=ETAG`: only if the object still has that ETag (compare-and-swap);
        `if_none_match=True`: only if it does not exist. A lost condition raises
        RemoteConflict. A retry after a lost answer may raise RemoteConflict for
        a write that landed: callers of conditional writes read the object back
        to tell (the lease does).
        """
        full = self.url.key(_check_relative_key(key))
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        extra = {}
        if if_match is not None:
            extra["IfMatch"] = if_match
        if if_none_match:
            extra["IfNoneMatch"] = "*"

        def op():
            return self._client.put_object(Bucket=self.url.bucket, Key=full, Body=data,
                                           ContentMD5=md5, **extra)

        response = self._call("put", key, op, deadline)
        self._count("bytes_up", len(data))
        return response.get("ETag", "")

    def get(self, key: str, *, start: int | None = None, length: int | None = None,
            max_bytes: int | None = None, deadline: float | None = None) -> Fetched:
        """The object's bytes, or `length` bytes from `start`.

        An object (or range) larger than `max_bytes` is refused before its body
        is read, so a hostile or damaged bucket cannot make this call swallow
        memory.
        """
        full = self.url.key(_check_relative_key(key))
        extra = {}
        if start is not None or length is not None:
            first = start or 0
            if first < 0 or (length is not None and length <= 0):
                raise ValueError(f"bad range start={start} length={length}")
            extra["Range"] = f"bytes={first}-{first + length - 1}" if length else f"bytes={first}-"

        def op():
            response = self._client.get_object(Bucket=self.url.bucket, Key=full, **extra)
            body = response["Body"]
            try:
                size = int(response.get("ContentLength", -1))
                if max_bytes is not None and (size < 0 or size > max_bytes):
                    raise RemoteTooLarge(f"object {full} is {size} bytes; at most {max_bytes} "
                                         "were expected")
                data = body.read()
            finally:
                body.close()
            return response, data

        response, data = self._call("get", key, op, deadline)
        self._count("bytes_down", len(data))
        return Fetched(data, response.get("ETag", ""), _epoch(response.get("LastModified")),
                       _server_time(response))

    def head(self, key: str, deadline: float | None = None) -> ObjectInfo:
        """Size, ETag and time of `key`; RemoteNotFound if there is none."""
        full = self.url.key(_check_relative_key(key))
        response = self._call(
            "head", key, lambda: self._client.head_object(Bucket=self.url.bucket, Key=full),
            deadline)
        return ObjectInfo(key, int(response.get("ContentLength", 0)), response.get("ETag", ""),
                          _epoch(response.get("LastModified")))

    def exists(self, key: str, deadline: float | None = None) -> bool:
        try:
            self.head(key, deadline)
        except RemoteNotFound:
            return False
        return True

    def list(self, prefix: str = "", deadline: float | None = None) -> Iterator[ObjectInfo]:
        """Every object whose relative key starts with `prefix`, in key order.

        Pages of up to 1,000 keys are fetched as the iterator advances, each page
        with its own retries.
        """
        if prefix:
            if prefix.startswith("/") or "//" in prefix:
                raise ValueError(f"bad list prefix {prefix!r}")
        full_prefix = self.url.key(prefix) if prefix else (
            self.url.prefix + "/" if self.url.prefix else "")
        skip = len(self.url.prefix) + 1 if self.url.prefix else 0
        token: str | None = None
        while True:
            args = {"Bucket": self.url.bucket, "Prefix": full_prefix, "MaxKeys": 1000}
            if token:
                args["ContinuationToken"] = token
            page = self._call("list", prefix, lambda args=args: self._client.list_objects_v2(**args),
                              deadline)
            for item in page.get("Contents", []) or []:
                key = item.get("Key", "")
                if not key.startswith(full_prefix):
                    continue  # a server that answers outside the prefix is not believed
                yield ObjectInfo(key[skip:], int(item.get("Size", 0)), item.get("ETag", ""),
                                 _epoch(item.get("LastModified")))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete(self, keys: Iterable[str], deadline: float | None = None) -> int:
        """Delete objects (missing ones are fine); return how many were asked for.

        Batches of 1,000 keys per request. Raises RemoteError naming the keys
        the server refused to delete.

        `deadline` is stricter here than for the other calls: no attempt is
        sent unless it ends before `deadline` even if the server never
        answers (connect plus read timeout), so a delete is never still in
        flight past it. A deleter whose right to delete ends at a known time
        (the GC, whose lease lapses) passes that time.
        """
        batch: list[str] = []
        count = 0
        for key in keys:
            batch.append(self.url.key(_check_relative_key(key)))
            if len(batch) == 1000:
                self._delete_batch(batch, deadline)
                count += len(batch)
                batch = []
        if batch:
            self._delete_batch(batch, deadline)
            count += len(batch)
        return count

    def _delete_batch(self, keys: list[str], deadline: float | None) -> None:
        request = {"Objects": [{"Key": k} for k in keys], "Quiet": True}
        # `_call` names the key relative to the prefix; these are full keys.
        skip = len(self.url.prefix) + 1 if self.url.prefix else 0
        response = self._call(
            "delete", keys[0][skip:],
            lambda: self._client.delete_objects(Bucket=self.url.bucket, Delete=request),
            deadline, whole_attempt_by_deadline=True)
        errors = response.get("Errors") or []
        if errors:
            shown = ", ".join(f"{e.get('Key')} ({e.get('Code')})" for e in errors[:5])
            raise RemoteError(f"{len(errors)} object(s) not deleted: {shown}")

    # -------------------------------------------------------------- retries

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n
        if name == "requests":
            box = getattr(self._tally, "box", None)
            if box is not None:
                box[0] += n

    def counted(self, box: list[int], fn, *args):
        """`fn(*args)`, adding the requests this thread sends meanwhile to `box[0]`
        (what one operation cost, whatever else the store serves at the time)."""
        old = getattr(self._tally, "box", None)
        self._tally.box = box
        try:
            return fn(*args)
        finally:
            self._tally.box = old

    def _timed(self, op: str, t0: float, failed: bool) -> None:
        with self._lock:
            self.latency[op].observe(time.perf_counter() - t0, failed)

    def latency_dict(self) -> dict:
        """`latency` as plain numbers (a consistent copy)."""
        with self._lock:
            return self.latency.as_dict()

    def attempt_bound(self) -> float:
        """Seconds one attempt may wait on the server before it is given up."""
        return self.settings.connect_timeout + self.settings.read_timeout

    def _call(self, op: str, key: str, fn, deadline: float | None,
              conflict_is_transient: bool = False, whole_attempt_by_deadline: bool = False):
        """Run `fn` with bounded retries of transient failures; translate errors.

        `deadline`: no attempt starts after it; with `whole_attempt_by_deadline`,
        none starts unless it would be given up before it (`attempt_bound`).
        """
        s = self.settings
        attempt = 0
        while True:
            if self._closed.is_set():
                raise RemoteUnavailable(f"{op} {self._where(key)}: the object store client is closed")
            if whole_attempt_by_deadline and deadline is not None \
                    and time.monotonic() + self.attempt_bound() >= deadline:
                raise RemoteUnavailable(
                    f"{op} {self._where(key)}: not sent: an attempt may wait "
                    f"{self.attempt_bound():g} s on the server, and the caller's deadline is "
                    f"{max(0.0, deadline - time.monotonic()):.1f} s away")
            attempt += 1
            self._count("requests")
            t0 = time.perf_counter()
            try:
                result = fn()
                self._timed(op, t0, False)
                return result
            except RemoteError:
                self._timed(op, t0, True)
                raise
            except Exception as exc:  # noqa: BLE001 - every boto failure is translated
                self._timed(op, t0, True)
                error = self._translate(op, key, exc, conflict_is_transient)
            self._count("errors")
            if not isinstance(error, RemoteUnavailable) or attempt >= s.max_attempts:
                raise error
            # Exponential backoff with "equal jitter": never less than half the
            # step, so a store that is down is not hammered, and workers spread.
            step = min(s.retry_max_delay, s.retry_base_delay * (2 ** (attempt - 1)))
            delay = step / 2 + random.uniform(0, step / 2)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise error
            self._count("retries")
            if self._closed.wait(delay):
                raise error

    def _where(self, key: str) -> str:
        return f"s3://{self.url.bucket}/{self.url.key(key) if key else self.url.prefix}"

    def _translate(self, op: str, key: str, exc: Exception,
                   conflict_is_transient: bool) -> RemoteError:
        import botocore.exceptions
        import urllib3.exceptions

        where = self._where(key)
        endpoint = self.endpoint
        network_errors, credential_errors = _boto_errors()
        if isinstance(exc, botocore.exceptions.ClientError):
            status, code, message = _status_and_code(exc)
            detail = f"{code or status}: {message}" if message else (code or str(status))
            if status == 412 or code == "PreconditionFailed":
                return RemoteConflict(f"{op} {where}: condition not met ({detail})")
            if status == 409 and code in ("ConditionalRequestConflict", "OperationAborted"):
                # Another conditional write of the same key is in flight.
                if conflict_is_transient:
                    return RemoteUnavailable(f"{op} {where}: concurrent write ({detail})")
                return RemoteConflict(f"{op} {where}: concurrent write ({detail})")
            if code == "NoSuchBucket":
                return RemoteError(f"bucket {self.url.bucket!r} does not exist at {endpoint}")
            if status == 404 or code in ("NoSuchKey", "NotFound", "404"):
                if op == "check":
                    return RemoteError(f"bucket {self.url.bucket!r} does not exist at {endpoint}")
                return RemoteNotFound(f"{where} does not exist")
            if status == 403 or code in _DENIED_CODES:
                return RemoteAccessDenied(f"{op} {where}: access denied at {endpoint} ({detail}); "
                                          "check the credentials and the bucket policy")
            if code == "RequestTimeTooSkewed":
                return RemoteError(f"{op} {where}: this machine's clock is too far from the "
                                   f"server's ({detail}); fix the clock (NTP)")
            if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
                return RemoteUnavailable(f"{op} {where}: the server answered {detail}")
            if status == 416 or code == "InvalidRange":
                return RemoteError(f"{op} {where}: range not satisfiable")
            return RemoteError(f"{op} {where}: {detail} (HTTP {status})")
        if isinstance(exc, credential_errors):
            return RemoteAccessDenied(f"{op} {where}: no usable AWS credentials ({exc}); set "
                                      "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or "
                                      "remote_credentials_file")
        if isinstance(exc, network_errors):
            return RemoteUnavailable(f"{op} {where}: {endpoint} unreachable or too slow ({exc})")
        if isinstance(exc, botocore.exceptions.ParamValidationError):
            return RemoteError(f"{op} {where}: invalid request ({exc})")
        if isinstance(exc, OSError | urllib3.exceptions.HTTPError | http.client.HTTPException):
            # A socket or protocol failure botocore did not wrap.
            return RemoteUnavailable(f"{op} {where}: {endpoint} unreachable ({exc})")
        if isinstance(exc, botocore.exceptions.BotoCoreError):
            return RemoteError(f"{op} {where}: {exc}")
        return RemoteError(f"{op} {where}: unexpected {type(exc).__name__}: {exc}")
