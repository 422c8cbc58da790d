"""Single sign-on through an authenticating proxy in front of Vigil (oauth2-proxy, an ingress's external
authentication, an identity-aware proxy): the proxy signs the user in and names them in a request header;
Vigil takes that header as the user, and a groups header for their role.

A header anyone can send is trusted only from the proxy: the request's **direct peer** (the socket's
address, not ``X-Forwarded-For``, which uvicorn would otherwise substitute for it) must be inside
``VIGIL_AUTH_PROXY_TRUSTED_NETWORKS``, and that setting is required once the user header is named. A
request carrying the header from anywhere else is treated as carrying none (API keys and the log-in page
still work) and is logged, once a minute at most. A user header sent more than once is refused: a proxy
that added its own after the client's, instead of replacing it, would otherwise let the client's name it.

The user's role: the highest role any of their groups maps to in ``VIGIL_AUTH_PROXY_ROLES`` (JSON
``{"group": "reviewer" | "admin"}``), else ``VIGIL_AUTH_PROXY_DEFAULT_ROLE``; a signed-in user with
neither is refused with 403 naming their groups, never let in with a guess. Only the console's roles
(reviewer, admin) can be given this way: ingest keeps its API keys.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from dataclasses import dataclass

from starlette.requests import Request

from vigil.errors import ConfigError
from vigil.settings import Settings

log = logging.getLogger(__name__)

PEER_SCOPE_KEY = "vigil.peer"  # the socket's peer host, set by vigil serve's HTTP protocol
ROLES = ("reviewer", "admin")  # lowest first: a user with both gets admin
NAME_MAX = 254  # an e-mail address's longest form
GROUPS_MAX = 200  # groups kept with the identity (the role is taken from all of them; the head is bounded)
WARN_EVERY_SECONDS = 60.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ProxyIdentity:
    """What the proxy said of a request: the user, their role (None: no role), and why not, if refused."""

    name: str
    role: str | None
    groups: tuple[str, ...]
    refusal: str = ""


class ProxyAuth:
    def __init__(
        self,
        user_header: str,
        groups_header: str,
        roles: dict[str, str],
        default_role: str,
        trusted: list[Network],
        logout_url: str,
    ) -> None:
        self.user_header = user_header.lower()
        self.groups_header = groups_header.lower()
        self.roles = roles
        self.default_role = default_role
        self.trusted = trusted
        self.logout_url = logout_url
        self._warned_at = float("-inf")

    @classmethod
    def from_settings(cls, settings: Settings) -> ProxyAuth | None:
        """None when no user header is named; a ConfigError naming the variable for anything inconsistent."""
        user_header = settings.auth_proxy_user_header.strip()
        if not user_header:
            return None
        _check_header_name("VIGIL_AUTH_PROXY_USER_HEADER", user_header)
        groups_header = settings.auth_proxy_groups_header.strip()
        if groups_header:
            _check_header_name("VIGIL_AUTH_PROXY_GROUPS_HEADER", groups_header)
        if user_header.lower() in ("authorization", "cookie") or groups_header.lower() in ("authorization", "cookie"):
            raise ConfigError("VIGIL_AUTH_PROXY_USER_HEADER / _GROUPS_HEADER must not be Authorization or Cookie")
        roles = _parse_roles(settings.auth_proxy_roles)
        if roles and not groups_header:
            raise ConfigError("VIGIL_AUTH_PROXY_ROLES maps groups, but VIGIL_AUTH_PROXY_GROUPS_HEADER is not set")
        default_role = settings.auth_proxy_default_role.strip()
        if default_role and default_role not in ROLES:
            raise ConfigError(f"VIGIL_AUTH_PROXY_DEFAULT_ROLE must be reviewer, admin or empty, not {default_role!r}")
        if not roles and not default_role:
            raise ConfigError(
                "VIGIL_AUTH_PROXY_USER_HEADER is set, but no user could get a role: set VIGIL_AUTH_PROXY_ROLES "
                "(with VIGIL_AUTH_PROXY_GROUPS_HEADER) or VIGIL_AUTH_PROXY_DEFAULT_ROLE"
            )
        trusted = _parse_networks(settings.auth_proxy_trusted_networks)
        if not trusted:
            raise ConfigError(
                "VIGIL_AUTH_PROXY_USER_HEADER is set, but VIGIL_AUTH_PROXY_TRUSTED_NETWORKS is empty: name the "
                "addresses the proxy connects from (for a sidecar 127.0.0.1/32), or anyone could send the header"
            )
        logout_url = settings.auth_proxy_logout_url.strip()
        if logout_url and not (logout_url.startswith(("https://", "http://")) or logout_url.startswith("/")):
            raise ConfigError("VIGIL_AUTH_PROXY_LOGOUT_URL must be an absolute URL or a path starting with /")
        return cls(user_header, groups_header, roles, default_role, trusted, logout_url)

    def identify(self, request: Request) -> ProxyIdentity | None:
        """The user the proxy names on this request, or None: no header, or not from a trusted peer."""
        raw = request.headers.get(self.user_header)
        if raw is None:
            return None
        if PEER_SCOPE_KEY in request.scope:  # vigil serve: the socket's peer (None: unknown, not trusted)
            peer = request.scope[PEER_SCOPE_KEY]
        else:  # another server than vigil serve: its client, which it may have taken from a header
            client = request.scope.get("client")
            peer = client[0] if client else None
        if not self._trusted(peer):
            self._warn_untrusted(peer)
            return None
        if len(request.headers.getlist(self.user_header)) > 1:
            # a proxy that adds its line after the client's instead of replacing it: the first would be the
            # client's own choice of user
            return ProxyIdentity("", None, (), f"the {self.user_header} header came more than once")
        name = (_utf8(raw) or "").strip()
        if not name or len(name) > NAME_MAX or not name.isprintable():
            return ProxyIdentity(
                "",
                None,
                (),
                f"the sign-in proxy's {self.user_header} header is empty, too long, not UTF-8 or not printable",
            )
        every = self._groups(request)
        role = self._role(every)
        groups = every[:GROUPS_MAX]
        if role is None:
            shown = ", ".join(groups[:20]) or "none"
            return ProxyIdentity(
                name,
                None,
                groups,
                f"{name} is signed in, but none of their groups ({shown}) gives a Vigil role "
                "(VIGIL_AUTH_PROXY_ROLES, VIGIL_AUTH_PROXY_DEFAULT_ROLE)",
            )
        return ProxyIdentity(name, role, groups)

    def _groups(self, request: Request) -> tuple[str, ...]:
        if not self.groups_header:
            return ()
        found: list[str] = []
        for value in request.headers.getlist(self.groups_header):
            for part in (_utf8(value) or "").split(","):  # a value not in UTF-8 names no group
                group = part.strip()
                if group:
                    found.append(group)
        return tuple(found)

    def _role(self, groups: tuple[str, ...]) -> str | None:
        best = -1
        for group in groups:
            role = self.roles.get(group)
            if role is not None:
                best = max(best, ROLES.index(role))
        if best >= 0:
            return ROLES[best]
        return self.default_role or None

    def _trusted(self, peer: object) -> bool:
        if not isinstance(peer, str):
            return False
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.trusted)

    def _warn_untrusted(self, peer: object) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_SECONDS:
            self._warned_at = now
            log.warning(
                "a request from %s carried the sign-in header %s but does not come from "
                "VIGIL_AUTH_PROXY_TRUSTED_NETWORKS: the header was ignored",
                peer,
                self.user_header,
            )


def _utf8(value: str) -> str | None:
    """A header value as the proxy wrote it, or None if it is not UTF-8: HTTP hands the app Latin-1, and a
    proxy names users and groups in UTF-8 ("zoë" had arrived as "zoÃ«", "qualité" matched no mapping)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return None


def _check_header_name(variable: str, name: str) -> None:
    if not all(c.isalnum() or c in "-_" for c in name):
        raise ConfigError(f"{variable}: {name!r} is not an HTTP header name")


def _parse_roles(raw: str) -> dict[str, str]:
    raw = raw.strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f'VIGIL_AUTH_PROXY_ROLES is not JSON ({exc}); write {{"group": "reviewer"}}') from None
    if not isinstance(value, dict):
        raise ConfigError('VIGIL_AUTH_PROXY_ROLES must be a JSON object {"group": "reviewer" | "admin"}')
    for group, role in value.items():
        if role not in ROLES:
            raise ConfigError(f"VIGIL_AUTH_PROXY_ROLES: group {group!r} maps to {role!r}, not reviewer or admin")
    return dict(value)


def _parse_networks(raw: str) -> list[Network]:
    networks: list[Network] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ConfigError(f"VIGIL_AUTH_PROXY_TRUSTED_NETWORKS: {part!r} is not an address or network") from None
    return networks
