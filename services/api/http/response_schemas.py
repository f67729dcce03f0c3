"""What keel-api answers, route by route, for the OpenAPI document (and so for fuzzers).

Each schema names the keys every answer at every microversion carries, with their
types; keys a microversion adds are allowed beside them (``additionalProperties`` is
left open), so one schema holds from 2.1 to the latest. Where the status code depends
on the microversion (key pairs: 200 and 202 below 2.2, 201 and 204 from it), every
status is documented with the versions that answer it. Errors are documented once for
all routes (:mod:`services.api.http.openapi`): a Nova fault, or Neutron's error shape
under ``/network``.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
BOOL: Schema = {"type": "boolean"}
NULLABLE_STR: Schema = {"type": ["string", "null"]}
ID: Schema = {"type": ["integer", "string"]}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **(optional or {})},
    }


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


LINKS = array(obj({"rel": STR, "href": STR}, {"type": STR}))
STRINGS = {"type": "object", "additionalProperties": STR}

SERVER_SUMMARY = obj({"id": STR, "name": STR, "links": LINKS})
ADDRESSES = {"type": "object", "additionalProperties": array(obj({"version": INT, "addr": STR}))}
SERVER = obj(
    {
        "id": STR,
        "name": STR,
        "links": LINKS,
        "status": STR,
        "tenant_id": STR,
        "user_id": STR,
        "metadata": STRINGS,
        "hostId": STR,
        "image": {"anyOf": [STR, obj({"id": STR, "links": LINKS})]},
        "flavor": {"type": "object"},
        "created": STR,
        "updated": STR,
        "addresses": ADDRESSES,
        "accessIPv4": STR,
        "accessIPv6": STR,
        "OS-DCF:diskConfig": STR,
    },
    {"progress": INT, "fault": obj({"code": INT, "message": STR})},
)
CREATED_SERVER = obj(
    {"id": STR, "links": LINKS}, {"adminPass": STR, "security_groups": array(obj({"name": STR}))}
)

FLAVOR_SUMMARY = obj({"id": STR, "name": STR, "links": LINKS})
FLAVOR = obj(
    {"id": STR, "name": STR, "links": LINKS, "ram": INT, "vcpus": INT, "disk": INT},
    {"swap": {"type": ["integer", "string"]}, "OS-FLV-EXT-DATA:ephemeral": INT},
)
KEYPAIR = obj(
    {"name": STR, "public_key": STR, "fingerprint": STR},
    {"type": STR, "user_id": STR, "private_key": STR},
)
SERVICE = obj({"id": ID, "binary": STR, "host": STR, "status": STR, "state": STR, "zone": STR})
HYPERVISOR = obj({"id": ID, "hypervisor_hostname": STR, "state": STR, "status": STR})
QUOTA_SET = {"type": "object", "additionalProperties": {"type": ["integer", "string", "object"]}}
VERSION = obj({"id": STR, "status": STR, "links": LINKS}, {"version": STR, "min_version": STR})
IMAGE_SUMMARY = obj({"id": STR, "name": NULLABLE_STR, "links": LINKS})
IMAGE = obj(
    {"id": STR, "name": NULLABLE_STR, "links": LINKS, "minRam": INT, "minDisk": INT,
     "metadata": {"type": "object"}, "status": STR, "progress": INT},
)  # fmt: skip
NETWORK = obj(
    {"id": STR, "name": STR, "status": STR, "shared": BOOL, "router:external": BOOL,
     "subnets": array(STR)},
)  # fmt: skip
SUBNET = obj({"id": STR, "network_id": STR, "cidr": STR, "ip_version": INT})
PORT = obj(
    {"id": STR, "network_id": STR, "mac_address": STR, "device_id": STR,
     "fixed_ips": array(obj({"subnet_id": STR, "ip_address": STR}))},
)  # fmt: skip


def _list(key: str, item: Schema, links: str | None = None) -> Schema:
    return obj({key: array(item)}, {links: LINKS} if links else None)


#: (path, method) → {status: (description, schema or None for no body)}.
#: A host task (a keel extension: ``os-keel-host-tasks``).
HOST_TASK = obj(
    {
        "id": STR,
        "number": INT,
        "kind": STR,
        "host": STR,
        "status": STR,
        "parallel": INT,
        "counts": {"type": "object", "additionalProperties": INT},
        "total": INT,
    }
)
DRAIN_STARTED = obj({"task": STR, "number": INT, "host": STR, "new": BOOL})

RESPONSES: dict[tuple[str, str], dict[str, tuple[str, Schema | None]]] = {
    ("/", "get"): {"200": ("The API versions", _list("versions", VERSION))},
    ("/v2.1", "get"): {"200": ("The compute API version", obj({"version": VERSION}))},
    ("/v2.1/servers", "get"): {
        "200": ("A page of servers", _list("servers", SERVER_SUMMARY, "servers_links"))
    },
    ("/v2.1/servers/detail", "get"): {
        "200": ("A page of servers", _list("servers", SERVER, "servers_links"))
    },
    ("/v2.1/servers", "post"): {
        "202": (
            "The (first) new server; with return_reservation_id, its reservation",
            {"anyOf": [obj({"server": CREATED_SERVER}), obj({"reservation_id": STR})]},
        )
    },
    ("/v2.1/servers/{server_id}", "get"): {"200": ("The server", obj({"server": SERVER}))},
    ("/v2.1/servers/{server_id}", "put"): {
        "200": ("The server, in Nova's update view", obj({"server": SERVER}))
    },
    ("/v2.1/servers/{server_id}/ips", "get"): {
        "200": ("Its addresses by network", obj({"addresses": ADDRESSES}))
    },
    ("/v2.1/servers/{server_id}/ips/{network}", "get"): {
        "200": ("Its addresses on one network", ADDRESSES)
    },
    ("/v2.1/flavors", "get"): {
        "200": ("A page of flavors", _list("flavors", FLAVOR_SUMMARY, "flavors_links"))
    },
    ("/v2.1/flavors/detail", "get"): {
        "200": ("A page of flavors", _list("flavors", FLAVOR, "flavors_links"))
    },
    ("/v2.1/flavors", "post"): {"200": ("The new flavor", obj({"flavor": FLAVOR}))},
    ("/v2.1/flavors/{flavor_id}", "get"): {"200": ("The flavor", obj({"flavor": FLAVOR}))},
    ("/v2.1/flavors/{flavor_id}", "put"): {"200": ("The flavor", obj({"flavor": FLAVOR}))},
    ("/v2.1/flavors/{flavor_id}/os-extra_specs", "get"): {
        "200": ("Its extra specs", obj({"extra_specs": STRINGS}))
    },
    ("/v2.1/flavors/{flavor_id}/os-extra_specs", "post"): {
        "200": ("The extra specs set", obj({"extra_specs": STRINGS}))
    },
    ("/v2.1/flavors/{flavor_id}/os-extra_specs/{key}", "get"): {"200": ("One spec", STRINGS)},
    ("/v2.1/flavors/{flavor_id}/os-extra_specs/{key}", "put"): {"200": ("One spec", STRINGS)},
    ("/v2.1/flavors/{flavor_id}/os-extra_specs/{key}", "delete"): {"200": ("Deleted", None)},
    ("/v2.1/os-keypairs", "get"): {
        "200": ("The key pairs", _list("keypairs", obj({"keypair": KEYPAIR}), "keypairs_links"))
    },
    ("/v2.1/os-keypairs", "post"): {
        "200": ("The new key pair (below 2.2)", obj({"keypair": KEYPAIR})),
        "201": ("The new key pair (from 2.2)", obj({"keypair": KEYPAIR})),
    },
    ("/v2.1/os-keypairs/{name}", "get"): {"200": ("The key pair", obj({"keypair": KEYPAIR}))},
    ("/v2.1/os-keypairs/{name}", "delete"): {
        "202": ("Deleted (below 2.2)", None),
        "204": ("Deleted (from 2.2)", None),
    },
    ("/v2.1/os-services", "get"): {"200": ("The services", _list("services", SERVICE))},
    ("/v2.1/os-hypervisors", "get"): {
        "200": ("The hypervisors", _list("hypervisors", HYPERVISOR, "hypervisors_links"))
    },
    ("/v2.1/os-hypervisors/detail", "get"): {
        "200": ("The hypervisors", _list("hypervisors", HYPERVISOR, "hypervisors_links"))
    },
    ("/v2.1/os-hypervisors/{hypervisor}", "get"): {
        "200": ("The hypervisor", obj({"hypervisor": HYPERVISOR}))
    },
    ("/v2.1/os-hypervisors/{hypervisor}/uptime", "get"): {
        "200": (
            "Its host's uptime",
            obj({"hypervisor": obj({"id": ID, "hypervisor_hostname": STR, "uptime": STR})}),
        )
    },
    ("/v2.1/os-quota-sets/{project_id}", "get"): {
        "200": ("The limits", obj({"quota_set": QUOTA_SET}))
    },
    ("/v2.1/os-quota-sets/{project_id}", "put"): {
        "200": ("The limits now", obj({"quota_set": QUOTA_SET}))
    },
    ("/v2.1/os-quota-sets/{project_id}/defaults", "get"): {
        "200": ("The default limits", obj({"quota_set": QUOTA_SET}))
    },
    ("/v2.1/os-quota-sets/{project_id}/detail", "get"): {
        "200": ("The limits and their use", obj({"quota_set": QUOTA_SET}))
    },
    ("/v2.1/limits", "get"): {
        "200": (
            "The caller's limits",
            obj({"limits": obj({"absolute": {"type": "object"}, "rate": array({})})}),
        )
    },
    ("/v2.1/images", "get"): {
        "200": ("Images (below 2.36)", _list("images", IMAGE_SUMMARY, "images_links"))
    },
    ("/v2.1/images/detail", "get"): {
        "200": ("Images (below 2.36)", _list("images", IMAGE, "images_links"))
    },
    ("/v2.1/images/{image_id}", "get"): {"200": ("The image (below 2.36)", obj({"image": IMAGE}))},
    ("/network/v2.0/networks", "get"): {"200": ("The networks", _list("networks", NETWORK))},
    ("/network/v2.0/networks/{network_id}", "get"): {
        "200": ("The network", obj({"network": NETWORK}))
    },
    ("/network/v2.0/subnets", "get"): {"200": ("The subnets", _list("subnets", SUBNET))},
    ("/network/v2.0/subnets/{subnet_id}", "get"): {"200": ("The subnet", obj({"subnet": SUBNET}))},
    ("/network/v2.0/ports", "get"): {"200": ("The ports", _list("ports", PORT))},
    ("/network/v2.0/ports/{port_id}", "get"): {"200": ("The port", obj({"port": PORT}))},
    ("/network/v2.0/floatingips", "get"): {
        "200": ("No floating IPs", obj({"floatingips": array({})}))
    },
    ("/v2.1/os-keel-host-tasks", "post"): {
        "200": ("The host task already running there, resumed", obj({"host_task": HOST_TASK})),
        "202": ("The new host task", obj({"host_task": HOST_TASK})),
    },
    ("/ops/api/hosts/{service_uuid}/drain", "post"): {
        "200": ("The drain already running on the host", DRAIN_STARTED),
        "202": ("The new drain", DRAIN_STARTED),
    },
}

#: Request bodies the handlers read themselves, so FastAPI cannot describe them.
REQUEST_BODIES: dict[tuple[str, str], Schema] = {
    ("/v2.1/os-keel-host-tasks", "post"): obj(
        {
            "host_task": obj(
                {"kind": {"type": "string", "enum": ["drain", "evacuate"]}, "host": STR},
                {
                    "parallel": INT,
                    "cold_fallback": BOOL,
                    "deadline": {"type": "number"},
                },
            )
        }
    ),
    ("/ops/api/hosts/{service_uuid}/drain", "post"): obj(
        {}, {"parallel": INT, "cold_fallback": BOOL, "deadline": {"type": "number"}}
    ),
    ("/v2.1/os-quota-sets/{project_id}", "put"): obj(
        {
            "quota_set": {
                "type": "object",
                "properties": {"force": {"type": ["boolean", "string"]}},
                "additionalProperties": {"type": ["integer", "string"]},
            }
        }
    ),
    ("/v2.1/servers/{server_id}/action", "post"): {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "description": "One action, named by the only key: os-stop, os-start, reboot, pause, "
        "unpause, suspend, resume, migrate, evacuate, confirmResize, revertResize, "
        "os-getConsoleOutput",
    },
}
