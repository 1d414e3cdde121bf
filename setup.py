"""The one thing pyproject.toml cannot say: the optional C extension (src/sluice/_speedups.c).

It is optional in both senses: a machine without a C compiler still installs
Sluice (every function in it has a pure-Python twin, see sluice.speedups), and
SLUICE_NO_EXTENSIONS=1 makes an installed one unused.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("sluice._speedups", ["src/sluice/_speedups.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"])])
