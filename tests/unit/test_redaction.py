"""The dry run's rule for a value it must not show: a variable whose name has a secret-looking word."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

from xlarun.planning.dryrun import REDACTED, SECRET_ENDINGS, SECRET_WORDS, looks_secret, shown_value


@pytest.mark.parametrize(
    "name, secret",
    [
        ("KUBEFLOW_TRAINER_STATUS_TOKEN", True),
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("my.api-key", True),
        ("PGPASSWORD", True),
        ("OPENAI_APIKEY", True),
        ("AWS_SESSIONTOKEN", True),
        ("GITHUB_PAT", True),
        ("AUTH", True),
        ("NPM_AUTH_TOKEN", True),
        ("awsSessionToken", True),
        ("openaiApiKey", True),
        ("AZURE_CLIENTSECRET", True),
        ("MYSQL_PWD_PASSWD", True),
        ("SSH_PRIVATEKEY", True),
        ("AWS_ACCESSKEY_ID", True),
        ("CLIENT_CREDENTIALS", True),
        ("MONKEY_PATCH", False),
        ("HOTKEY", False),
        ("PATH", False),
        ("PYTHONPATH", False),
        ("LD_LIBRARY_PATH", False),
        ("TPU_LIBRARY_PATH", False),
        ("AUTHOR", False),
        ("GIT_AUTHOR_NAME", False),
        ("OAUTH_CLIENT_ID", False),
        ("PWD", False),
        ("PASSTHROUGH", False),
        ("XLA_FLAGS", False),
        ("PJRT_DEVICE", False),
        ("HF_HOME", False),
        ("WANDB_PROJECT", False),
        ("PATIENCE", False),
        ("SPAT", False),
        ("TOKENS_PER_BATCH", False),
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


def test_the_manual_states_the_rule_the_code_keeps() -> None:
    page = (REPO / "docs" / "dry-run.md").read_text()
    rule = page[page.index("A name\nlooks secret") :].split("\n\n")[0]
    named = set(re.findall(r"`([A-Z]+)`", rule))
    assert set(SECRET_ENDINGS) | set(SECRET_WORDS) <= named
    for example in re.findall(r"`([A-Za-z][A-Za-z_]*)`", rule):
        assert looks_secret(example) is (
            example not in ("TOKENIZERS_PARALLELISM", "HOTKEY", "PYTHONPATH", "GIT_AUTHOR_NAME")
        )
