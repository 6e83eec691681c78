"""The package's C extensions (setuptools builds them with the package; pyproject.toml holds everything else)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("bookfleet._bookieadds", ["bookfleet/_bookieadds.c"]),
        Extension("bookfleet._clientadds", ["bookfleet/_clientadds.c"]),
        Extension("bookfleet._entrylog", ["bookfleet/_entrylog.c"]),
    ],
)
