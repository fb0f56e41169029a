# The three commands a newcomer needs: `make demo`, `make serve` and `make test`
# (and `make docs` for the documentation site). Each installs what is missing first
# (scripts/setup.sh).

PY := .venv/bin/python
PYTEST := .venv/bin/pytest

.PHONY: setup setup-demo demo setup-serve serve test test-fast test-long bench bench-quick lint docs \
        clean \
        dist install install-bin install-units uninstall

setup:
	@bash scripts/setup.sh test

# The demo needs FUSE, bubblewrap and the venv; PostgreSQL and the rest are the tests'.
setup-demo:
	@bash scripts/setup.sh demo

demo: setup-demo
	@$(PY) -m mount_tool.demo

# The server: examples/langgraph-server under `langgraph dev` on 127.0.0.1:$(PORT),
# $(JOBS) runs at once; Ctrl-C (or SIGTERM to its process group) stops it and
# unmounts every shard. Settings: the table "The example's settings" in
# docs/server.md (VFSD_RUNS, VFSD_CONFIG, VFSD_POSTGRES, VFSD_MODEL, VFSD_SHARDS, ...).
PORT ?= 2024
JOBS ?= 16
setup-serve:
	@bash scripts/setup.sh serve

serve: setup-serve
	@PORT="$(PORT)" JOBS="$(JOBS)" exec bash scripts/serve.sh

# Three workers, a test file each at a time: most tests wait on mounts, daemons
# and servers rather than on the CPU. `make test PYTEST_JOBS=0` runs serially.
PYTEST_JOBS ?= 3
test: setup
	@$(PYTEST) -q -n $(PYTEST_JOBS) --dist loadfile

# Storage unit tests only (no FUSE needed).
test-fast: setup
	@$(PYTEST) -q -m "not fuse"

# Longer variants (crash rounds, model-based examples) than CI runs.
test-long: setup
	@VFSD_LONG=1 $(PYTEST) -q -n $(PYTEST_JOBS) --dist loadfile

bench: setup
	@$(PY) bench/fs_bench.py
	@$(PY) bench/eviction_bench.py
	@$(PY) bench/workloads.py
	@$(PY) bench/execute_bench.py

bench-quick: setup
	@$(PY) bench/fs_bench.py --quick
	@$(PY) bench/workloads.py --quick

lint: setup
	@.venv/bin/ruff check vfsd mount_tool tests bench

# The documentation site: README.md and docs/*.md, built into site/ (mkdocs.yml).
# Strict: a broken link or anchor fails the build. Needs no network.
docs: setup
	@NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
	@echo "docs: site/index.html"

# ------------------------------------------------------------ packaging, install
# `make dist`: the wheel and the sdist in dist/ (python -m build).
# `make install`: vfsd in its own venv under $(LIBDIR) (from the wheel), the
# `vfsd` and `mount-tool` commands in $(BINDIR), and the systemd units (system
# and user) where systemd looks for them. DESTDIR stages it all elsewhere.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib/vfsd
UNITDIR ?= /etc/systemd/system
USERUNITDIR ?= /etc/systemd/user
DESTDIR ?=

dist: setup
	@rm -rf dist
	@$(PY) -m build --outdir dist . >/dev/null
	@ls dist

install: install-bin install-units

install-bin: dist
	python3 -m venv "$(DESTDIR)$(LIBDIR)"
	"$(DESTDIR)$(LIBDIR)/bin/pip" install -q --upgrade dist/vfsd-*.whl
	install -d "$(DESTDIR)$(BINDIR)"
	ln -sf "$(LIBDIR)/bin/vfsd" "$(DESTDIR)$(BINDIR)/vfsd"
	ln -sf "$(LIBDIR)/bin/mount-tool" "$(DESTDIR)$(BINDIR)/mount-tool"

# The units run $(BINDIR)/vfsd (they name /usr/local/bin/vfsd; another BINDIR is
# written into the installed copies).
install-units:
	install -d "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(USERUNITDIR)" "$(DESTDIR)/etc/vfsd"
	for u in vfsd@.service vfsd-gc@.service vfsd-gc@.timer; do \
	    sed 's|/usr/local/bin/vfsd|$(BINDIR)/vfsd|g' "systemd/$$u" > "$(DESTDIR)$(UNITDIR)/$$u"; \
	    chmod 644 "$(DESTDIR)$(UNITDIR)/$$u"; done
	sed 's|%h/.local/bin/vfsd|$(BINDIR)/vfsd|g' systemd/user/vfsd@.service \
	    > "$(DESTDIR)$(USERUNITDIR)/vfsd@.service"
	chmod 644 "$(DESTDIR)$(USERUNITDIR)/vfsd@.service"
	[ -e "$(DESTDIR)/etc/vfsd/vfsd.toml.example" ] || \
	    install -m 644 systemd/vfsd.toml.example "$(DESTDIR)/etc/vfsd/vfsd.toml.example"
	if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/vfsd" "$(DESTDIR)$(BINDIR)/mount-tool"
	rm -rf "$(DESTDIR)$(LIBDIR)"
	rm -f "$(DESTDIR)$(UNITDIR)"/vfsd@.service "$(DESTDIR)$(UNITDIR)"/vfsd-gc@.service \
	    "$(DESTDIR)$(UNITDIR)"/vfsd-gc@.timer "$(DESTDIR)$(USERUNITDIR)"/vfsd@.service

clean:
	rm -rf .venv build dist site *.egg-info .pytest_cache .hypothesis
