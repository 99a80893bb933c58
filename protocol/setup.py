"""The build of flightlog.protocol's optional C accelerator (the rest is in pyproject.toml).

The extension is optional: when it cannot be compiled (no compiler, no Python headers)
the build goes on without it and the pure-Python path runs (docs/operations.md).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "flightlog.protocol._speedups",
            sources=["src/flightlog/protocol/_speedups.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        ),
        Extension(
            "flightlog.protocol._scan",
            sources=["src/flightlog/protocol/_scan.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        ),
        Extension(
            "flightlog.protocol._sender",
            sources=["src/flightlog/protocol/_sender.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        ),
    ]
)
