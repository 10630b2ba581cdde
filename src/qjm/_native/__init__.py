"""The one place that chooses between the Cython hot path and its pure-Python twins.

``QJM_NO_EXTENSIONS=1`` forces the pure backend. Otherwise the compiled module of each role is
used; a build without them (``QJM_NO_EXTENSIONS=1`` at build time) runs the twins quietly, but a
compiled module that is there and fails to import (a wheel that was not repaired, on a machine
without liburing or libxxhash) raises a ``RuntimeWarning`` naming the error instead of silently
running Python ten times slower (style-anchors 7.3); ``QJM_REQUIRE_NATIVE=1`` makes it an
``ImportError``. ``capabilities()["fallbacks"]`` lists every fallback.
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
        "verify_frame_ids",
        "decode_records",
        "pack_records",
        "encode_segment_header",
        "decode_segment_header",
        "scan",
        "iter_frames",
        "ScanResult",
        "layout",
    ),
    "segment_io": (
        "Appender",
        "BLOCK",
        "DEFAULT_PREALLOC",
        "FLUSH_BYTES",
        "EXTEND_RUN",
        "URING_BUILT",
        "io_uring_available",
        "io_uring_default",
        "direct_supported",
    ),
    "gate": ("WriteGate",),
    "fanout": (
        "Fanout",
        "Lane",
        "Receiver",
        "TlsClient",
        "TlsServer",
        "ACK_SIZE",
        "MAX_WINDOW_COUNT",
        "wire_layout",
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
            if not (isinstance(e, ModuleNotFoundError) and e.name == f"qjm._native.{role}_c"):
                import warnings

                warnings.warn(
                    f"qjm: the compiled {role}_c is installed but failed to import ({e}); running the "
                    "pure-Python twin, much slower. Install the repaired wheel (README: Native hot path) "
                    "or set QJM_NO_EXTENSIONS=1 to choose the twins.",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return import_module(f"qjm._native.{role}_py"), "python"


def _check(role: str, module: ModuleType) -> None:
    for name in PUBLIC_API[role]:
        if not hasattr(module, name):
            raise ImportError(f"qjm._native: backend module {module.__name__} lacks {name}")


_fallbacks: list[str] = []
if TYPE_CHECKING:  # both backends offer the twin's API; type-check against the twin
    from qjm._native import fanout_py as fanout
    from qjm._native import framing_py as framing
    from qjm._native import gate_py as gate
    from qjm._native import segment_io_py as segment_io

    _framing_backend = _segment_io_backend = _gate_backend = _fanout_backend = "python"
else:
    framing, _framing_backend = _load("framing")
    segment_io, _segment_io_backend = _load("segment_io")
    gate, _gate_backend = _load("gate")
    fanout, _fanout_backend = _load("fanout")
_check("framing", framing)
_check("segment_io", segment_io)
_check("gate", gate)
_check("fanout", fanout)

BACKEND = _framing_backend
_direct: dict[str, bool] = {}


def backend_of(role: str) -> str:
    """``"native"`` or ``"python"``: which implementation of ``framing``/``segment_io``/``gate``/``fanout`` runs."""
    backends = {"framing": _framing_backend, "segment_io": _segment_io_backend, "gate": _gate_backend}
    return {**backends, "fanout": _fanout_backend}[role]


def capabilities(directory: str | None = None) -> dict[str, Any]:
    """Which paths run here: each module's backend, why native is missing if it is, whether
    io_uring and O_DIRECT work (O_DIRECT probed in ``directory``, by default the temp directory),
    and which write path new segment appenders take (``append_io``: ``"pwrite"``, or
    ``"io_uring"`` with ``QJM_IO_URING=1``).
    """
    import tempfile

    where = directory or tempfile.gettempdir()
    if where not in _direct:
        _direct[where] = bool(segment_io.direct_supported(where))
    return {
        "backend": BACKEND,
        "framing": _framing_backend,
        "segment_io": _segment_io_backend,
        "gate": _gate_backend,
        "fanout": _fanout_backend,
        "io_uring": bool(segment_io.io_uring_available()),
        "append_io": "io_uring" if segment_io.io_uring_default() else "pwrite",
        "o_direct": _direct[where] and _segment_io_backend == "native",
        "xxh3": "libxxhash" if _framing_backend == "native" else "python-xxhash",
        "fallbacks": list(_fallbacks),
    }
