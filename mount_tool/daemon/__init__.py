"""Talking to vfsd: how mount_tool starts a daemon and speaks to it.

`client` (`ControlClient`: newline-delimited JSON on the control socket,
docs/control.md), `spawn` (`vfsd` commands through one warm helper process;
the flags of `vfsd mount`), `mountinfo` (whether a path is a mount point) and
`toolcalls` (the running tool call, told to the daemon so the files it writes
name it).

This package imports nothing of mount_tool but its shared modules (errors),
and nothing of vfsd: it runs the `vfsd` command line and uses the mount and
the control socket, the daemon's only interfaces.
"""
