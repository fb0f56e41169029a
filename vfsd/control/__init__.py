"""The control socket: newline-delimited JSON over a Unix socket (docs/control.md).

`server` (the daemon side: one task per connection, every op), `protocol`
(request decoding and reply encoding, bounded), `connslots` (bounded
connections), `client` (what the CLI uses), `unixpath` (socket paths longer
than sun_path allows).

The server sits above every other layer of the daemon; `client` and
`unixpath` import nothing else of vfsd, so the CLI can talk to a daemon
without loading it.
"""
