"""qjm._native picks the compiled modules or their twins: a broken compiled module is never a
silent fallback to Python. Each case runs in a fresh interpreter whose import of ``framing_c``
is made to fail the way it fails for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.native  # it is about the compiled modules being there

PROBE = """
import importlib.abc, json, sys, warnings

class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if sys.argv[1] == "missing" and name.startswith("qjm._native.") and name.endswith("_c"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)  # a pure build
        if name == "qjm._native.framing_c":  # fanout_c imports it too
            raise ImportError("libxxhash.so.0: cannot open shared object file")
        return None

sys.meta_path.insert(0, Broken())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import qjm._native as n
print(json.dumps({"backend": n.capabilities()["framing"], "fallbacks": n.capabilities()["fallbacks"],
                  "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}))
"""


def probe(kind: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("QJM_NO_EXTENSIONS", "QJM_REQUIRE_NATIVE")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", PROBE, kind], capture_output=True, text=True, env=full, timeout=60)


def test_a_compiled_module_that_fails_to_import_warns_and_says_why() -> None:
    out = json.loads(probe("broken").stdout)
    assert out["backend"] == "python"
    assert any("libxxhash.so.0" in f for f in out["fallbacks"])
    assert "framing_c is installed but failed to import" in out["warnings"][0]
    assert all("libxxhash.so.0" in w and "Install the repaired wheel" in w for w in out["warnings"])


def test_a_build_without_compiled_modules_falls_back_quietly() -> None:
    out = json.loads(probe("missing").stdout)
    assert out["backend"] == "python" and out["warnings"] == []
    assert [f.split(":")[0] for f in out["fallbacks"]] == ["framing", "segment_io", "gate", "fanout"]


def test_require_native_turns_the_fallback_into_an_error() -> None:
    done = probe("broken", QJM_REQUIRE_NATIVE="1")
    assert done.returncode != 0
    assert "native module framing_c is required but failed to import" in done.stderr
