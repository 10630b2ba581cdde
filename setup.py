"""Build the Cython extensions of qjm (metadata lives in pyproject.toml).

Switches (environment):
  QJM_NO_EXTENSIONS=1  pure build: no extension at all, qjm runs on its Python twins.
  QJM_IO_BACKEND=auto|uring|pwrite  segment_io_c links liburing when its probe passes (auto), must
                       (uring), or never does (pwrite: the pwrite + fdatasync path only).

Otherwise every module in NATIVE_MODULES is compiled and a missing system library fails the build
loudly (style-anchors R9): a silently pure build would benchmark Python by accident. System
libraries come from Debian -dev packages, found through pkg-config; nothing is downloaded.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib

import setuptools
from setuptools import Extension, setup

# (module under qjm._native, pkg-config names of the system libraries it links)
# Append later modules here, e.g. ("segment_io_c", ["liburing"]), ("fanout_c", []).
NATIVE_MODULES: list[tuple[str, list[str]]] = [
    ("framing_c", ["libxxhash"]),
    ("segment_io_c", []),
    ("gate_c", ["libxxhash"]),  # framing_c.pxd, which it cimports, includes xxhash.h
    ("fanout_c", ["openssl"]),  # libssl: the data plane's TLS runs inside its epoll loop
]
# Libraries a module links only when present, each with the define that tells the module it has
# them: without liburing, segment_io_c builds its pwrite + fdatasync path alone (recipes §2).
OPTIONAL_LIBS: dict[str, list[tuple[str, str]]] = {
    "segment_io_c": [("liburing", "QJM_HAVE_LIBURING")],
}

INCLUDE_DIRS = ["include", "src/qjm/_native"]
COMPILE_ARGS = ["-O2", "-Wall"]
# Cython and the C compiler work one module per CPU: each module takes seconds, and every install
# and wheel builds them all.
BUILD_JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "embedsignature": True,
}

# Compile+link probes (ecosystem-recipes §2): the header must compile and the library must link.
PROBES = {
    "libxxhash": r"""#include <xxhash.h>
int main(void) { return XXH3_64bits("", 0) == 0; }
""",
    "openssl": r"""#include <openssl/ssl.h>
int main(void) { SSL_CTX *c = SSL_CTX_new(TLS_client_method()); SSL_CTX_free(c); return c == 0; }
""",
    "liburing": r"""#include <liburing.h>
int main(void) { struct io_uring r; if (io_uring_queue_init(2, &r, 0) == 0) io_uring_queue_exit(&r);
 (void)IORING_FSYNC_DATASYNC; (void)IOSQE_IO_LINK; return 0; }
