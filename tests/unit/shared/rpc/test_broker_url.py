"""KEEL_TRANSPORT_URL: one node or a cluster's nodes, as oslo.messaging writes them."""

from __future__ import annotations

import pytest

from shared.config import load_settings
from shared.exceptions import ConfigError
from shared.rpc.broker_url import (
    BadBrokerUrl,
    node_urls,
    user_of,
    with_user,
    without_credentials,
)


def test_one_node_is_one_url() -> None:
    assert node_urls("amqp://keel:pw@rabbit:5672/vh") == ["amqp://keel:pw@rabbit:5672/vh"]


def test_a_cluster_is_one_url_per_node_with_the_shared_credentials_vhost_and_query() -> None:
    url = "amqp://keel:s3cret@r1:5672,r2:5673,r3/keel?heartbeat=10"
    assert node_urls(url) == [
        "amqp://keel:s3cret@r1:5672/keel?heartbeat=10",
        "amqp://keel:s3cret@r2:5673/keel?heartbeat=10",
        "amqp://keel:s3cret@r3:5672/keel?heartbeat=10",
    ]


def test_a_node_may_carry_its_own_credentials() -> None:
    url = "amqp://a:1@r1:5672,b:2@r2:5672,r3:5672/"
    assert node_urls(url) == [
        "amqp://a:1@r1:5672/",
        "amqp://b:2@r2:5672/",
        "amqp://a:1@r3:5672/",
    ]


def test_amqps_nodes_default_to_the_tls_port_and_ipv6_literals_keep_their_brackets() -> None:
    assert node_urls("amqps://u:p@r1,[::1]/") == ["amqps://u:p@r1:5671/", "amqps://u:p@[::1]:5671/"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://r1/", "amqp:// or amqps://"),
        ("amqp:///vhost", "no broker host"),
        ("amqp://u:p@r1:5672,,r2/", "no host"),
        ("amqp://u:p@r1:5672,r2:notaport/", "invalid port"),
        ("amqp://u:p@r1:99999/", "invalid port"),
    ],
)
def test_malformed_urls_are_refused_saying_why(url: str, message: str) -> None:
    with pytest.raises(BadBrokerUrl, match=message):
        node_urls(url)


def test_the_setting_is_checked_and_named_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEEL_TRANSPORT_URL", "amqp://u:s3cret@r1,,r2/")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "KEEL_TRANSPORT_URL" in caught.value.message
    assert "no host" in caught.value.message
    assert "s3cret" not in caught.value.message


def test_a_cluster_url_is_a_valid_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_TRANSPORT_URL", "amqps://u:p@r1:5671,r2:5671/keel")
    assert load_settings().transport_url == "amqps://u:p@r1:5671,r2:5671/keel"


def test_logs_see_every_node_and_no_password() -> None:
    url = "amqp://a:pw1@r1:5672,b:pw2@r2:5672/keel?heartbeat=5"
    assert without_credentials(url) == "amqp://r1:5672,r2:5672/keel"


def test_user_and_replacing_it_on_every_node() -> None:
    url = "amqp://keel:pw@r1:5672,other:x@r2:5672/keel"
    assert user_of(url) == "keel"
    assert user_of("amqp://r1/") == "guest"
    replaced = with_user(url, "keel-compute-1", "p@ss")
    assert node_urls(replaced) == [
        "amqp://keel-compute-1:p%40ss@r1:5672/keel",
        "amqp://keel-compute-1:p%40ss@r2:5672/keel",
    ]
