"""Which job-detail keys the default policy treats as secrets."""

from __future__ import annotations

import pytest

from flowengine.jobs import masking


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "db_password",
        "DB_PASSWORD",
        "apiKey",
        "api-key",
        "X-Auth-Token",
        "secret",
        "ssh.private_key",
        "passwd",
        "accessKey",
        "cookie",
    ],
)
def test_a_key_with_a_secret_word_is_masked(key):
    assert masking.looks_secret(key)
    assert masking.mask_secrets({"store": {key: "hunter2"}}) == {"store": {key: "***"}}


@pytest.mark.parametrize(
    "key",
    [
        "passenger",
        "monkey",
        "keyboard",
        "author",
        "tokenizer_name",
        "compass",
        "privateer",
        "flow_uuid",
    ],
)
def test_a_key_that_only_contains_a_secret_word_is_shown(key):
    assert not masking.looks_secret(key)
    assert masking.mask_secrets({key: "visible"}) == {key: "visible"}


def test_the_default_policy_is_the_word_rule_at_any_depth():
    mask = masking.masker("secrets")
    details = {"flow_uuid": "f", "store": {"passenger": "Ann", "items": [{"token": "t"}]}}
    assert mask(details) == {
        "flow_uuid": "f",
        "store": {"passenger": "Ann", "items": [{"token": "***"}]},
    }
