"""API keys, bind-address policy and path confinement: shared by the HTTP API and the MCP server."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath

from rag_lib.config import Settings
from rag_lib.errors import ConfigError, RagError, ValidationError


class Scope(str, Enum):
    READ = "read"
    WRITE = "write"


class AuthError(RagError):
    """No key, or a key that matches nothing."""

    code = "unauthorized"


class ForbiddenError(RagError):
    """A valid key without the scope the operation needs."""

    code = "forbidden"


class PathNotAllowedError(RagError):
    """A path outside every configured root (`..`, absolute elsewhere, symlink escape)."""

    code = "path_not_allowed"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _split(raw: str | None) -> list[str]:
    return [k.strip() for k in (raw or "").split(",") if k.strip()]


@dataclass(frozen=True)
class KeyRing:
    """SHA-256 digests of the configured keys (the keys themselves are not kept)."""

    write: tuple[bytes, ...] = ()
    read: tuple[bytes, ...] = ()

    @classmethod
    def from_env(cls, settings: Settings, environ: dict[str, str] | None = None) -> KeyRing:
        env = os.environ if environ is None else environ
        cfg = settings.server
        return cls(
            write=tuple(_digest(k) for k in _split(env.get(cfg.api_keys_env))),
            read=tuple(_digest(k) for k in _split(env.get(cfg.read_only_keys_env))),
        )

    @property
    def enabled(self) -> bool:
        return bool(self.write or self.read)

    def scope_of(self, key: str | None) -> Scope | None:
        """The scope a presented key grants (None: no match). Every stored digest is compared in
        constant time, with no early exit, so timing does not reveal which key (or prefix) matched."""
        if not key:
            return None
        given = _digest(key)
        write = False
        read = False
        for d in self.write:
            write |= hmac.compare_digest(given, d)
        for d in self.read:
            read |= hmac.compare_digest(given, d)
        return Scope.WRITE if write else Scope.READ if read else None

    def authorize(self, key: str | None, needed: Scope) -> Scope | None:
        """Raise unless `key` grants `needed`; with no keys configured everything is allowed
        (the server then only binds loopback, see `check_bind`)."""
        if not self.enabled:
            return None
        scope = self.scope_of(key)
        if scope is None:
            raise AuthError(
                "missing or invalid API key; send it as 'X-API-Key: <key>' or 'Authorization: Bearer <key>'"
            )
        if needed is Scope.WRITE and scope is not Scope.WRITE:
            raise ForbiddenError("this API key is read-only; embedding and deleting need a full-access key")
        return scope


def key_from_headers(headers: object) -> str | None:
    """The key from `X-API-Key` or `Authorization: Bearer` (header lookup is case-insensitive)."""
    get = getattr(headers, "get", None)
    if get is None:
        return None
    key = get("x-api-key")
    if key:
        return key.strip()
    auth = get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: KeyRing) -> None:
    """Refuse to listen beyond loopback when no API key is configured."""
    if not keys.enabled and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} without API keys; set the API key environment variable "
            "(see settings.server.api_keys_env) or bind 127.0.0.1"
        )


_SAFE_NAME = re.compile(r"^[\w.\-/ ]+$")  # \w: letters and digits of any alphabet (a corpus file may be "Übersicht.md")
MAX_COMPONENT = 255  # bytes per path component on Linux filesystems (ENAMETOOLONG beyond)


def safe_relative(name: str) -> PurePosixPath:
    """A relative POSIX path with no `..`, no absolute part and no odd characters."""
    if not name or len(name) > 512:
        raise ValidationError("name must be 1-512 characters")
    if "\\" in name or "\x00" in name or not _SAFE_NAME.match(name):
        raise PathNotAllowedError(f"name '{name[:80]}' may only use letters and digits (any alphabet), '.', '_', '-', ' ' and '/'")
    # split by hand: PurePosixPath drops '.' and empty parts, which would let 'a/./b' or '.' through
    parts = name.split("/")
    if name.startswith("/") or any(part.strip() in ("..", ".", "") for part in parts):
        raise PathNotAllowedError(f"name '{name[:80]}' must be a relative file path without '.', '..' or empty parts")
    if any(len(part.encode()) > MAX_COMPONENT for part in parts):
        raise ValidationError(f"name '{name[:80]}...' has a part longer than {MAX_COMPONENT} bytes")
    return PurePosixPath(name)


def confine(path: str, roots: list[Path]) -> tuple[Path, Path]:
    """(resolved file, its root): `path` is absolute or relative to a root, and after following
    symlinks it must still lie inside that root."""
    if not roots:
        raise PathNotAllowedError(
            "no corpus roots are configured (settings.server.corpus_roots); embedding by path is disabled"
        )
    if "\x00" in path or len(path) > 4096:
        raise PathNotAllowedError("path is not a valid path")
    raw = Path(path)
    if ".." in raw.parts:
        raise PathNotAllowedError(f"path '{path[:200]}' must not contain '..'")
    if any(len(part.encode()) > MAX_COMPONENT for part in raw.parts):
        raise ValidationError(f"path '{path[:80]}...' has a part longer than {MAX_COMPONENT} bytes")
    missing = False
    for root in roots:
        base = Path(root).resolve()
        spelled = Path(os.path.abspath(root))  # the root as configured (it may itself be a symlink)
        candidate = raw if raw.is_absolute() else base / raw
        lexical = Path(os.path.abspath(candidate))
        if not (lexical.is_relative_to(base) or lexical.is_relative_to(spelled)):
            continue
        try:
            resolved = candidate.resolve()
            is_file = resolved.is_file()
        except RuntimeError as exc:  # Python 3.11 raises RuntimeError on a symlink loop
            raise PathNotAllowedError(f"path '{path[:200]}' is a symlink loop") from exc
        except OSError as exc:  # ELOOP, ENAMETOOLONG, EACCES...: the path cannot be followed
            raise PathNotAllowedError(f"path '{path[:200]}' cannot be followed ({exc.strerror or 'invalid'})") from exc
        if not resolved.is_relative_to(base):
            raise PathNotAllowedError(f"path '{path[:200]}' leaves its corpus root through a symlink")
        if not is_file:
            missing = True
            continue
        return resolved, base
    if missing:
        raise ValidationError(f"path '{path[:200]}' is not a file inside a configured corpus root")
    raise PathNotAllowedError(f"path '{path[:200]}' is not inside a configured corpus root")


# ---- loopback mode: Host and Origin (DNS rebinding) ----------------------------------------

class HostNotAllowedError(RagError):
    """A Host header naming neither loopback nor the bound address (DNS rebinding)."""

    code = "host_not_allowed"


class OriginNotAllowedError(RagError):
    """A browser Origin other than a loopback page (cross-site request to a loopback server)."""

    code = "origin_not_allowed"


def _split_host(value: str) -> str:
    """The host name of a Host header value (`name`, `name:port`, `[v6]:port`), lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@dataclass(frozen=True)
