"""The daemon options every mounting verb takes (`vfsd mount`, the TOML keys they map to)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import SIZE


def config_options(fn):
    opts = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
                     help="TOML file with daemon options (command-line flags win)."),
        click.option("--inline-max", type=SIZE,
                     help="Size up to which content is kept inline in LMDB [64KiB]."),
        click.option("--chunk-size", type=SIZE, help="Chunk size of larger files [1MiB]."),
        click.option("--done-retention-steps", type=int, help="Steps a done file is kept [3]."),
        click.option("--max-age-steps", type=int, help="Steps any unpinned file is kept [20]."),
        click.option("--quota-bytes", type=SIZE,
                     help="Byte quota (e.g. 10G, 256MiB); oldest unpinned files go first."),
        click.option("--max-files", type=int, help="File-count limit; oldest unpinned files go first."),
        click.option("--age-from", type=click.Choice(["use", "written"]),
                     help="A file's age counts from its last write or open (use), or its "
                          "last write (written) [use]."),
        click.option("--eviction-rules", metavar="JSON",
                     help='Ordered rules by path, the first match wins, as JSON: '
                          '[{"path": "tool_outputs/**", "max_age_steps": 5}, '
                          '{"path": "src/**", "pin": true}].'),
        click.option("--builtin-eviction-rules/--no-builtin-eviction-rules", default=None,
                     help="After your rules, keep the records agent frameworks write "
                          "(conversation_history/**, blobs/*: pinned); --no-... drops "
                          "them [on]."),
        click.option("--durability", type=click.Choice(["fsync", "sync"]),
                     help="fsync: durable on fsync() [default]; sync: also on close."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
                     help="Least severe event logged [info]."),
        click.option("--allow-other/--no-allow-other", default=None,
                     help="Let other users reach the mount (needs user_allow_other)."),
        click.option("--entry-timeout", type=float, help="Kernel entry/attribute cache seconds [3600]."),
        click.option("--max-tasks", type=int, help="FUSE requests handled concurrently [16]."),
        click.option("--commit-window", type=float,
                     help="Seconds FUSE requests share one LMDB commit; 0: one each [0.005]."),
        click.option("--metrics-port", type=int, help="Serve Prometheus metrics on 127.0.0.1:PORT."),
        click.option("--snapshot-keep-last", type=int,
                     help="Snapshots kept, newest first (0: no count rule) [32]."),
        click.option("--snapshot-keep-bytes", type=SIZE,
                     help="File bytes the snapshots may record (e.g. 2G); beyond, the oldest "
                          "unpinned go [no bound]."),
        click.option("--snapshot-keep-steps", type=int,
                     help="Also keep snapshots younger than this many steps (0: off) [20]."),
        click.option("--xattr-reads/--no-xattr-reads", default=None,
                     help="Answer getxattr (costs a round trip per write(); off: read "
                          "attributes from .vfsd/attr/PATH) [off]."),
        click.option("--remote", "--remote-url", "remote_url", metavar="s3://BUCKET/PREFIX",
                     help="Keep the run's chunks and published snapshots in this bucket "
                          "prefix (remembered by the store)."),
        click.option("--remote-endpoint-url", help="S3 endpoint URL [AWS_ENDPOINT_URL, else AWS]."),
        click.option("--remote-region", help="S3 region [AWS_REGION, the profile's, else us-east-1]."),
        click.option("--remote-profile", help="AWS profile for the object store [AWS_PROFILE]."),
        click.option("--remote-credentials-file",
                     help="AWS-format credentials file [~/.aws/credentials]."),
        click.option("--remote-addressing-style", type=click.Choice(["auto", "path", "virtual"]),
                     help="Bucket in the path or in the host name [auto]."),
        click.option("--remote-connect-timeout", type=float,
                     help="Seconds to connect to the object store [5]."),
        click.option("--remote-read-timeout", type=float,
                     help="Seconds to wait for object store data [30]."),
        click.option("--remote-max-attempts", type=int,
                     help="Tries per object store request, transient errors only [5]."),
        click.option("--remote-retry-base-delay", type=float,
                     help="First retry delay in seconds; doubles, with jitter [0.1]."),
        click.option("--remote-retry-max-delay", type=float, help="Longest retry delay [10]."),
        click.option("--remote-workers", type=int, help="Object store requests in flight [8]."),
        click.option("--remote-upload-queue", type=int,
                     help="Chunks queued for upload in memory; the rest wait on disk [4096]."),
        click.option("--remote-fetch-timeout", type=float,
                     help="Seconds a read waits for a chunk from the object store [30]."),
        click.option("--remote-readahead-chunks", type=int,
                     help="Chunks fetched ahead of a sequential read [4]."),
        click.option("--remote-cache-bytes", type=SIZE,
                     help="Bound of the local chunk cache of a remote run (e.g. 20G)."),
        click.option("--remote-lease-ttl", type=float,
                     help="Seconds a run's writer lease lives without renewal [30]."),
        click.option("--remote-lease-wait", type=float,
                     help="Seconds a mount waits for another worker's lease to lapse "
                          "[lease TTL + 5]."),
        click.option("--remote-full-every", type=int,
                     help="Publish a full manifest every N publications [16]."),
        click.option("--remote-gc-grace", type=float,
                     help="Bucket GC never deletes chunks younger than this [3600]."),
        click.option("--control-idle-timeout", type=float,
                     help="Seconds a control connection may stay idle [300]."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


OPTION_KEYS = ("inline_max", "chunk_size", "done_retention_steps", "max_age_steps",
                "quota_bytes", "max_files", "age_from", "eviction_rules",
                "builtin_eviction_rules", "durability",
                "log_level", "allow_other",
                "entry_timeout", "commit_window", "max_tasks", "metrics_port", "snapshot_keep_last",
                "snapshot_keep_steps", "snapshot_keep_bytes", "xattr_reads",
                "remote_url", "remote_endpoint_url", "remote_region", "remote_profile",
                "remote_credentials_file", "remote_addressing_style", "remote_connect_timeout",
                "remote_read_timeout", "remote_max_attempts", "remote_retry_base_delay",
                "remote_retry_max_delay", "remote_workers", "remote_upload_queue",
                "remote_fetch_timeout", "remote_readahead_chunks", "remote_cache_bytes",
                "remote_lease_ttl", "remote_lease_wait", "remote_full_every", "remote_gc_grace",
                "control_idle_timeout")
