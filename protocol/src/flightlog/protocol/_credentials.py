"""Credentials the codec removes from model request configs and headers, at any depth."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["is_credential_key"]

# Credential keys, compared lowercased with "_", "-" and "." removed.
_CREDENTIAL_KEYS: Final = frozenset(
    {
        "apikey",
        "authorization",
        "proxyauthorization",
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "authtoken",
        "bearertoken",
        "sessiontoken",
        "privatekey",
        "secretkey",
        "cookie",
        "setcookie",
        "credential",
        "credentials",
    }
)
# Suffixes catch prefixed forms: openai_api_key, x-api-key, client_secret, db_password.
_CREDENTIAL_SUFFIXES: Final = (
    "apikey",
    "authorization",
    "password",
    "secret",
    "accesstoken",
    "refreshtoken",
    "authtoken",
    "sessiontoken",
    "privatekey",
    "secretkey",
    "secretaccesskey",
    "credentials",
)


def is_credential_key(key: str) -> bool:
    """Whether a config or header key names a credential the codec removes.

    ``api_key``, ``apiKey``, ``x-api-key``, ``Authorization``, ``client_secret``,
    ``access_token``, ``password``…  but not ``max_tokens`` or ``input_tokens``.
    """
    norm = key.lower().replace("_", "").replace("-", "").replace(".", "")
    return norm in _CREDENTIAL_KEYS or norm.endswith(_CREDENTIAL_SUFFIXES)


def _scrub(value: Any) -> Any:
    # Works on lowered values: dicts, lists and scalars only.
    if type(value) is dict:
        return {
            key: _scrub(item)
            for key, item in value.items()
            if not (isinstance(key, str) and is_credential_key(key))
        }
    if type(value) is list:
        return [_scrub(item) for item in value]
    return value
