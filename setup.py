"""The packages, which pyproject.toml alone cannot list: the code found by name, the Hydra plugins
(plugins/hydra_plugins, installed as Hydra's `hydra_plugins` namespace, where Hydra discovers
them), and the configs (conf/, experiments/) mapped into the package (pyproject.toml's package-dir
and package-data)."""

from setuptools import find_namespace_packages, setup

# A namespace package: hydra_plugins has no __init__.py, and other distributions add to it.
PLUGINS = find_namespace_packages(where="plugins", include=["hydra_plugins*"])
setup(packages=[*find_namespace_packages(include=["runner*"]), *PLUGINS,
                "runner.conf", "runner.experiments"])  # fmt: skip
