# ctxcc: two commands matter. `make run` starts the daemon; `make test` installs,
# generates, lints and runs every test. Everything else is a building block.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The daemon alone needs far less than the test suite (SDKs, a browser driver, linters):
# `make run` installs only that; `make test` adds the rest to the same venv.
RUN_STAMP := $(VENV)/.installed-run
PROTO_FILES := $(shell find proto -name '*.proto' | sort)

.PHONY: run test venv proto proto-check lint fmt unit bench clean dashboard clients client-py client-ts

$(STAMP): pyproject.toml constraints.txt client/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/pip install --quiet -c constraints.txt -e client/python
	touch $(STAMP)

$(RUN_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt constraints.txt ]; then \
	  :; \
	else \
	  $(BIN)/pip install --quiet --upgrade pip && \
	  $(BIN)/pip install --quiet -c constraints.txt -e .; \
	fi
	touch $(RUN_STAMP)

venv: $(STAMP)

## run: start the daemon in the foreground on its embedded defaults (./data)
run: $(RUN_STAMP)
	$(BIN)/ctxcc serve $(ARGS)

## proto: regenerate Python, Go and TypeScript code from proto/
proto: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/gen_proto.sh .
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/gen_go.sh
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/gen_ts.sh

## proto-check: fail when any committed generated code is stale
proto-check: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/gen_proto.sh --check
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/gen_go.sh --check
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/gen_ts.sh --check

## clients: build the Go and TypeScript clients and their example agents, and the
## installable packages in .tools/dist (npm tarball with its dependencies, Python wheel)
CLIENT_DIST := .tools/dist
NPM_TARBALL := $(CLIENT_DIST)/ctxcc-client-0.1.0.tgz
PY_WHEEL := $(CLIENT_DIST)/ctxcc_client-0.1.0-py3-none-any.whl
clients: .tools/bin/agentloop-go .tools/bin/checkpointdigest-go .tools/bin/createsession-go client/typescript/dist/examples/agent-loop.js $(NPM_TARBALL) $(PY_WHEEL)

## client-py: the Python client's wheel alone (needs Python only: the daemon's small venv)
client-py: $(PY_WHEEL)

## client-ts: the TypeScript client's npm tarball alone (needs Node.js and npm only)
client-ts: $(NPM_TARBALL)

.tools/bin/agentloop-go: $(shell find client/go -name '*.go') client/go/go.mod client/go/go.sum
	cd client/go && go vet ./... && go build -o ../../.tools/bin/agentloop-go ./examples/agentloop

.tools/bin/checkpointdigest-go: $(shell find client/go -name '*.go') client/go/go.mod client/go/go.sum
	cd client/go && go build -o ../../.tools/bin/checkpointdigest-go ./examples/checkpointdigest

.tools/bin/createsession-go: $(shell find client/go -name '*.go') client/go/go.mod client/go/go.sum
	cd client/go && go build -o ../../.tools/bin/createsession-go ./examples/createsession

client/typescript/node_modules/.stamp: client/typescript/package-lock.json
	cd client/typescript && npm ci --silent
	touch $@

client/typescript/dist/examples/agent-loop.js: client/typescript/node_modules/.stamp $(shell find client/typescript/src client/typescript/examples client/typescript/test -name '*.ts') client/typescript/tsconfig.json
	cd client/typescript && npx tsc -p tsconfig.json

$(NPM_TARBALL): client/typescript/dist/examples/agent-loop.js client/typescript/package.json client/typescript/README.md
	mkdir -p $(CLIENT_DIST)
	cd client/typescript && npm pack --silent --ignore-scripts --pack-destination ../../$(CLIENT_DIST) >/dev/null

# The wheel carries the generated ctxcc.v1 code, so it installs anywhere. Built in the
# daemon's venv (not the test suite's: a pure-Python wheel needs only setuptools).
$(PY_WHEEL): $(RUN_STAMP) $(shell find client/python/ctxcc_client ctxcc/v1 -name '*.py' -o -name '*.pyi' -o -name py.typed) client/python/pyproject.toml client/python/README.md
	mkdir -p $(CLIENT_DIST)
	$(BIN)/pip install --quiet -c constraints.txt setuptools
	rm -rf client/python/build
	$(BIN)/pip wheel --quiet --no-deps --no-build-isolation -w $(CLIENT_DIST) ./client/python
	rm -rf client/python/build

## lint: ruff, mypy --strict, import contracts, buf lint and buf breaking against main
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/buf lint
	bash scripts/buf_breaking.sh $(BIN)/buf
	$(BIN)/yamllint -s deploy .yamllint

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

.tools/promtool .tools/prometheus &: scripts/get_prometheus.sh
	bash scripts/get_prometheus.sh

# checkov scans the rendered manifests and the Dockerfile; it lives in a venv of its own
# because its dependencies would fight the daemon's pins.
.tools/checkov/.stamp: scripts/checkov-requirements.txt
	test -x .tools/checkov/bin/python || $(PYTHON) -m venv .tools/checkov
	.tools/checkov/bin/pip install --quiet -r scripts/checkov-requirements.txt
	touch $@

# Debian's chromium for the inspector's browser tests (Playwright drives it by path).
.tools/chromium: scripts/get_chromium.sh
	mkdir -p .tools
	ln -sf "$$(bash scripts/get_chromium.sh)" .tools/chromium

## dashboard: regenerate the Grafana dashboard from scripts/gen_dashboard.py
dashboard: $(STAMP)
	$(BIN)/python scripts/gen_dashboard.py

# Wheels for the image-environment test: fetched here, so the test itself never downloads.
.tools/wheels/.stamp: deploy/requirements.txt $(STAMP)
	mkdir -p .tools/wheels
	$(BIN)/pip download --quiet -d .tools/wheels -r deploy/requirements.txt "setuptools>=77" wheel
	touch $@

# grpcurl, pinned: the reflection test describes the whole API with the real tool.
GRPCURL_VERSION := v1.9.3
.tools/bin/grpcurl:
	GOBIN=$(CURDIR)/.tools/bin go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

# Test processes (pytest-xdist), a test file to each: most tests wait on the daemons,
# clients and tools they start, so two share the two cores of a small machine well.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

## test: everything CI runs
test: $(STAMP) proto-check lint .tools/promtool .tools/prometheus .tools/chromium .tools/checkov/.stamp .tools/wheels/.stamp clients .tools/bin/grpcurl
	$(PYTEST)

unit: $(STAMP)
	$(PYTEST) tests/unit tests/contract

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
