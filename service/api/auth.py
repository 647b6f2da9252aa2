"""Optional API keys: only sha256 hashes are held, and a presented key is compared against every
one of them in constant time, so neither timing nor a memory dump reveals a key. The key file is
re-read on SIGHUP (key rotation without a restart); a file that cannot be used is refused with
the reason, never silently read as "no keys", which would turn authentication off.

The key file's one rule: UTF-8 (a byte-order mark is allowed), one key or `sha256:<hex>` a line, a
line whose first non-blank character is `#` is a comment, blank lines are skipped, and the rest of a
line, less the blanks around it, is the key: a `#` inside a key is part of it. A key is printable
ASCII without spaces (what an X-API-Key header carries unchanged), optionally followed by one space
and `collection=<name>` (service/gallery/collection_names.py: the collection the key sees and changes;
`default` without it, and for every key of FACEGATE_API_KEYS), so a line holding anything else
— `key  # a comment` included — is refused at start with its line number, never silently cut."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from service.core.settings import Settings
from service.gallery import collection_names

HASH_PREFIX = "sha256:"
KEY = re.compile(r"[!-~]+")  # printable ASCII, no space
log = logging.getLogger("facegate.auth")


class KeyConfigError(ValueError):
    """FACEGATE_API_KEYS / FACEGATE_API_KEYS_FILE cannot be used as configured (never names a key)."""


def _hash(entry: str) -> bytes:
    """A configured entry (a key, or `sha256:<hex>` of one) → the key's digest."""
    if entry.startswith(HASH_PREFIX):
        digest = bytes.fromhex(entry[len(HASH_PREFIX) :])
        if len(digest) != 32:
            raise ValueError("an API key hash is sha256:<64 hex digits>")
        return digest
    return hashlib.sha256(entry.encode()).digest()


Entry = tuple[str, str]  # a key or `sha256:<hex>` of one, and its collection


def _read_entries(settings: Settings) -> list[Entry]:
    """Every configured key or hash with its collection; a key file must exist, parse, and hold at least one key."""
    keys = [k.strip() for k in settings.api_keys.get_secret_value().split(",") if k.strip()]
    entries = [(_checked(key, f"FACEGATE_API_KEYS entry {n}"), collection_names.DEFAULT) for n, key in enumerate(keys, 1)]
    path = settings.api_keys_file
    if path:
        try:
            lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyConfigError(
                f"FACEGATE_API_KEYS_FILE {path} cannot be read: {exc.strerror if isinstance(exc, OSError) else exc}"
            ) from None
        found = [(n, line.strip()) for n, line in enumerate(lines, 1)]
        found = [(n, entry) for n, entry in found if entry and not entry.startswith("#")]
        if not found and not settings.allow_anonymous:
            raise KeyConfigError(
                f"FACEGATE_API_KEYS_FILE {path} holds no key (only comments or blank lines): refusing to run without "
                "authentication; add a key, unset the setting, or set FACEGATE_ALLOW_ANONYMOUS=true"
            )
        entries += [_line(entry, f"FACEGATE_API_KEYS_FILE {path} line {n}") for n, entry in found]
    _one_collection_each(entries)
    return entries


def _one_collection_each(entries: list[Entry]) -> None:
    """A key given twice must name one collection: which one it sees would otherwise be a guess."""
    seen: dict[bytes, str] = {}
    for entry, name in entries:
        if seen.setdefault(_hash(entry), name) != name:
            raise KeyConfigError(f"one key is configured for two collections ({seen[_hash(entry)]!r} and {name!r}): keep one line")


def _line(line: str, where: str) -> Entry:
    """A key file's line: a key, optionally followed by one space and `collection=<name>`."""
    key, space, suffix = line.partition(" ")
    if not space:
        return _checked(key, where), collection_names.DEFAULT
    name = suffix.removeprefix("collection=")
    if name == suffix:
        _checked(line, where)  # a space inside a key: refused with the rule's reason
    if not collection_names.valid(name):
        raise KeyConfigError(f"{where}: a collection name is 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-'")
    return _checked(key, where), name


def _checked(entry: str, where: str) -> str:
    """`entry`, if it is a key the rule can carry (never named in the error: it may be a secret)."""
    if not KEY.fullmatch(entry):
        raise KeyConfigError(
            f"{where}: a key is printable ASCII without spaces (a '#' starts a comment only at the start of a line, "
            "so nothing may follow a key on its line)"
        )
    try:
        _hash(entry)
    except ValueError:
        raise KeyConfigError(f"{where}: an entry starting with {HASH_PREFIX!r} must be sha256:<64 hex digits>") from None
    return entry


class ApiKeys:
    def __init__(self, entries: Sequence[str | Entry], settings: Settings | None = None):
        self._digests = _digests(entries)
        self._settings = settings

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        return cls(_read_entries(settings), settings)

    def reload(self) -> None:
        """Re-read the configured keys (SIGHUP); on any error the keys in use stay, and it is logged."""
        if self._settings is None:
            return
        try:
            digests = _digests(_read_entries(self._settings))
        except KeyConfigError as exc:
            log.error("API keys not reloaded, the previous keys stay in use: %s", exc)
            return
        if self.enabled and not digests:
            log.error("API keys not reloaded: the new configuration has no key, and authentication is not turned off by a reload")
            return
        self._digests = digests  # one assignment: a request sees the old list or the new one
        log.info("API keys reloaded: %d configured", len(digests))

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @property
    def collections(self) -> set[str]:
        """The collections the keys name (`default` alone in anonymous mode)."""
        return {name for _, name in self._digests} or {collection_names.DEFAULT}

    def listed(self) -> list[tuple[str, str]]:
        """(the hash's first 12 hex digits, collection) of each key: what `facegate keys list` shows."""
        return [(digest.hex()[:12], name) for digest, name in self._digests]

    def collection(self, presented: str | None) -> str | None:
        """The collection of the key presented; None when it is no key of ours."""
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for known, name in self._digests:  # no early exit: the time does not depend on which key matched
            if hmac.compare_digest(digest, known):
                found = name
        return found

    def check(self, presented: str | None) -> bool:
        return self.collection(presented) is not None


def _digests(entries: Sequence[str | Entry]) -> list[tuple[bytes, str]]:
    """(digest, collection) of each entry; a bare entry is the `default` collection's."""
    pairs = [(e, collection_names.DEFAULT) if isinstance(e, str) else e for e in entries]
    return [(_hash(entry), name) for entry, name in pairs]


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only (a hostname other than localhost does not count)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
