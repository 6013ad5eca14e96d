"""Builds the Cython extensions of fxengine's hot path.

Each compiled module has one readable pure-Python source, ``<name>_py.py``, and an
augmenting ``<name>_c.pxd`` with its C types. Cython matches a ``.pxd`` to the ``.py``
of the same name, so the source is copied to ``build/cysrc/.../<name>_c.py`` beside its
``.pxd`` and compiled there as ``<package>.<name>_c``. ``FXENGINE_NO_EXTENSIONS=1``
skips the build; so does a machine without a C compiler (one warning, pure Python).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
# (package folder, module base name): compiles <folder>/<base>_py.py as <base>_c.
COMPILED = [
    ("fxengine/models", "_sse"),
    ("fxengine/journal", "_codec"),
]
NO_EXTENSIONS = os.environ.get("FXENGINE_NO_EXTENSIONS", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """Falls back to the pure-Python build, with one warning, where nothing compiles."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers
            self._warn(exc)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        print(
            f"WARNING: fxengine's Cython extensions were not built ({exc}); "
            "the pure-Python build will be used.",
            file=sys.stderr,
        )


def extensions() -> list:
    if NO_EXTENSIONS:
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:
        print("WARNING: Cython is not installed; fxengine uses its pure-Python build.", file=sys.stderr)
        return []
    staged = HERE / "build" / "cysrc"
    exts = []
    for folder, base in COMPILED:
        src = HERE / folder / f"{base}_py.py"
        pxd = HERE / folder / f"{base}_c.pxd"
        if not src.exists():
            continue
        dest = staged / folder
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / f"{base}_c.py")
        if pxd.exists():
            shutil.copyfile(pxd, dest / f"{base}_c.pxd")
        module = folder.replace("/", ".") + f".{base}_c"
        exts.append(Extension(module, [str((dest / f"{base}_c.py").relative_to(HERE))]))
    return cythonize(
        exts,
        # A changed .pxd alone would not trigger a rebuild otherwise.
        force=True,
        language_level=3,
        # The .pxd alone gives C types: the sources' annotations stay documentation, so a
        # `bytes` hint does not make the compiled build refuse a memoryview.
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "annotation_typing": False,
        },
        quiet=True,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
