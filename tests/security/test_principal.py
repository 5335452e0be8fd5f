"""Certificate names in Java's RFC 2253 spelling, and Kafka's principal mapping rules."""

from __future__ import annotations

import pytest

from raftlog.security.principal import (
    ANONYMOUS,
    NoMatchingRule,
    PrincipalMappingRules,
    distinguished_name,
    principal_from_certificate,
)


def subject(*rdns: tuple[str, str]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """getpeercert()'s shape: most general RDN first, each a tuple of (name, value)."""
    return tuple((rdn,) for rdn in rdns)


NODE_SUBJECT = subject(
    ("countryName", "US"),
    ("stateOrProvinceName", "CA"),
    ("localityName", "Palo Alto"),
    ("organizationName", "Example"),
    ("organizationalUnitName", "raftlog"),
    ("commonName", "node-1"),
)


def test_most_specific_first_with_rfc2253_keywords() -> None:
    assert (
        distinguished_name(NODE_SUBJECT) == "CN=node-1,OU=raftlog,O=Example,L=Palo Alto,ST=CA,C=US"
    )
    assert distinguished_name(
        subject(
            ("domainComponent", "com"),
            ("domainComponent", "ex"),
            ("userId", "u1"),
            ("streetAddress", "Main St"),
        )
    ) == ("STREET=Main St,UID=u1,DC=ex,DC=com")
    assert distinguished_name(()) == ""


def test_multi_valued_rdn() -> None:
    multi = (("commonName", "a"), ("userId", "u1"))
    assert distinguished_name((multi, (("organizationName", "O"),))) == "O=O,CN=a+UID=u1"
    assert distinguished_name(((("organizationName", "O"),), multi)) == "CN=a+UID=u1,O=O"


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("a,b", "a\\,b"),
        ("a+b", "a\\+b"),
        ('a"b', 'a\\"b'),
        ("a\\b", "a\\\\b"),
        ("a<b>c", "a\\<b\\>c"),
        ("a;b", "a\\;b"),
        ("a=b", "a\\=b"),
        ("#ab", "\\#ab"),
        ("a#b", "a\\#b"),
        (" ab", "\\ ab"),
        ("ab  ", "ab\\ \\ "),
        ("a b", "a b"),
        ("   ", "\\ \\ \\ "),
        ("a\x00b", "a\\00b"),
        ("Zoë", "Zoë"),
    ],
)
def test_value_escaping(value: str, escaped: str) -> None:
    assert distinguished_name(subject(("commonName", value))) == f"CN={escaped}"


def test_other_attributes_as_oid_and_der_hex() -> None:
    # As Java prints them: OID=#<tag><length><bytes>, lower-case hex.
    assert distinguished_name(subject(("emailAddress", "a@b.c"))) == (
        "1.2.840.113549.1.9.1=#16056140622e63"
    )
    assert distinguished_name(subject(("serialNumber", "42"))) == "2.5.4.5=#13023432"
    assert distinguished_name(subject(("givenName", "é"))) == "2.5.4.42=#0c02c3a9"
    assert distinguished_name(subject(("1.2.3.4", "x"))) == "1.2.3.4=#0c0178"
    long_value = "x" * 200
    assert distinguished_name(subject(("title", long_value))) == (
        "2.5.4.12=#0c81c8" + long_value.encode().hex()
    )


# --- mapping rules --------------------------------------------------------------------------


def test_default() -> None:
    rules = PrincipalMappingRules.parse("DEFAULT")
    assert rules.apply("CN=a,O=b") == "CN=a,O=b"
    assert PrincipalMappingRules.default().apply("CN=x") == "CN=x"


def test_rule_then_default() -> None:
    rules = PrincipalMappingRules.parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT")
    assert rules.apply("CN=kafka1,OU=ServiceUsers,O=Org,C=US") == "kafka1"
    assert rules.apply("CN=adminUser,OU=Admin,O=Org") == "CN=adminUser,OU=Admin,O=Org"


def test_several_groups_and_case() -> None:
    text = (
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, "
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U,"
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/  ,DEFAULT"
    )
    rules = PrincipalMappingRules.parse(text)
    assert rules.apply("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Palo Alto,ST=CA,C=US") == (
        "duke@javasoft"
    )
    assert rules.apply("cn=duke,ou=javasoft,dc=example,dc=com") == "DUKE@JAVASOFT"
    assert rules.apply("CN=Duke,OU=JavaSoft,O=Sun") == "Duke@JavaSoft"
    assert rules.apply("OU=only") == "OU=only"


def test_first_match_wins_and_no_match_fails() -> None:
    rules = PrincipalMappingRules.parse("RULE:^CN=(.*)$/first-$1/, RULE:^CN=(.*)$/second/")
    assert rules.apply("CN=x") == "first-x"
    with pytest.raises(NoMatchingRule, match="O=y"):
        rules.apply("O=y")


