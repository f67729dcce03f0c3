"""The operator-facing files stay true to the code: config example, compose file, the guide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from shared.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[4]


def setting_env_names() -> list[str]:
    """Every ``KEEL_*`` variable the settings accept, nested groups joined with ``__``."""
    names = []
    for name, info in Settings.model_fields.items():
        group = info.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            names += [f"KEEL_{name.upper()}__{sub.upper()}" for sub in group.model_fields]
        else:
            names.append(f"KEEL_{name.upper()}")
    return names


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_config_example_loads_and_states_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in setting_env_names():
        monkeypatch.delenv(name, raising=False)
    example = load_settings(ROOT / "deploy" / "keel.toml.example")
    defaults = Settings()
    assert example.model_dump(exclude={"auth", "host"}) == defaults.model_dump(
        exclude={"auth", "host"}
    )
    assert all(info.roles for info in example.auth.tokens.values())


@pytest.mark.parametrize("document", ["deploy/keel.toml.example", "docs/configuration.md"])
def test_every_setting_is_documented(document: str) -> None:
    text = (ROOT / document).read_text()
    missing = [name for name in setting_env_names() if name not in text]
    assert missing == []


def test_compose_runs_every_process_after_the_migration(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {
        "postgres", "rabbitmq", "migrate", "api", "conductor", "scheduler", "compute1", "compute2",
    }  # fmt: skip
    assert services["migrate"]["command"] == ["keel-manage", "db", "sync"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "conductor", "scheduler"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["rabbitmq"]["condition"] == "service_healthy"
    for name in ("postgres", "rabbitmq"):
        assert services[name]["healthcheck"]["test"]
    assert any(p.endswith(":8774:8774") for p in services["api"]["ports"])


def test_compose_agents_have_own_host_and_state_and_no_database(compose: dict[str, Any]) -> None:
    agents = [compose["services"][name] for name in ("compute1", "compute2")]
    assert [a["environment"]["KEEL_HOST"] for a in agents] == ["compute1", "compute2"]
    volumes = [a["volumes"][0].split(":")[0] for a in agents]
    assert len(set(volumes)) == 2
    assert set(volumes) <= set(compose["volumes"])
    for agent in agents:
        assert agent["command"] == ["keel-compute"]
        assert "KEEL_DATABASE_URL" not in agent["environment"]


def test_compose_secrets_come_from_an_env_file(compose: dict[str, Any]) -> None:
    example = (ROOT / "deploy" / "keel.env.example").read_text()
    api_env = compose["services"]["api"]["environment"]
    assert api_env["KEEL_AUTH__TOKENS"].startswith("${KEEL_AUTH__TOKENS:?")
    for variable in ("POSTGRES_PASSWORD", "RABBITMQ_PASSWORD", "KEEL_AUTH__TOKENS"):
        assert f"\n{variable}=" in example


@pytest.fixture(scope="module")
def compose_ha() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.ha.yml").read_text())
    return loaded


def test_compose_ha_clusters_three_broker_nodes_on_one_cookie(compose_ha: dict[str, Any]) -> None:
    services = compose_ha["services"]
    nodes = [services[name] for name in ("rabbitmq", "rabbitmq2", "rabbitmq3")]
    assert [node["hostname"] for node in nodes] == ["rabbitmq", "rabbitmq2", "rabbitmq3"]
    config = (ROOT / "deploy" / "ha" / "rabbitmq-cluster.conf").read_text()
    for number, name in enumerate(("rabbitmq", "rabbitmq2", "rabbitmq3"), start=1):
        assert f"classic_config.nodes.{number} = rabbit@{name}" in config
    assert "cluster_partition_handling = pause_minority" in config
    for node in nodes:
        assert any("rabbitmq-cluster.conf" in volume for volume in node["volumes"])
        assert node["environment"]["RABBITMQ_ERLANG_COOKIE"].startswith(
            "${RABBITMQ_ERLANG_COOKIE:?"
        )
    data = [node["volumes"][0].split(":")[0] for node in nodes]
    assert len(set(data)) == 3
    example = (ROOT / "deploy" / "keel.env.example").read_text()
    assert "\nRABBITMQ_ERLANG_COOKIE=" in example


def test_compose_ha_fails_the_database_over_with_patroni(compose_ha: dict[str, Any]) -> None:
    services = compose_ha["services"]
    nodes = [services[name] for name in ("postgres", "postgres2")]
    for node in nodes:
        assert node["build"]["dockerfile"] == "deploy/ha/Dockerfile.patroni"
        assert node["depends_on"]["etcd"]["condition"] == "service_healthy"
        assert node["environment"]["PATRONI_ETCD3_HOSTS"] == "etcd:2379"
    assert [n["environment"]["PATRONI_NAME"] for n in nodes] == ["postgres", "postgres2"]
    assert "etcd" in services
    url = services["api"]["environment"]["KEEL_DATABASE_URL"]
    assert "@postgres:5432,postgres2:5432/keel?target_session_attrs=read-write" in url

    patroni = yaml.safe_load((ROOT / "deploy" / "ha" / "patroni.yml").read_text())
    dcs = patroni["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True
    assert dcs["primary_start_timeout"] == 0
    assert patroni["bootstrap"]["post_bootstrap"] == "/etc/patroni/create-keel-database.sh"
    dockerfile = (ROOT / "deploy" / "ha" / "Dockerfile.patroni").read_text()
    assert "patroni-requirements.txt" in dockerfile
    assert "/etc/patroni/create-keel-database.sh" in dockerfile


def test_patroni_is_pinned_and_installed_by_the_set_up_script() -> None:
    pins = [
        line
        for line in (ROOT / "deploy" / "ha" / "patroni-requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pins
    assert all("==" in line for line in pins)
    assert any(line.startswith("patroni==") for line in pins)
    script = (ROOT / "deploy" / "dev-servers.sh").read_text()
    assert "ha/patroni-requirements.txt" in script
    assert "etcd-server" in script
