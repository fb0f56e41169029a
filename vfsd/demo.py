"""`python -m vfsd.demo`: kept as an alias of `make demo`'s `python -m mount_tool.demo`.

The demo is an agent program, so it lives with the agent side (mount_tool), and
vfsd itself never imports it: this module only runs it when executed.
"""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("mount_tool.demo", run_name="__main__", alter_sys=True)
