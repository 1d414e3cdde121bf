"""RocketMQ 4.x's ``plain_acl.yml`` and the decisions it makes
(acl/src/main/java/org/apache/rocketmq/acl/plain/PlainPermissionManager.java, Permission.java,
RemoteAddressStrategyFactory.java, PlainAccessResource.java).

::

    globalWhiteRemoteAddresses: ["10.10.103.*", "192.168.0.*"]
    accounts:
      - accessKey: RocketMQ
        secretKey: "12345678"
        whiteRemoteAddress: "192.168.1.1-100"
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms: ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"]
        groupPerms: ["groupA=DENY", "groupB=PUB|SUB"]

Sans-IO: ``load_policy(path)`` parses, ``Policy.decide`` answers one request.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from sluice.acl import signature
from sluice.acl.signature import ACCESS_KEY, Pads, key_pads, signature_valid
from sluice.errors import AclConfigError, NoPermissionError

__all__ = ["DENY", "PUB", "SUB", "ANY", "AddressPattern", "Account", "Policy", "Need", "load_policy",
           "parse_policy", "parse_perm", "perm_name", "retry_topic"]

_c_verify = signature._c_verify  # the C acl_verify, or None: decide calls it without a Python frame between

# Permission.java's bits.
DENY, ANY, PUB, SUB = 1, 2 | 4, 2, 4
_PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": ANY, "SUB|PUB": ANY}
RETRY_PREFIX = "%RETRY%"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def perm_name(perm: int) -> str:
    return {DENY: "DENY", PUB: "PUB", SUB: "SUB", ANY: "PUB|SUB"}.get(perm, str(perm))


def parse_perm(text: Any, where: str) -> int:
    """Permission.parsePermFromString, but strict: RocketMQ turns a typo into DENY silently; we say so."""
    if text is None:
        return DENY  # RocketMQ's default for a missing defaultTopicPerm/defaultGroupPerm
    perm = _PERMS.get(str(text).strip().upper()) if isinstance(text, str) else None
    if perm is None:
        raise AclConfigError(f"{where}: permission {text!r} is not one of DENY, PUB, SUB, PUB|SUB")
    return perm


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed & ANY == ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


# ------------------------------------------------------------------------------------- address patterns


class AddressPattern:
    """One RemoteAddressStrategy: ``*`` (anyone), an exact address, ``192.168.0.*`` / ``192.168.1.1-100``
    (a range in one octet, the octets after it ``*``), or ``192.168.1.{1,2,3}`` (a list in the last octet)."""

    def __init__(self, text: str, where: str) -> None:
        self.text = text = text.strip()
        self._all = text in ("*", "*.*.*.*")
        self._exact: frozenset[str] = frozenset()
        self._prefix: tuple[str, ...] = ()
        self._range = (0, -1)
        if self._all:
            return
        bad = AclConfigError(f"{where}: address pattern {text!r} is not an IP address, '*', 'a.b.c.*', "
                             f"'a.b.c.x-y' or 'a.b.c.{{x,y}}'")
        if "{" in text:
            head, _, rest = text.partition("{")
            if not rest.endswith("}") or not head.endswith("."):
                raise bad
            self._exact = frozenset(head + part.strip() for part in rest[:-1].split(","))
            for addr in self._exact:
                _ip(addr, bad)
            return
        if "*" not in text and "-" not in text:
            _ip(text, bad)
            self._exact = frozenset([text])
            return
        parts = text.split(".")
        if len(parts) != 4:
            raise bad
        for i, part in enumerate(parts):
            if part == "*" or "-" in part:
                if any(p != "*" for p in parts[i + 1:]) or not all(_octet(p) for p in parts[:i]):
                    raise bad
                if part == "*":
                    self._range = (0, 255)
                else:
                    lo, _, hi = part.partition("-")
                    if not (_octet(lo) and _octet(hi) and int(lo) <= int(hi)):
                        raise bad
                    self._range = (int(lo), int(hi))
                self._prefix = tuple(parts[:i])
                return
        raise bad

    def match(self, host: str) -> bool:
        if self._all:
            return True
        if self._exact:
            return host in self._exact
        parts = host.split(".")
        n = len(self._prefix)
        if len(parts) != 4 or tuple(parts[:n]) != self._prefix or not parts[n].isdigit():
            return False
        return self._range[0] <= int(parts[n]) <= self._range[1]

    def __repr__(self) -> str:
        return f"AddressPattern({self.text!r})"


def _octet(text: str) -> bool:
    return text.isdigit() and 0 <= int(text) <= 255


def _ip(text: str, bad: Exception) -> None:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise bad from None


# ------------------------------------------------------------------------------------- accounts and policy


@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    white: AddressPattern | None = None
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    #: resource -> perm; groups are keyed by their retry topic, as PlainAccessResource does
    perms: Mapping[str, int] = field(default_factory=dict)
    #: HMAC-SHA1's keyed states for secret_key (signature.key_pads), made once per account
    pads: Pads = field(init=False, repr=False, compare=False)
    #: What this account may do, remembered per ``Need.key`` (an empty string: allowed; else the refusal).
    #: A reload builds new accounts, so it forgets. Bounded: past _MAX_DECISIONS the memory starts over.
    decisions: dict[Hashable, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pads", key_pads(self.secret_key))
        object.__setattr__(self, "decisions", {})


@dataclass(frozen=True, slots=True)
class Need:
    """What one request asks: its code, whether it needs admin, and the perm needed on each resource."""

    code: int
    admin: bool = False
    resources: Mapping[str, int] = field(default_factory=dict)
    #: A hashable name for exactly this need (same key, same admin flag and resources), or None: with it the
    #: policy remembers its decision for each account (the signature is still verified on every request).
    key: Hashable | None = field(default=None, compare=False)


_ALLOWED = ""  # a remembered decision: allowed; any other remembered string is the refusal's message
#: Remembered decisions per account and white-address answers per policy (a reload makes a new policy and
#: new accounts, so it forgets); past these many the memory starts over.
_MAX_DECISIONS = 65_536
_MAX_HOSTS = 4096


@dataclass(frozen=True, slots=True)
class Policy:
    source: str
    global_white: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = field(default_factory=dict)
    _white_hosts: dict[str, bool] = field(default_factory=dict, init=False, repr=False, compare=False)

    def whitelisted(self, host: str) -> bool:
        if not self.global_white:
            return False
        known = self._white_hosts.get(host)
        if known is None:
            known = any(p.match(host) for p in self.global_white)
            if len(self._white_hosts) >= _MAX_HOSTS:
                self._white_hosts.clear()
            self._white_hosts[host] = known
        return known

    @staticmethod
    def _unknown(host: str, ext_fields: Mapping[str, Any]) -> NoReturn:
        key = ext_fields.get(ACCESS_KEY)
        if not key:
            raise NoPermissionError(f"no AccessKey: the request from {host} is not signed and the address is "
                                    f"not whitelisted")
        raise NoPermissionError(f"No acl config for {key}")

    def decide(self, host: str, ext_fields: Mapping[str, Any], body: bytes | None, need: Need) -> None:
        """PlainPermissionManager.validate: returns when allowed, raises NoPermissionError when not.

        Every request's signature is verified; only what a signed account may do for a need with a key is
        remembered (per account, so a reloaded file forgets it). A whitelisted address, globally or for the
        account, is checked no further (RocketMQ's order). Written as one function with the C verification
        called directly: it runs before every request's handler, and each Python call saved is paid per
        request."""
        if self.global_white and self.whitelisted(host):
            return
        account = self.accounts.get(ext_fields.get(ACCESS_KEY) or "")
        if account is None:
            self._unknown(host, ext_fields)
        if account.white is not None and account.white.match(host):
            return
        pads = account.pads
        ok = _c_verify(ext_fields, pads[2], pads[3], body) if _c_verify is not None else None
        if not (ok if ok is not None else signature_valid(pads, ext_fields, body)):
            raise NoPermissionError(f"Check signature failed for accessKey={account.access_key}")
        key = need.key
        if key is None:
            self._authorize(account, need)
            return
        remembered = account.decisions.get(key)
        if remembered is None:
            remembered = self._remember(account, need, key)
        if remembered:
            raise NoPermissionError(remembered)

    def _remember(self, account: Account, need: Need, key: Hashable) -> str:
        try:
            self._authorize(account, need)
            remembered = _ALLOWED
        except NoPermissionError as exc:
            remembered = str(exc)
        decisions = account.decisions
        if len(decisions) >= _MAX_DECISIONS:
            decisions.clear()
        decisions[key] = remembered
        return remembered

    @staticmethod
    def _authorize(account: Account, need: Need) -> None:
        """Permission.checkPermission over the request's resources, for a signed account."""
        if need.admin and not account.admin:
            raise NoPermissionError(f"Need admin permission for request code={need.code}, but "
                                    f"accessKey={account.access_key} is not")
        if account.admin and not account.perms:
            return
        for resource, needed in need.resources.items():
            is_group = resource.startswith(RETRY_PREFIX)
            owned = account.perms.get(resource)
            if owned is None:
                owned = account.default_group_perm if is_group else account.default_topic_perm
            if not check_permission(needed, owned):
                name = f"group {resource[len(RETRY_PREFIX):]}" if is_group else f"topic {resource}"
                raise NoPermissionError(f"accessKey={account.access_key} has no {perm_name(needed)} permission "
                                        f"for {name} (it has {perm_name(owned)})")


def _field(doc: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if value is not None and not isinstance(value, kinds):
        raise AclConfigError(f"{where}: {key} must be a {getattr(kinds, '__name__', kinds)}, "
                             f"not {type(value).__name__}")
    return value


def _resource_perms(items: Any, where: str) -> Iterable[tuple[str, int]]:
    if items is None:
        return
    if not isinstance(items, list):
        raise AclConfigError(f"{where} must be a list of 'NAME=PERM'")
    for i, item in enumerate(items):
        name, eq, perm = str(item).partition("=")
        if not eq or not name.strip():
            raise AclConfigError(f"{where}[{i}]: {item!r} is not 'NAME=PERM'")
        yield name.strip(), parse_perm(perm.strip(), f"{where}[{i}]")


def parse_policy(text: str, source: str = "<acl>") -> Policy:
    """Parse a ``plain_acl.yml``; a bad file raises AclConfigError naming the file and the line or field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise AclConfigError(f"{source}:{line} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise AclConfigError(f"{source}: the top level must be a mapping, not {type(doc).__name__}")
    white = _field(doc, "globalWhiteRemoteAddresses", list, source) or []
    patterns = tuple(AddressPattern(str(w), f"{source}: globalWhiteRemoteAddresses[{i}]")
                     for i, w in enumerate(white) if str(w).strip())
    accounts: dict[str, Account] = {}
    for i, acc in enumerate(_field(doc, "accounts", list, source) or []):
        where = f"{source}: accounts[{i}]"
        if not isinstance(acc, dict):
            raise AclConfigError(f"{where} must be a mapping")
        ak, sk = acc.get("accessKey"), acc.get("secretKey")
        if ak is None or not str(ak).strip():
            raise AclConfigError(f"{where}.accessKey is missing")
        if sk is None or not str(sk).strip():
            raise AclConfigError(f"{where}.secretKey is missing")
        ak, sk = str(ak), str(sk)
        if ak in accounts:
            raise AclConfigError(f"{where}.accessKey {ak!r} is given twice")
        admin = acc.get("admin", False)
        if not isinstance(admin, bool):
            raise AclConfigError(f"{where}.admin must be true or false, not {admin!r}")
        white_text = acc.get("whiteRemoteAddress")
        white_pat = (AddressPattern(str(white_text), f"{where}.whiteRemoteAddress")
                     if white_text is not None and str(white_text).strip() else None)
        perms = dict(_resource_perms(acc.get("topicPerms"), f"{where}.topicPerms"))
        for group, perm in _resource_perms(acc.get("groupPerms"), f"{where}.groupPerms"):
            perms[retry_topic(group)] = perm
        accounts[ak] = Account(
            access_key=ak, secret_key=sk, admin=admin, white=white_pat,
            default_topic_perm=parse_perm(acc.get("defaultTopicPerm"), f"{where}.defaultTopicPerm"),
            default_group_perm=parse_perm(acc.get("defaultGroupPerm"), f"{where}.defaultGroupPerm"),
            perms=perms)
    return Policy(source=source, global_white=patterns, accounts=accounts)


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"{path}: cannot read the ACL file: {exc}") from None
    return parse_policy(text, str(path))
