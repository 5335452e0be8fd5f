"""Who a TLS client is: its certificate's subject as an RFC 2253 name, mapped to a principal
by Kafka's `ssl.principal.mapping.rules`.

Why this module: ACLs written for a Kafka cluster that authenticates clients by certificate
name principals such as "User:CN=app,OU=team,O=Example" or, after mapping rules, "User:app".
To carry those ACLs over unchanged, the name must be spelled exactly as Java's
X500Principal.getName() spells it (most specific RDN first, RFC 2253 keywords, its escaping),
and the rules must parse and apply as Kafka's SslPrincipalMapper does (first rule whose
pattern matches the whole name wins; no rule matching fails the connection). Java regex
patterns are run with Python's re, which agrees on everything rules use in practice; the
replacement's $n/${name} references and backslash escapes are translated as Java reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.errors import RemoteError

ANONYMOUS = "User:ANONYMOUS"

# Python's ssl names (OpenSSL long names) -> the keywords Java's RFC 2253 output uses.
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# Other attributes Java prints as OID=#<hex of the DER value>. The DER string type is not in
# getpeercert()'s output; these are the types certificate tools (OpenSSL, cryptography)
# use for them: IA5String for e-mail, PrintableString where the standard requires it, else
# UTF8String.
_IA5, _PRINTABLE, _UTF8 = 0x16, 0x13, 0x0C
_OTHER_ATTRIBUTES: Mapping[str, tuple[str, int]] = {
    "emailAddress": ("1.2.840.113549.1.9.1", _IA5),
    "serialNumber": ("2.5.4.5", _PRINTABLE),
    "dnQualifier": ("2.5.4.46", _PRINTABLE),
    "surname": ("2.5.4.4", _UTF8),
    "title": ("2.5.4.12", _UTF8),
    "businessCategory": ("2.5.4.15", _UTF8),
    "postalCode": ("2.5.4.17", _UTF8),
    "name": ("2.5.4.41", _UTF8),
    "givenName": ("2.5.4.42", _UTF8),
    "initials": ("2.5.4.43", _UTF8),
    "generationQualifier": ("2.5.4.44", _UTF8),
    "pseudonym": ("2.5.4.65", _UTF8),
}
_OID = re.compile(r"[0-9]+(\.[0-9]+)+")
_PRINTABLE_STRING_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"
)
# Java escapes these anywhere in a value, not only where RFC 2253 requires it.
_ESCAPED = frozenset(',=+<>#;"\\')


class NoMatchingRule(RemoteError, ValueError):
    """No mapping rule matched the certificate's name (Kafka fails the connection)."""


def distinguished_name(subject: Sequence[Sequence[tuple[str, str]]]) -> str:
    """The RFC 2253 name for `ssl.SSLSocket.getpeercert()["subject"]`, as Java's
    X500Principal.getName() gives it: most specific RDN first, "+" inside an RDN."""
    rdns = []
    for rdn in reversed(tuple(subject)):
        rdns.append("+".join(_attribute(name, value) for name, value in rdn))
    return ",".join(rdns)


def _attribute(name: str, value: str) -> str:
    keyword = _RFC2253_KEYWORDS.get(name)
    if keyword is not None:
        return f"{keyword}={_escape(value)}"
    oid, tag = _OTHER_ATTRIBUTES.get(name, (name, _UTF8))
    if not _OID.fullmatch(oid):
        # An attribute this table does not know by name: keep the name, escape the value.
        return f"{name}={_escape(value)}"
    if tag == _PRINTABLE and not set(value) <= _PRINTABLE_STRING_CHARS:
        tag = _UTF8
    if tag == _IA5 and not value.isascii():
        tag = _UTF8
    return f"{oid}=#{_der_string(tag, value.encode('utf-8')).hex()}"


def _der_string(tag: int, data: bytes) -> bytes:
    length = len(data)
    if length < 0x80:
        return bytes([tag, length]) + data
    length_bytes = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length_bytes)]) + length_bytes + data


