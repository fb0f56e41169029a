#!/usr/bin/env bash
# Install what vfsd needs on a Debian machine: system packages (only the missing
# ones) and a virtual environment in .venv with the project and its extras.
# Safe to run again; it does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS="${VFSD_EXTRAS:-dev,agents}"
# bubblewrap: the execute sandbox; python-is-python3: `python` inside it (deepagents' standard
# sandbox tests run `python -c ...`); git, make, rsync: the workload benchmarks.
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config attr python3-venv python3-dev gcc postgresql systemd
              bubblewrap python-is-python3 git make rsync)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
stamp=.venv/.vfsd-installed
want="$(sha256sum pyproject.toml | cut -c1-16)-$EXTRAS"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: creating .venv with extras [$EXTRAS]"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade "pip==25.3" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -m pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import pyfuse3, trio, lmdb, xxhash"
    echo "$want" > "$stamp"
fi
