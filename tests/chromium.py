"""Headless Debian chromium for the pages vfsd writes (no network, a fresh profile)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio"]


def binary() -> str | None:
    return shutil.which("chromium")


def run(page: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Chromium on `page` with a profile of its own, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="vfsd-chromium-") as profile:
        return subprocess.run(
            [binary() or "chromium", *FLAGS, f"--user-data-dir={profile}", *args,
             page.resolve().as_uri()],
            capture_output=True, text=True, timeout=timeout, check=True)


def dump_dom(page: Path) -> str:
    """The DOM once the page's scripts ran (`--dump-dom`)."""
    return run(page, "--virtual-time-budget=5000", "--dump-dom").stdout


def screenshot(page: Path, out: Path, width: int = 1040, height: int = 900) -> Path:
    run(page, "--virtual-time-budget=5000", "--hide-scrollbars",
        f"--window-size={width},{height}", f"--screenshot={out}")
    return out