def _escape(value: str) -> str:
    chars = []
    for ch in value:
        if ch in _ESCAPED:
            chars.append("\\" + ch)
        elif ch == "\x00":
            chars.append("\\00")
        else:
            chars.append(ch)
    # Then leading and trailing spaces (and CRs) are escaped one by one, as Java does.
    lead = 0
    while lead < len(chars) and chars[lead] in (" ", "\r"):
        lead += 1
    trail = len(chars) - 1
    while trail >= 0 and chars[trail] in (" ", "\r"):
        trail -= 1
    return "".join("\\" + ch if i < lead or i > trail else ch for i, ch in enumerate(chars))


# ---------------------------------------------------------------------------------------------
# ssl.principal.mapping.rules

# A replacement is literal text, a numbered group, or a named group.
_Part = str | int | tuple[str]


@dataclass(frozen=True, slots=True)
class _Rule:
    text: str
    pattern: re.Pattern[str] | None  # None for DEFAULT
    replacement: tuple[_Part, ...] = ()
    case: str = ""  # "", "L" or "U"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        result = self.pattern.sub(self._expand, dn)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result

    def _expand(self, match: re.Match[str]) -> str:
        out = []
        for part in self.replacement:
            if isinstance(part, str):
                out.append(part)
            else:
                group = match.group(part if isinstance(part, int) else part[0])
                out.append(group or "")
        return "".join(out)


@dataclass(frozen=True, slots=True)
class PrincipalMappingRules:
    """Parsed `ssl.principal.mapping.rules`: "RULE:pattern/replacement/[LU], ..., DEFAULT"."""

    rules: tuple[_Rule, ...]

    @classmethod
    def default(cls) -> PrincipalMappingRules:
        return cls.parse("DEFAULT")

    @classmethod
    def parse(cls, text: str) -> PrincipalMappingRules:
        """Parse Kafka's syntax; raise ValueError naming the rule and what is wrong."""
        rules: list[_Rule] = []
        pos = 0
        n = len(text)
        while True:
            while pos < n and text[pos].isspace():
                pos += 1
            if pos >= n:
                break
            if text[pos] == ",":  # an empty entry, as Kafka allows
                pos += 1
                continue
            start = pos
            if text.startswith("DEFAULT", pos):
                pos += len("DEFAULT")
                rule = _Rule(text="DEFAULT", pattern=None)
            elif text.startswith("RULE:", pos):
                pos += len("RULE:")
                pattern_text, pos = _until_slash(text, pos, start)
                replacement_text, pos = _until_slash(text, pos, start)
                case = ""
                if pos < n and text[pos] in "LU":
                    case = text[pos]
                    pos += 1
                rule = _compile_rule(text[start:pos], pattern_text, replacement_text, case)
            else:
                raise ValueError(
                    f"ssl.principal.mapping.rules: expected DEFAULT or RULE:pattern/replacement/ "
                    f"at {text[start : start + 40]!r}"
                )
            while pos < n and text[pos].isspace():
                pos += 1
            if pos < n and text[pos] != ",":
                raise ValueError(
                    f"ssl.principal.mapping.rules: unexpected {text[pos : pos + 40]!r} after "
                    f"rule {text[start:pos].strip()!r}"
                )
            rules.append(rule)
            pos += 1  # past the comma, or past the end
        if not rules:
            raise ValueError("ssl.principal.mapping.rules: no rules (use DEFAULT)")
        return cls(tuple(rules))

    def apply(self, dn: str) -> str:
        """The principal name for `dn`: the first matching rule's result. Raises
        NoMatchingRule when none matches."""
        for rule in self.rules:
            result = rule.apply(dn)
            if result is not None:
                return result
        raise NoMatchingRule(f"no ssl.principal.mapping.rules rule applies to {dn!r}")

    def __str__(self) -> str:
        return ", ".join(rule.text for rule in self.rules)