def test_pattern_must_match_the_whole_name() -> None:
    rules = PrincipalMappingRules.parse("RULE:CN=([^,]*)/$1/")
    assert rules.apply("CN=app") == "app"
    with pytest.raises(NoMatchingRule):
        rules.apply("CN=app,O=Org")  # Java's matches(): no partial match


def test_escaped_slash_and_comma_in_pattern() -> None:
    rules = PrincipalMappingRules.parse(r"RULE:^CN=([^,]*)\/(.*),O=Org$/$1\/$2/, DEFAULT")
    assert rules.apply("CN=team/app,O=Org") == "team/app"
    assert str(rules) == r"RULE:^CN=([^,]*)\/(.*),O=Org$/$1\/$2/, DEFAULT"


def test_replacement_escapes_and_literal_dollar() -> None:
    rules = PrincipalMappingRules.parse(r"RULE:^CN=(.*)$/\$$1\\x/")
    assert rules.apply("CN=a") == "$a\\x"


def test_back_reference_past_last_group_is_literal() -> None:
    # Kafka: with groups present, $4 past the last group is text; $12 with one group is $1
    # then "2"; $0 is the whole match.
    rules = PrincipalMappingRules.parse("RULE:^CN=(.*)$/$1@$4/")
    assert rules.apply("CN=a") == "a@$4"
    assert PrincipalMappingRules.parse("RULE:^CN=(.*)$/$12/").apply("CN=a") == "a2"
    assert PrincipalMappingRules.parse("RULE:^CN=(.*)$/<$0>/").apply("CN=a") == "<CN=a>"
    many = "RULE:^(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)$/$12-$13/"
    assert PrincipalMappingRules.parse(many).apply("abcdefghijkl") == "l-a3"


def test_named_groups_java_syntax() -> None:
    rules = PrincipalMappingRules.parse("RULE:^CN=(?<app>[^,]*),O=(?<org>.*)$/${app}.${org}/")
    assert rules.apply("CN=x,O=y") == "x.y"
    lookbehind = PrincipalMappingRules.parse("RULE:^CN=(.*)(?<!z)$/$1/")
    assert lookbehind.apply("CN=ab") == "ab"


def test_optional_group_that_did_not_match_is_empty() -> None:
    rules = PrincipalMappingRules.parse("RULE:^CN=(a)?(.*)$/[$1][$2]/")
    assert rules.apply("CN=bc") == "[][bc]"


def test_empty_entries_are_ignored() -> None:
    rules = PrincipalMappingRules.parse(" , DEFAULT ,, ")
    assert len(rules.rules) == 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        ",",
        "RULE:a/b",  # missing final slash
        "RULE:a",
        "RULE:a/b/X",
        "RULE:a/b/LU",
        "RULE:a/b/ junk",
        "DEFAULTX",
        "DEFAULT junk",
        "default",
        "FOO",
        "RULE:(unclosed/$1/",
        "RULE:a/$1/",  # no groups to refer to
        "RULE:(a)/$/",
        "RULE:(a)/$x/",
        "RULE:(a)/${nope}/",
        "RULE:(a)/${x/",
        r"RULE:(a)/x\/",  # the backslash eats the final slash
        r"RULE:\p{Alpha}/x/",  # Java-only regex syntax
    ],
)
def test_bad_syntax(text: str) -> None:
    with pytest.raises(ValueError, match=r"ssl\.principal\.mapping\.rules"):
        PrincipalMappingRules.parse(text)


# --- principal_from_certificate -------------------------------------------------------------


def test_principal_from_certificate() -> None:
    cert = {"subject": NODE_SUBJECT, "issuer": NODE_SUBJECT}
    assert principal_from_certificate(cert, PrincipalMappingRules.default()) == (
        "User:CN=node-1,OU=raftlog,O=Example,L=Palo Alto,ST=CA,C=US"
    )
    rules = PrincipalMappingRules.parse("RULE:^CN=([^,]*),.*$/$1/")
    assert principal_from_certificate(cert, rules) == "User:node-1"


def test_no_certificate_is_anonymous() -> None:
    rules = PrincipalMappingRules.default()
    assert principal_from_certificate(None, rules) == ANONYMOUS == "User:ANONYMOUS"
    # getpeercert() gives {} for a certificate that was not verified (CERT_NONE).
    assert principal_from_certificate({}, rules) == ANONYMOUS


def test_certificate_that_maps_to_nothing_fails() -> None:
    with pytest.raises(ValueError):
        principal_from_certificate({"subject": ()}, PrincipalMappingRules.default())
    with pytest.raises(ValueError):
        principal_from_certificate({"issuer": ()}, PrincipalMappingRules.default())
    with pytest.raises(NoMatchingRule):
        principal_from_certificate(
            {"subject": NODE_SUBJECT}, PrincipalMappingRules.parse("RULE:^O=(.*)$/$1/")
        )