class HostPolicy:
    """Which Host / Origin headers a loopback-mode server accepts: loopback names (any port),
    the bound address, and what settings.server.allowed_hosts / allowed_origins add."""

    bound: str = "127.0.0.1"
    port: int | None = None
    extra_hosts: tuple[str, ...] = ()
    extra_origins: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings, bound: str | None = None, port: int | None = None) -> HostPolicy:
        cfg = settings.server
        return cls(bound or cfg.host, port if port is not None else cfg.port,
                   tuple(h.lower() for h in cfg.allowed_hosts), tuple(o.lower().rstrip("/") for o in cfg.allowed_origins))

    def host_allowed(self, host: str | None) -> bool:
        if not host or any(c in host for c in "/@ \t"):
            return False
        if host.lower() in self.extra_hosts:
            return True
        name = _split_host(host)
        return is_loopback(name) or name == self.bound.strip("[]").lower()

    def origin_allowed(self, origin: str | None) -> bool:
        if origin is None:
            return True  # not a browser, or a same-origin GET
        origin = origin.strip().lower().rstrip("/")
        if origin in self.extra_origins:
            return True
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme not in ("http", "https") or "/" in rest:
            return False  # includes the opaque "null" origin of sandboxed pages and file:// pages
        return self.host_allowed(rest)

    def check(self, host: str | None, origin: str | None) -> None:
        """Raise unless both headers are acceptable."""
        if not self.host_allowed(host):
            raise HostNotAllowedError(
                f"Host '{(host or '')[:100]}' is not served here; use 127.0.0.1 or localhost, or add it to "
                "settings.server.allowed_hosts")
        if not self.origin_allowed(origin):
            raise OriginNotAllowedError(
                f"Origin '{(origin or '')[:100]}' may not call this server; add it to settings.server.allowed_origins")

    def transport_security(self):
        """The MCP SDK's DNS-rebinding settings expressing the same rule (exact and `:*` patterns)."""
        from mcp.server.transport_security import TransportSecuritySettings

        names = ["127.0.0.1", "localhost", "[::1]"]
        bound = self.bound.strip("[]")
        bound = f"[{bound}]" if ":" in bound else bound
        if bound.lower() not in names:
            names.append(bound)
        hosts = [n for name in names for n in (name, f"{name}:*")] + list(self.extra_hosts)
        origins = [f"{scheme}://{n}" for scheme in ("http", "https") for name in names for n in (name, f"{name}:*")]
        return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=origins + list(self.extra_origins))
