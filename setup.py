"""The package's C extensions, built by its own install (`pip install`, `make setup`); everything else about the
package is in pyproject.toml. docs/design.md says why each exists."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("bookfleet._addframes", ["bookfleet/_addframes.c"]),
    ],
)
