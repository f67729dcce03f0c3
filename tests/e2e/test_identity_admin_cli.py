"""The identity admin API through the stock ``openstack`` CLI, as an operator uses it.

An admin made with keel-manage creates a project and a user with ``openstack project
create`` / ``user create --project --password`` / ``role add``; the new user logs in with
a plain password cloud and boots a server; disabling the user ends their session at once;
the admin deletes them again.
"""

from __future__ import annotations

import pytest

from tests.e2e.cloud import Cloud
from tests.e2e.test_password_cloud import manage, password_cloud

pytestmark = pytest.mark.e2e

ADMIN_CLOUD = "id-admin"
NEW_CLOUD = "id-new"


@pytest.fixture(scope="module")
def admin_cloud(cloud: Cloud) -> str:
    manage(cloud, "project", "create", "ops")
    manage(cloud, "user", "create", "root", "--project", "ops", "--role", "admin",
           "--password", "root-pw")  # fmt: skip
    with cloud.clouds_yaml.open("a", encoding="utf-8") as clouds:
        clouds.write(f"  {ADMIN_CLOUD}:\n")
        clouds.write(password_cloud(cloud.api_url, "root", "root-pw", "ops"))
        clouds.write(f"  {NEW_CLOUD}:\n")
        clouds.write(password_cloud(cloud.api_url, "carol", "carol-pw", "web"))
    return ADMIN_CLOUD


def test_an_admin_makes_a_user_who_boots_a_server(cloud: Cloud, admin_cloud: str) -> None:
    project = cloud.openstack("project", "create", "--description", "web team", "web",
                              cloud=admin_cloud)  # fmt: skip
    assert project["name"] == "web"
    user = cloud.openstack("user", "create", "--project", "web", "--password", "carol-pw",
                           "--email", "carol@example.org", "carol", cloud=admin_cloud)  # fmt: skip
    assert user["default_project_id"] == project["id"]
    cloud.openstack("role", "add", "--project", "web", "--user", "carol", "member",
                    cloud=admin_cloud, as_json=False)  # fmt: skip
    assignments = cloud.openstack("role", "assignment", "list", "--user", "carol", "--names",
                                  cloud=admin_cloud)  # fmt: skip
    assert [(a["Role"], a["Project"]) for a in assignments] == [("member", "web@Default")]

    server = cloud.openstack("server", "create", "--flavor", "m1.tiny", "--image", "cirros",
                             "--wait", "carol-vm", cloud=NEW_CLOUD)  # fmt: skip
    assert server["status"] == "ACTIVE"
    assert server["project_id"] == project["id"]
    shown = cloud.openstack("user", "show", "carol", cloud=NEW_CLOUD)
    assert shown["email"] == "carol@example.org"
    refused = cloud.openstack_raw("project", "create", "mine", cloud=NEW_CLOUD)
    assert refused.returncode != 0
    assert "identity:create_project" in refused.stderr

    cloud.openstack("server", "delete", "--wait", "carol-vm", cloud=NEW_CLOUD, as_json=False)
    cloud.openstack("user", "set", "--disable", "carol", cloud=admin_cloud, as_json=False)
    assert cloud.openstack_raw("server", "list", cloud=NEW_CLOUD).returncode != 0
    cloud.openstack("user", "delete", "carol", cloud=admin_cloud, as_json=False)
    cloud.openstack("project", "delete", "web", cloud=admin_cloud, as_json=False)
    remaining = {p["Name"] for p in cloud.openstack("project", "list", cloud=admin_cloud)}
    assert "web" not in remaining
    assert "carol" not in manage(cloud, "user", "list")