def _until_slash(text: str, pos: int, rule_start: int) -> tuple[str, int]:
    """Text up to the next unescaped '/', kept as written (backslashes included)."""
    out = []
    while pos < len(text):
        ch = text[pos]
        if ch == "\\" and pos + 1 < len(text):
            out.append(text[pos : pos + 2])
            pos += 2
            continue
        if ch == "/":
            return "".join(out), pos + 1
        out.append(ch)
        pos += 1
    raise ValueError(
        f"ssl.principal.mapping.rules: rule {text[rule_start:]!r} is not "
        "RULE:pattern/replacement/[LU] (missing '/')"
    )


# Java's named group "(?<name>" is Python's "(?P<name>"; lookbehinds "(?<=", "(?<!" stay.
_JAVA_NAMED_GROUP = re.compile(r"(?<!\\)\(\?<(?![=!])")


def _compile_rule(text: str, pattern_text: str, replacement_text: str, case: str) -> _Rule:
    try:
        pattern = re.compile(_JAVA_NAMED_GROUP.sub("(?P<", pattern_text))
    except re.error as exc:
        raise ValueError(
            f"ssl.principal.mapping.rules: rule {text!r} has a bad pattern: {exc}"
        ) from exc
    replacement = _parse_replacement(text, replacement_text, pattern)
    return _Rule(text=text, pattern=pattern, replacement=replacement, case=case)


def _parse_replacement(text: str, replacement: str, pattern: re.Pattern[str]) -> tuple[_Part, ...]:
    """Java's Matcher replacement syntax: "\\x" is x, "$n" a group (read greedily while the
    number stays a group, as Java does), "${name}" a named group. As in Kafka, a "$n" past
    the last group is literal text when the pattern has groups."""
    groups = pattern.groups
    parts: list[_Part] = []
    literal: list[str] = []

    def bad(why: str) -> ValueError:
        return ValueError(f"ssl.principal.mapping.rules: rule {text!r}: {why}")

    def flush() -> None:
        if literal:
            parts.append("".join(literal))
            literal.clear()

    i = 0
    while i < len(replacement):
        ch = replacement[i]
        if ch == "\\":
            if i + 1 == len(replacement):
                raise bad("replacement ends in a lone backslash")
            literal.append(replacement[i + 1])
            i += 2
            continue
        if ch != "$":
            literal.append(ch)
            i += 1
            continue
        if i + 1 == len(replacement):
            raise bad("replacement ends in a lone '$'")
        nxt = replacement[i + 1]
        if nxt == "{":
            end = replacement.find("}", i + 2)
            name = replacement[i + 2 : end] if end != -1 else ""
            if end == -1 or name not in pattern.groupindex:
                raise bad(f"replacement names a group the pattern lacks: {replacement[i:]!r}")
            flush()
            parts.append((name,))
            i = end + 1
            continue
        if not nxt.isdigit() or not nxt.isascii():
            raise bad(f"illegal group reference {replacement[i : i + 2]!r} in replacement")
        number = int(nxt)
        if number > groups:
            if groups == 0:
                raise bad(f"replacement refers to group {number} but the pattern has no groups")
            literal.append("$")  # Kafka escapes a reference past the last group
            i += 1
            continue
        i += 2
        while i < len(replacement) and replacement[i].isascii() and replacement[i].isdigit():
            longer = number * 10 + int(replacement[i])
            if longer > groups:
                break
            number = longer
            i += 1
        flush()
        parts.append(number)
    flush()
    return tuple(parts)


def principal_from_certificate(
    peer_cert: Mapping[str, Any] | None, rules: PrincipalMappingRules
) -> str:
    """The principal of a TLS peer from `getpeercert()`: "User:<mapped name>", or
    "User:ANONYMOUS" when the peer sent no (verified) certificate. Raises NoMatchingRule
    when no rule applies and ValueError when the mapped name is empty; either way the
    connection must not go on."""
    if not peer_cert:
        return ANONYMOUS
    subject = peer_cert.get("subject")
    if not isinstance(subject, tuple | list):
        raise ValueError("peer certificate has no subject")
    name = rules.apply(distinguished_name(subject))
    if not name:
        raise ValueError("peer certificate maps to an empty principal name")
    return f"User:{name}"