""",
}
APT_PACKAGE = {"libxxhash": "libxxhash-dev", "liburing": "liburing-dev", "openssl": "libssl-dev"}
FALLBACK_LIBS = {"libxxhash": ["xxhash"], "liburing": ["uring"], "openssl": ["ssl", "crypto"]}


# Commands that only describe or pack the sources (`python -m build` runs them for the sdist and
# for the metadata): they need no compiler, no library probe and no Cython run.
SOURCE_ONLY_COMMANDS = {"sdist", "egg_info", "dist_info"}


def want_extensions() -> bool:
    return os.environ.get("QJM_NO_EXTENSIONS", "") not in ("1", "true", "yes")


def source_only() -> bool:
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    return command in SOURCE_ONLY_COMMANDS


@functools.cache
def pkg_config(package: str) -> dict[str, list[str]]:
    """include_dirs / library_dirs / libraries of a system package; `-l<name>` if pkg-config is missing."""
    flags: dict[str, list[str]] = {"include_dirs": [], "library_dirs": [], "libraries": []}
    exe = shutil.which("pkg-config")
    if exe is None:
        flags["libraries"] = list(FALLBACK_LIBS[package])
        return flags
    proc = subprocess.run([exe, "--cflags", "--libs", package], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        flags["libraries"] = list(FALLBACK_LIBS[package])
        return flags
    for tok in shlex.split(proc.stdout):
        for prefix, key in (("-I", "include_dirs"), ("-L", "library_dirs"), ("-l", "libraries")):
            if tok.startswith(prefix):
                flags[key].append(tok[len(prefix) :])
    return flags


def have_c_lib(
    source: str, libraries: list[str], include_dirs: list[str] | None = None, library_dirs: list[str] | None = None
) -> bool:
    """True if `source` compiles and links against `libraries` with setuptools' own compiler."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.errors import CompileError, LinkError
    from setuptools._distutils.sysconfig import customize_compiler

    cc = new_compiler()
    customize_compiler(cc)
    tmp = tempfile.mkdtemp(prefix="qjm-probe-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(source)
        objs = cc.compile([src], output_dir=tmp, include_dirs=include_dirs or [])
        cc.link_executable(objs, os.path.join(tmp, "probe"), libraries=libraries, library_dirs=library_dirs or [])
        return True
    except (CompileError, LinkError):
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.cache
def have_package(package: str) -> bool:
    """Probe `package` with its pkg-config flags."""
    flags = pkg_config(package)
    return have_c_lib(PROBES[package], flags["libraries"], flags["include_dirs"], flags["library_dirs"])


def require(package: str) -> None:
    if not have_package(package):
        sys.exit(
            f"qjm: cannot build the native extensions: {package} (header + library) was not found.\n"
            f"     Install it with `apt-get install {APT_PACKAGE[package]}`, or build the pure-Python\n"
            f"     package with QJM_NO_EXTENSIONS=1."
        )


def optional_lib(package: str) -> bool:
    """Link an optional library? QJM_IO_BACKEND forces liburing in (uring) or out (pwrite)."""
    if package == "liburing":
        backend = os.environ.get("QJM_IO_BACKEND", "auto")
        if backend == "pwrite":
            return False
        if backend == "uring":
            require(package)
            return True
    return have_package(package)


def native_ext(name: str, libs: list[str]) -> Extension:
    """Extension qjm._native.<name> from src/qjm/_native/<name>.pyx, linked against pkg-config `libs`."""
    include_dirs = list(INCLUDE_DIRS)
    library_dirs: list[str] = []
    libraries: list[str] = []
    macros: list[tuple[str, str | None]] = []
    for package, define in OPTIONAL_LIBS.get(name, []):
        if optional_lib(package):
            libs = [*libs, package]
            macros.append((define, "1"))
            print(f"qjm: {name} links {package}")
        else:
            print(f"qjm: {name} built without {package}")
    for package in libs:
        # Every listed library is required; optional ones were added above only when present.
        require(package)
        flags = pkg_config(package)
        include_dirs += flags["include_dirs"]
        library_dirs += flags["library_dirs"]
        libraries += flags["libraries"]
    return Extension(
        f"qjm._native.{name}",
        [f"src/qjm/_native/{name}.pyx"],
        include_dirs=include_dirs,
        library_dirs=library_dirs,
        libraries=libraries,
        define_macros=macros,
        extra_compile_args=COMPILE_ARGS,
    )


def extensions() -> list[Extension]:
    if source_only():
        return []
    if not want_extensions():
        print("qjm: pure build")
        return []
    from Cython.Build import cythonize

    exts = [native_ext(name, libs) for name, libs in NATIVE_MODULES]
    print("qjm: native build")
    return cythonize(
        exts,
        compiler_directives=CYTHON_DIRECTIVES,
        include_path=["src"],
        build_dir="build/cython",
        nthreads=BUILD_JOBS,
    )


def check_setuptools() -> None:
    """An older setuptools than pyproject.toml's build-system asks for (as `python setup.py ...` may
    run with) rejects its SPDX `license`: say so, instead of its schema error."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml"), "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    wanted = next(int(r.split(">=")[1].split(".")[0]) for r in requires if r.startswith("setuptools>="))
    if int(setuptools.__version__.split(".")[0]) < wanted:
        sys.exit(
            f"qjm: setuptools {setuptools.__version__} is older than the {wanted} pyproject.toml's build-system\n"
            f"     requires: `make compile` installs it into the venv, or `{sys.executable} -m pip install\n"
            f"     'setuptools>={wanted}'` into this Python."
        )


check_setuptools()
# `build_ext -j N` on the command line still wins over this default.
setup(ext_modules=extensions(), options={"build_ext": {"parallel": BUILD_JOBS}})
