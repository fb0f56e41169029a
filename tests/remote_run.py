"""Helpers for tests of the remote tier on real mounts: workers, the bucket, trees.

A *worker* is a run dir with its own store, mounted by the real `vfsd mount`
with `--remote`, as a separate machine would. Credentials and the endpoint
reach the daemons through the standard AWS environment variables, as in
production. The bucket is inspected behind vfsd's back with a plain boto3
client (`Bucket`).
"""

from __future__ import annotations

import json
import time

from conftest import MountedRun, tree, vfsd_cli  # noqa: F401 - tree: used by importers

from vfsd.remote.layout import digest_of_chunk_key, parse_run_key, seq_of_manifest_name
from vfsd.remote.manifest import decode

#: short timeouts and retries, so faults show within seconds
FAST = ("--remote-lease-ttl", "5", "--remote-retry-base-delay", "0.05",
        "--remote-retry-max-delay", "0.5", "--remote-connect-timeout", "1",
        "--remote-read-timeout", "3", "--remote-max-attempts", "2",
        "--remote-fetch-timeout", "3", "--remote-lease-wait", "0")


def use_server(server, monkeypatch) -> None:
    """Point the AWS environment (inherited by every daemon) at `server`."""
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)


def status(run: MountedRun) -> dict:
    return json.loads(vfsd_cli("status", run.run_dir, "--json").stdout)


def snapshot(run: MountedRun) -> str:
    return json.loads(vfsd_cli("snapshot", run.run_dir, "--json").stdout)["id"]


def sync(run: MountedRun, timeout: float = 60, check: bool = True):
    return vfsd_cli("sync", run.run_dir, "--timeout", str(timeout), "--json", check=check,
                    timeout=timeout + 60)


def wait_for(predicate, what: str, limit: float = 60.0, every: float = 0.1):
    """Poll until `predicate()` is truthy (the test's own timeout is the real bound)."""
    deadline = time.monotonic() + limit
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


def log_errors(run: MountedRun) -> list[str]:
    return [ln for ln in run.log_text().splitlines()
            if '"level": "error"' in ln or "Traceback" in ln]


class Bucket:
    """The bucket prefix of a test, seen with a plain boto3 client."""

    def __init__(self, server, url: str) -> None:
        self.client = server.client()
        self.bucket = server.bucket
        self.prefix = url.split("/", 3)[3]

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}"

    def keys(self, under: str = "") -> dict[str, dict]:
        out = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(under))
        for page in pages:
            for item in page.get("Contents", []):
                out[item["Key"][len(self.prefix) + 1:]] = item
        return out

    def get(self, relative: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.key(relative))["Body"].read()

    def put(self, relative: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(relative), Body=data)

    def delete(self, relative: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(relative))

    def chunks(self) -> set[bytes]:
        return {d for d in (digest_of_chunk_key(k) for k in self.keys("chunks/")) if d}

    def manifests(self, run: str | None = None) -> dict[tuple[str, int], bytes]:
        out = {}
        for key in self.keys("runs/"):
            parsed = parse_run_key(key)
            if parsed and parsed[1] == "snapshots" and (run is None or parsed[0] == run):
                out[(parsed[0], seq_of_manifest_name(parsed[2]))] = self.get(key)
        return out

    def head(self, run: str) -> dict:
        return json.loads(self.get(f"runs/{run}/head"))

    def missing_chunks(self) -> dict[tuple[str, int], set[bytes]]:
        """Per manifest, the chunks it names that are not in the bucket (should be none)."""
        present = self.chunks()
        out = {}
        for (run, seq), data in self.manifests().items():
            lacking = decode(data, run=run, seq=seq).chunk_digests() - present
            if lacking:
                out[(run, seq)] = lacking
        return out
