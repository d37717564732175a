"""Secrets are a type: their printed, repr'd, JSON and pickled forms never hold the value."""

from __future__ import annotations

from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

MASK = "********"


class Secret:
    """A password, API key or token. Only `reveal()` gives the value, and only callers that
    hand it to its one legitimate consumer (an environment variable of a child process) use it."""

    __slots__ = ("_name", "_value")

    def __init__(self, value: str, name: str = "") -> None:
        self._value = value
        self._name = name

    @property
    def name(self) -> str:
        """The variable the secret came from (safe to print)."""
        return self._name

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"Secret({self._name or 'unnamed'}={MASK})"

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("secret", self._name))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self) -> Any:
        raise TypeError("a Secret cannot be pickled")

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def build(value: Any) -> Secret:
            if isinstance(value, Secret):
                return value
            if not isinstance(value, str):
                raise ValueError("a secret must be a string")
            return Secret(value)

        return core_schema.no_info_plain_validator_function(
            build,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda _s: MASK),
        )
