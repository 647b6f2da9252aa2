"""Optional API keys: only sha256 hashes are held, and a presented key is compared against every
one of them in constant time, so neither timing nor a memory dump reveals a key."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from pathlib import Path

from service.settings import Settings

HASH_PREFIX = "sha256:"


def _hash(entry: str) -> bytes:
    """A configured entry (a key, or `sha256:<hex>` of one) → the key's digest."""
    if entry.startswith(HASH_PREFIX):
        digest = bytes.fromhex(entry[len(HASH_PREFIX) :])
        if len(digest) != 32:
            raise ValueError("an API key hash is sha256:<64 hex digits>")
        return digest
    return hashlib.sha256(entry.encode()).digest()


class ApiKeys:
    def __init__(self, entries: list[str]):
        self._digests = [_hash(e) for e in entries]

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        entries = [k.strip() for k in settings.api_keys.get_secret_value().split(",")]
        if settings.api_keys_file:
            for line in Path(settings.api_keys_file).read_text().splitlines():
                entries.append(line.split("#", 1)[0].strip())
        return cls([e for e in entries if e])

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, presented: str | None) -> bool:
        if not presented:
            return False
        digest = hashlib.sha256(presented.encode()).digest()
        found = False
        for known in self._digests:  # no early exit: the time does not depend on which key matched
            found |= hmac.compare_digest(digest, known)
        return found


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only (a hostname other than localhost does not count)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
