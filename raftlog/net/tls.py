"""TLS on trio streams: the handshake under a deadline, and node identities in certificates.

The contexts come from raftlog.security.tls (built from the node's PEM files); this module
only drives trio.SSLStream. A handshake that fails or stalls yields one short reason (the ssl
module's, never a traceback) for the caller's single log line.

Node certificates (internal_security_protocol = SSL) name their node in the subject's common
name: exactly "node-<id>" (e.g. CN=node-2). The internal listener binds each connection to
that id, and a node dialling a peer checks that the certificate it is shown names that peer.
"""

from __future__ import annotations

import re
import ssl
from typing import Any

import trio

NODE_COMMON_NAME_PREFIX = "node-"
_NODE_COMMON_NAME = re.compile(r"node-(0|[1-9][0-9]{0,9})")
MAX_NODE_ID = 2**31 - 1


def node_common_name(node_id: int) -> str:
    return f"{NODE_COMMON_NAME_PREFIX}{node_id}"


def node_id_from_certificate(certificate: dict[str, Any] | None) -> int | None:
    """The node id a verified peer certificate names (subject CN "node-<id>"), else None.

    A subject with several common names names no node: which one would count is ambiguous.
    """
    if not certificate:
        return None
    common_names = [
        value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"
    ]
    if len(common_names) != 1:
        return None
    match = _NODE_COMMON_NAME.fullmatch(common_names[0])
    if match is None:
        return None
    node_id = int(match.group(1))
    return node_id if node_id <= MAX_NODE_ID else None


def failure_reason(exc: BaseException) -> str:
    """One line for a failed handshake: the ssl module's reason when there is one."""
    cause = exc.__cause__ or exc
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause.__class__.__name__)
    return str(cause) or cause.__class__.__name__


async def handshake(
    transport: trio.abc.Stream,
    context: ssl.SSLContext,
    timeout_s: float,
    *,
    server_side: bool,
    server_hostname: str | None = None,
) -> tuple[trio.SSLStream[Any] | None, str]:
    """(the TLS stream, "") once the handshake completed within timeout_s, else (None,
    reason). The caller closes the transport on failure."""
    stream = trio.SSLStream(
        transport, context, server_side=server_side, server_hostname=server_hostname
    )
    with trio.move_on_after(timeout_s) as scope:
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            return None, failure_reason(exc)
    if scope.cancelled_caught:
        return None, f"not completed within {timeout_s * 1000:.0f} ms"
    return stream, ""
