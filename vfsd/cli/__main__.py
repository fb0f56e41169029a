"""`python -m vfsd.cli`: what mount_tool and the tests run."""

from vfsd.cli import main

main()
