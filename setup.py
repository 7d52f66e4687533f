"""The packages, which pyproject.toml alone cannot list: the code found by name, and the configs
(conf/, experiments/) mapped into the package (pyproject.toml's package-dir and package-data)."""

from setuptools import find_packages, setup

CODE = find_packages(include=["runner*", "plugins*", "hydra_plugins*"])
setup(packages=[*CODE, "runner.conf", "runner.experiments"])
