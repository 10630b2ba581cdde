"""The one place that chooses between the Cython hot path and its pure-Python twins.

``QJM_NO_EXTENSIONS=1`` forces the pure backend. Otherwise the compiled modules are required:
a broken native build fails loudly instead of silently benchmarking Python (style-anchors 7.3).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

PUBLIC_API: dict[str, tuple[str, ...]] = {
    "framing": (
        "xxh3_64",
        "encode_frame",
        "FrameBuilder",
        "decode_header",
        "verify_frame",
        "decode_records",
        "encode_segment_header",
        "decode_segment_header",
        "scan",
        "iter_frames",
        "ScanResult",
        "layout",
    ),
}


def _want_native() -> bool:
    return os.environ.get("QJM_NO_EXTENSIONS", "") not in ("1", "true", "yes")


def _load(role: str) -> tuple[ModuleType, str]:
    from importlib import import_module

    if _want_native():
        try:
            return import_module(f"qjm._native.{role}_c"), "native"
        except ImportError as e:
            if os.environ.get("QJM_REQUIRE_NATIVE") == "1":
                raise ImportError(f"qjm: native module {role}_c is required but failed to import: {e}") from e
            _fallbacks.append(f"{role}: {e}")
    return import_module(f"qjm._native.{role}_py"), "python"


_fallbacks: list[str] = []
if TYPE_CHECKING:  # both backends offer the twin's API; type-check against the twin
    from qjm._native import framing_py as framing

    _framing_backend = "python"
else:
    framing, _framing_backend = _load("framing")
for _name in PUBLIC_API["framing"]:
    if not hasattr(framing, _name):
        raise ImportError(f"qjm._native: backend module {framing.__name__} lacks {_name}")

BACKEND = _framing_backend


def capabilities() -> dict[str, Any]:
    """Which paths run here: the framing backend and why native is missing, if it is."""
    return {"backend": BACKEND, "framing": _framing_backend, "fallbacks": list(_fallbacks)}
