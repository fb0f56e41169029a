#!/usr/bin/env bash
# Install what vfsd needs on a Debian machine: system packages (only the missing
# ones) and a virtual environment in .venv with the project and its extras.
# Safe to run again; it does nothing that is already done.
#
#   scripts/setup.sh demo   what `make demo` needs: FUSE, the sandbox, the venv
#   scripts/setup.sh serve  what `make serve` needs: the demo's, LangGraph's server
#                           and the example (examples/langgraph-server) installed
#   scripts/setup.sh        what `make test` needs too (the default)
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${1:-test}"
# The venv builds pyfuse3 from source: gcc, pkg-config, libfuse3-dev, python3-dev.
# fuse3: fusermount3; attr: setfattr (the demo's shell marks files done);
# bubblewrap: the execute sandbox.
DEMO_PACKAGES=(fuse3 libfuse3-dev pkg-config attr python3-venv python3-dev gcc bubblewrap)
# Tests only: PostgreSQL (the checkpointer tests), systemd (systemd-analyze verify of
# the units), python-is-python3 (`python` inside the sandbox: deepagents' standard
# sandbox tests run `python -c ...`), git, make, rsync (the workload benchmarks),
# chromium and a font (headless, to check the page `vfsd timeline --html` writes).
TEST_PACKAGES=(postgresql systemd python-is-python3 git make rsync chromium fonts-dejavu-core)
case "$MODE" in
    demo) APT_PACKAGES=("${DEMO_PACKAGES[@]}"); EXTRAS="${VFSD_EXTRAS:-agents}" ;;
    serve) APT_PACKAGES=("${DEMO_PACKAGES[@]}"); EXTRAS="${VFSD_EXTRAS:-agents,server}" ;;
    test) APT_PACKAGES=("${DEMO_PACKAGES[@]}" "${TEST_PACKAGES[@]}"); EXTRAS="${VFSD_EXTRAS:-dev,agents,server}" ;;
    *) echo "usage: scripts/setup.sh [demo|serve|test]" >&2; exit 2 ;;
esac

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
EXAMPLE=examples/langgraph-server
# What the venv was made from: the pins, the example's and this script.
made_from="$(cat pyproject.toml "$EXAMPLE/pyproject.toml" scripts/setup.sh | sha256sum | cut -c1-16)"
want="$made_from-$EXTRAS"
have="$(cat "$stamp" 2>/dev/null || true)"
# A venv made for the tests serves the demo and the server as it is, and one
# made for the server serves the demo.
if { [ "$MODE" = demo ] || [ "$MODE" = serve ]; } && [ "$have" = "$made_from-dev,agents,server" ]; then
    want="$have"
elif [ "$MODE" = demo ] && [ "$have" = "$made_from-agents,server" ]; then
    want="$have"
fi
if [ ! -x .venv/bin/python ] || [ "$have" != "$want" ]; then
    echo "setup: creating .venv with extras [$EXTRAS]"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade "pip==25.3" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -m pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import pyfuse3, trio, lmdb, xxhash"
    if [ "$MODE" != demo ]; then
        # The example by module name (its langgraph.json), from any working directory.
        .venv/bin/python -m pip install -q --no-deps -e "$EXAMPLE" 2>&1 | grep -v "^WARNING: Location" || true
        .venv/bin/python -c "import vfsd_server_example"
    fi
    if [ "$MODE" = test ]; then
        # Wheels of vfsd's runtime dependencies, so tests/test_install.py installs
        # the built wheel into a fresh venv offline (--no-index --find-links).
        # The build backend goes there too: `pip install .` builds in isolation;
        # and the pip that pipx (1.18) puts in its shared libraries.
        rm -rf .venv/wheelhouse
        .venv/bin/python -m pip wheel -q -w .venv/wheelhouse --no-build-isolation . \
            "setuptools==80.9.0" "pip==26.1.2" 2>&1 | grep -v "^WARNING: Location" || true
        rm -f .venv/wheelhouse/vfsd-*.whl
    fi
    echo "$want" > "$stamp"
fi
