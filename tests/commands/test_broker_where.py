"""How commands name the broker they talk to: never a password, never "default broker"."""

from __future__ import annotations

import argparse

import pytest

from flowengine.commands import broker_options


def _args(url=None, transport=None):
    return argparse.Namespace(url=url, transport=transport, transport_options=[], exchange="shop")


@pytest.mark.parametrize(
    "url, transport, shown",
    [
        (None, None, "amqp://guest:**@localhost:5672// / shop"),  # kombu's default, named
        ("redis://127.0.0.1:6399/0", None, "redis://127.0.0.1:6399/0 / shop"),
        ("redis://:s3cret@127.0.0.1:6399/0", None, "redis://:**@127.0.0.1:6399/0 / shop"),
        (None, "redis", "redis://localhost:6379// / shop"),
    ],
)
def test_where_names_the_broker_reached(url, transport, shown):
    assert broker_options.where(_args(url, transport)) == shown
