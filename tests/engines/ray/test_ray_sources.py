"""The Ray engine's source checks, before any cluster starts: a URL's secrets are not in their messages."""

from __future__ import annotations

import pytest

from lengthscan.engines.ray.session import EngineError
from lengthscan.engines.ray.sources import check_source


def test_a_refused_url_is_named_without_its_credentials_or_query():
    with pytest.raises(EngineError) as raised:
        check_source("https://alice7q:s3cr3tPW@host/x.parquet?X-Amz-Signature=SIGdeadbeef")
    message = str(raised.value)
    assert message.startswith("https://***@host/x.parquet: cannot open this object-storage location")
    assert not any(s in message for s in ("alice7q", "s3cr3tPW", "SIGdeadbeef", "Signature"))
