"""The dry run's rule for a value it must not show: a variable whose name has a secret-looking word."""

from __future__ import annotations

import pytest

from xlarun.planning.dryrun import REDACTED, looks_secret, shown_value


@pytest.mark.parametrize(
    "name, secret",
    [
        ("KUBEFLOW_TRAINER_STATUS_TOKEN", True),
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("my.api-key", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("KEYBOARD", False),
        ("KUBEFLOW_TRAINER_STATUS_CA_CERT", False),
        ("TRACEPARENT", False),
        ("BAGGAGE", False),
        ("MASTER_ADDR", False),
    ],
)
def test_a_name_looks_secret_by_its_words(name: str, secret: bool) -> None:
    assert looks_secret(name) is secret
    assert (shown_value(name, "value") == REDACTED) is secret
