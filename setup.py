"""The packages, which pyproject.toml alone cannot list: the code found by name, and the configs
(conf/, experiments/) mapped into the package (pyproject.toml's package-dir and package-data)."""

from setuptools import find_namespace_packages, setup

# Namespace packages too: hydra_plugins has no __init__.py (Hydra finds its plugins there by name).
CODE = find_namespace_packages(include=["runner*", "plugins*", "hydra_plugins*"])
setup(packages=[*CODE, "runner.conf", "runner.experiments"])
