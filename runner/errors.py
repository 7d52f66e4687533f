"""The one error a user's config can cause: it names the key and says what is allowed."""


class ConfigError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)
