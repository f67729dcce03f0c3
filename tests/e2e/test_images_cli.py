"""Image updates with the real openstack CLI: ``image set`` (name, properties,
``--protected`` / ``--unprotected``) and ``image unset --property`` send the Image API's
JSON patch; ``image delete`` of a protected image fails and changes nothing, and
succeeds once the image is unprotected. No servers: a cloud without compute hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cloud import Cloud, CloudConfig

pytestmark = pytest.mark.e2e

MEMBER = "keel-member"


@pytest.fixture(scope="module")
def cloud_config() -> CloudConfig:
    return CloudConfig(computes=())


def test_image_set_and_unset_and_a_protected_image_that_delete_refuses(
    cloud: Cloud, tmp_path: Path
) -> None:
    data = tmp_path / "disk.raw"
    data.write_bytes(b"\0" * 4096)
    created = cloud.openstack(
        "image", "create", "--disk-format", "raw", "--container-format", "bare",
        "--file", str(data), "--private", "--property", "hw_disk_bus=scsi", "cli-image",
        cloud=MEMBER,
    )  # fmt: skip
    image_id = created["id"]

    cloud.openstack(
        "image", "set", "--name", "cli-renamed", "--property", "os_distro=cirros",
        "--min-ram", "64", "--tag", "e2e", "--protected", image_id,
        cloud=MEMBER, as_json=False,
    )  # fmt: skip
    cloud.openstack("image", "unset", "--property", "hw_disk_bus", image_id, cloud=MEMBER,
                    as_json=False)  # fmt: skip
    shown = cloud.openstack("image", "show", image_id, cloud=MEMBER)

    assert shown["name"] == "cli-renamed"
    assert shown["protected"] is True
    assert shown["min_ram"] == 64
    assert "e2e" in shown["tags"]
    assert shown["properties"]["os_distro"] == "cirros"
    assert "hw_disk_bus" not in shown["properties"]
    assert (shown["status"], shown["size"]) == ("active", 4096)

    refused = cloud.openstack_raw("image", "delete", image_id, cloud=MEMBER, as_json=False)
    admin_refused = cloud.openstack_raw("image", "delete", image_id, as_json=False)
    for answer in (refused, admin_refused):
        assert answer.returncode != 0, answer.stdout
        assert f"Image {image_id} is protected and cannot be deleted." in answer.stderr
    assert cloud.openstack("image", "show", image_id, cloud=MEMBER)["protected"] is True

    cloud.openstack("image", "set", "--unprotected", image_id, cloud=MEMBER, as_json=False)
    cloud.openstack("image", "delete", image_id, cloud=MEMBER, as_json=False)
    listed = cloud.openstack("image", "list", cloud=MEMBER)
    assert image_id not in {image["ID"] for image in listed}
