"""The one thing pyproject.toml cannot say: the optional C extension ``sluice._speedups`` (src/csrc/speedups).

It is optional in both senses: a machine without a C compiler still installs
Sluice (every function in it has a pure-Python twin, see sluice.speedups), and
SLUICE_NO_EXTENSIONS=1 makes an installed one unused.
"""
import os
import tempfile
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "src/csrc/speedups").glob("*.c"))

_SHA1_PROBE = """#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
int main(void) { SHA_CTX c; unsigned char md[20]; SHA1_Init(&c); SHA1_Update(&c, "", 0); return !SHA1_Final(md, &c); }
"""


def libcrypto_options() -> dict:
    """Link OpenSSL's libcrypto for acl.c's SHA-1 when its header and library are there (libssl-dev); without
    them the extension still builds and signs through hashlib. SLUICE_NO_LIBCRYPTO=1 leaves it out."""
    if os.environ.get("SLUICE_NO_LIBCRYPTO", "") not in ("", "0"):
        return {}
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler
    cc = new_compiler()
    customize_compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(_SHA1_PROBE)
        try:
            objects = cc.compile([str(src)], output_dir=tmp)
            cc.link_executable(objects, str(Path(tmp) / "probe"), libraries=["crypto"])
        except Exception:  # no header or no library: the hashlib path
            return {}
    return {"libraries": ["crypto"], "define_macros": [("SLUICE_HAVE_LIBCRYPTO", "1")]}


setup(ext_modules=[Extension("sluice._speedups", SOURCES, include_dirs=["src/csrc/speedups"], optional=True,
                             depends=["src/csrc/speedups/speedups.h"],
                             extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
                             **libcrypto_options())])
