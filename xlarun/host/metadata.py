"""A GCE VM's metadata server: how a TPU VM learns its own slice (``--cluster tpu-vm``).

Usage::

    text = instance_attribute("agent-worker-number", environ)   # "1"

Every TPU VM of a slice serves its worker number (``agent-worker-number``), the slice's hosts in
worker order (``worker-network-endpoints``, ``<name>:<uid>:<ip>`` each) and its shape
(``tpu-env``), the attributes torch_xla itself reads (``torch_xla/_internal/tpu.py``) and the
README's old pod recipe fetched with curl. Requests carry ``Metadata-Flavor: Google`` and go to
``metadata.google.internal``, or to ``GCE_METADATA_HOST`` (``host[:port]``) where set, as Google's
own clients (google-auth) let it point elsewhere: the tests serve a stub on 127.0.0.1. No proxy
is used (the server is link-local), and urllib is imported only on this path.
"""

from __future__ import annotations

from collections.abc import Mapping

METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
ATTRIBUTES_PATH = "/computeMetadata/v1/instance/attributes/"
TIMEOUT_S = 5.0
"""Per request: the server answers within milliseconds on a VM; off GCE its name does not resolve."""


class MetadataError(Exception):
    """An attribute the metadata server did not give, with the reason in one line."""


def metadata_host(environ: Mapping[str, str]) -> str:
    return environ.get(METADATA_HOST_VARIABLE) or DEFAULT_METADATA_HOST


def instance_attribute(key: str, environ: Mapping[str, str], timeout: float = TIMEOUT_S) -> str:
    """The text of instance attribute ``key``; raises :class:`MetadataError` where it cannot be had."""
    import urllib.error
    import urllib.request

    host = metadata_host(environ)
    request = urllib.request.Request(f"http://{host}{ATTRIBUTES_PATH}{key}", headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as error:
        raise MetadataError(f"the metadata server at {host} answered {error.code} for {key}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise MetadataError(f"cannot reach the metadata server at {host} for {key}: {reason}") from None
