"""The Hugging Face Hub, when a name is not a local path: offline is decided once, fast.

Without a network, ``from_pretrained("gpt2")`` retries for about 50 seconds before it fails. So
before the first hub name is resolved, one TCP connection to the hub (or to the HTTPS proxy) is
tried with a short timeout; if it fails, this process goes offline (as if ``HF_HUB_OFFLINE`` had
been set): names already in the local cache still load, others fail at once with a message
that says why. ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE``/``HF_DATASETS_OFFLINE``) is
respected as set.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 3.0
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


def looks_local(name: str) -> bool:
    """A name meant as a path (``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x.json``), not a hub id."""
    return (name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name or name.endswith(".json")
            or Path(name).expanduser().exists())


def hub_offline() -> bool:
    """True when the hub is not to be asked: offline by the environment, or unreachable (probed
    once per process; an unreachable hub turns this process's offline mode on)."""
    if any(os.environ.get(v, "").upper() in _TRUE for v in _OFFLINE_VARS):
        return True
    if _reachable():
        return False
    _go_offline()
    return True


def offline_reason() -> str:
    """Why the hub was not asked, for a message."""
    if _probed_offline:
        return f"the Hugging Face Hub ({_endpoint_host()}) cannot be reached"
    return "offline mode is on (HF_HUB_OFFLINE)"


_probed_offline = False


@lru_cache(maxsize=1)
def _reachable() -> bool:
    import socket

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlsplit(proxy if proxy else os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = target.hostname or "huggingface.co"
    port = target.port or (443 if target.scheme == "https" or not proxy else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _endpoint_host() -> str:
    return urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"


def _go_offline() -> None:
    """This process's offline mode on, as ``HF_HUB_OFFLINE=1`` would have set it at import time
    (the environment is left as it is)."""
    global _probed_offline
    _probed_offline = True
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True  # transformers asks it at each call
    if "datasets.config" in sys.modules:  # imported already: it copied the value at import time
        sys.modules["datasets.config"].HF_HUB_OFFLINE = True
        sys.modules["datasets.config"].HF_DATASETS_OFFLINE = True
