"""The one thing pyproject.toml cannot say: the optional C extension ``sluice._speedups`` (src/csrc/speedups).

It is optional in both senses: a machine without a C compiler still installs
Sluice (every function in it has a pure-Python twin, see sluice.speedups), and
SLUICE_NO_EXTENSIONS=1 makes an installed one unused.
"""
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "src/csrc/speedups").glob("*.c"))

setup(ext_modules=[Extension("sluice._speedups", SOURCES, include_dirs=["src/csrc/speedups"], optional=True,
                             depends=["src/csrc/speedups/speedups.h"],
                             extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"])])
