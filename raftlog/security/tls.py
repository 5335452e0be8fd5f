"""TLS contexts for the listeners and for raftlog's own client, from PEM files.

Why this module: a node reads its certificate, key and CA once at start-up, and an operator
who got a path or a file wrong should hear which file and what is wrong with it ("not a PEM
certificate", "key does not match certificate", "wrong password"), not the ssl module's
"[SSL] PEM lib (_ssl.c:3900)". The settings are Kafka's: TLS 1.2 or later only, no
compression (CRIME) and no renegotiation, and `ssl.client.auth` = none | requested | required.
Only stdlib ssl builds the contexts; `cryptography` is used only to say what went wrong.
Driving the handshake on a trio stream is raftlog.net.tls's job.
"""

from __future__ import annotations

import os
import ssl

from raftlog.errors import ConfigError

# Kafka's ssl.client.auth values.
CLIENT_AUTH = ("none", "requested", "required")
MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2
_HARDENING_OPTIONS = ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION


def server_context(
    *,
    certfile: str,
    keyfile: str,
    cafile: str | None,
    client_auth: str = "none",
    key_password: str | None = None,
) -> ssl.SSLContext:
    """The context a listener wraps accepted connections in. With client_auth "requested" a
    client certificate is checked if sent; with "required" a client without one is refused.
    Raises ConfigError naming the file and the problem."""
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(
            f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _harden(context)
    _load_chain(context, certfile, keyfile, key_password)
    if client_auth != "none":
        if not cafile:
            raise ConfigError(
                f"ssl.client.auth={client_auth} needs a CA file to check client certificates"
            )
        _load_ca(context, cafile)
        context.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    return context


def client_context(
    *,
    cafile: str | None,
    certfile: str | None = None,
    keyfile: str | None = None,
    check_hostname: bool = True,
    key_password: str | None = None,
) -> ssl.SSLContext:
    """The context for connecting to a TLS listener (or to another node). The server's
    certificate is always verified: against `cafile`, or the system's CAs when it is None;
    `check_hostname=False` skips only the name check. `certfile` (and `keyfile`, unless the
    key is in certfile) is the client certificate for mutual TLS."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _harden(context)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if cafile:
        _load_ca(context, cafile)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if certfile:
        _load_chain(context, certfile, keyfile or certfile, key_password)
    elif keyfile:
        raise ConfigError(f"TLS key file {keyfile} given without a certificate file")
    return context


def _harden(context: ssl.SSLContext) -> None:
    context.minimum_version = MIN_TLS_VERSION
    context.options |= _HARDENING_OPTIONS


def _load_chain(
    context: ssl.SSLContext, certfile: str, keyfile: str, key_password: str | None
) -> None:
    for what, path in (("certificate", certfile), ("key", keyfile)):
        _check_readable(what, path)
    try:
        context.load_cert_chain(certfile, keyfile, password=key_password or None)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(_diagnose_chain(certfile, keyfile, key_password, exc)) from None


def _load_ca(context: ssl.SSLContext, cafile: str) -> None:
    _check_readable("CA", cafile)
    try:
        context.load_verify_locations(cafile=cafile)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            f"TLS CA file {cafile}: no usable PEM CA certificate ({_ssl_reason(exc)})"
        ) from None


def _check_readable(what: str, path: str) -> None:
    if not path:
        raise ConfigError(f"TLS {what} file is not set")
    if not os.path.isfile(path):
        raise ConfigError(f"TLS {what} file {path}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"TLS {what} file {path}: not readable by this process")


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    return str(exc)


def _diagnose_chain(
    certfile: str, keyfile: str, key_password: str | None, exc: BaseException
) -> str:
    """Say which of certfile and keyfile is wrong, and how, for a failed load_cert_chain."""
    # Imported here: only an operator's mistake pays for loading it.
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        with open(certfile, "rb") as f:
            cert_pem = f.read()
        with open(keyfile, "rb") as f:
            key_pem = f.read()
    except OSError as read_error:
        return f"TLS certificate/key: cannot read: {read_error}"
    try:
        certificate = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        return f"TLS certificate file {certfile}: not a PEM certificate"
    password = key_password.encode("utf-8") if key_password else None
    try:
        key = serialization.load_pem_private_key(key_pem, password=password)
    except TypeError:
        if password is None:
            return f"TLS key file {keyfile}: the key is encrypted and no key password is set"
        return f"TLS key file {keyfile}: a key password is set but the key is not encrypted"
    except ValueError:
        if password is not None and b"ENCRYPTED" in key_pem:
            return f"TLS key file {keyfile}: wrong key password"
        return f"TLS key file {keyfile}: not a PEM private key"
    except Exception as other:  # an unsupported key type, say
        return f"TLS key file {keyfile}: cannot load the key ({other})"
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if key.public_key().public_bytes(encoding, public) != certificate.public_key().public_bytes(
        encoding, public
    ):
        return f"TLS key file {keyfile} does not match the certificate in {certfile}"
    return f"TLS certificate {certfile} / key {keyfile}: {_ssl_reason(exc)}"
