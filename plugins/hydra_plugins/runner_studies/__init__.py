"""The folders Hydra composes a job from, in the order it looks: the user's ./conf and
./experiments where the command runs (their own options, a calibrated profile, their own
studies), then the runner's conf/ and experiments/ (runner/config_dirs.py); the first that holds a
config wins.

A study is a file of experiments/ (experiments/NAME.yaml), chosen as `+experiment=NAME`: to Hydra
it is the option NAME of the group `experiment`, which a `studies://` folder presents (Hydra's
file source, with the group's name in front of every path).
"""

# No `from __future__ import annotations`: Hydra runs this module without registering it.

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin

GROUP = "experiment"


class StudiesConfigSource(FileConfigSource):
    """A folder of studies as Hydra's group `experiment`: `experiment/NAME.yaml` is NAME.yaml."""

    @staticmethod
    def scheme() -> str:
        return "studies"

    @staticmethod
    def inside(config_path: str) -> str | None:
        """The path inside the folder; None outside the group."""
        head, _, rest = config_path.strip("/").partition("/")
        return rest if head == GROUP else None

    def load_config(self, config_path: str) -> ConfigResult:
        inner = self.inside(config_path)
        if not inner:
            raise ConfigLoadError(f"Config not found: {config_path}")
        return super().load_config(inner)

    def available(self) -> bool:
        return super().is_group("")

    def is_group(self, config_path: str) -> bool:
        if config_path.strip("/") == "":
            return self.available()
        return self.inside(config_path) == "" and self.available()

    def is_config(self, config_path: str) -> bool:
        inner = self.inside(config_path)
        return bool(inner) and super().is_config(inner)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        if config_path.strip("/") == "":
            group = self.available() and results_filter in (None, ObjectType.GROUP)
            return [GROUP] if group else []
        if self.inside(config_path) != "" or not self.available():
            return []
        configs = super().list("", ObjectType.CONFIG)
        return configs if results_filter in (None, ObjectType.CONFIG) else []


class RunnerSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from runner.config_dirs import EXPERIMENTS_DIR

        main = SearchPathQuery(provider="main")
        search_path.prepend("runner-user", "file://conf", anchor=main)
        search_path.prepend("runner-user-studies", "studies://experiments", anchor=main)
        search_path.append("runner-studies", f"studies://{EXPERIMENTS_DIR}", anchor=main)
