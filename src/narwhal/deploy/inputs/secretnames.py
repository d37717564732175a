"""Which names mark a value as a credential, so it is wrapped in `Secret` and never shown.

Two vocabularies: the `.env`'s own variables (a closed list of suffixes, since NARWHAL_SSH_KEY
is a path, not a key) and the names inside NARWHAL_ENGINE_ENV, which are other programs' and
open-ended: there any `_`-separated word such as TOKEN, KEY, PASSWORD or SECRET marks a secret.
Masking a value that was not secret costs a line of display; printing one that was is a leak.
"""

from __future__ import annotations

# Suffixes of `.env` variables that hold credentials.
ENV_FILE_SUFFIXES = ("_PASSWORD", "_TOKEN", "_API_KEY", "_SECRET")
ENV_FILE_NAMES = frozenset({"NARWHAL_ENGINE_KEY"})
# Words of an engine environment variable's name that mark its value secret.
SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "PASSWORD", "PASSWD", "SECRET",
                          "CREDENTIAL", "CREDENTIALS"})
SECRET_ENDINGS = ("TOKEN", "PASSWORD", "PASSWD", "SECRET", "APIKEY")


def is_secret_name(key: str) -> bool:
    """`.env` variables whose values are credentials: never printed, logged or written."""
    return key.endswith(ENV_FILE_SUFFIXES) or key in ENV_FILE_NAMES


def is_secret_env_name(name: str) -> bool:
    """Engine environment variables (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, ...)
    whose values are credentials."""
    upper = name.upper()
    return bool(set(upper.split("_")) & SECRET_WORDS) or upper.endswith(SECRET_ENDINGS)
