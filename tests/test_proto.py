"""Our kubelet protos against kubelet's field tables: the device-plugin API v1beta1
(docs/kubelet-deviceplugin.md 1.2-1.3) and the PodResources API v1 (kubernetes
staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.deviceplugin.api.podresources import api_pb2 as podresources_pb2

ROOT = Path(__file__).resolve().parent.parent
STR, BOOL, I32, I64, U64, MSG = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_MESSAGE,
)
ONE, MANY = "one", "many"

# message -> [(field name, number, type, cardinality, message type or None)]
FIELD_TABLE: dict[str, list[tuple[str, int, int, str, str | None]]] = {
    "DevicePluginOptions": [
        ("pre_start_required", 1, BOOL, ONE, None),
        ("get_preferred_allocation_available", 2, BOOL, ONE, None),
    ],
    "RegisterRequest": [
        ("version", 1, STR, ONE, None),
        ("endpoint", 2, STR, ONE, None),
        ("resource_name", 3, STR, ONE, None),
        ("options", 4, MSG, ONE, "DevicePluginOptions"),
    ],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, MSG, MANY, "Device")],
    "TopologyInfo": [("nodes", 1, MSG, MANY, "NUMANode")],
    "NUMANode": [("ID", 1, I64, ONE, None)],
    "Device": [
        ("ID", 1, STR, ONE, None),
        ("health", 2, STR, ONE, None),
        ("topology", 3, MSG, ONE, "TopologyInfo"),
    ],
    "PreStartContainerRequest": [("devices_ids", 1, STR, MANY, None)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [
        ("container_requests", 1, MSG, MANY, "ContainerPreferredAllocationRequest")
    ],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, STR, MANY, None),
        ("must_include_deviceIDs", 2, STR, MANY, None),
        ("allocation_size", 3, I32, ONE, None),
    ],
    "PreferredAllocationResponse": [
        ("container_responses", 1, MSG, MANY, "ContainerPreferredAllocationResponse")
    ],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, STR, MANY, None)],
    "AllocateRequest": [("container_requests", 1, MSG, MANY, "ContainerAllocateRequest")],
    "ContainerAllocateRequest": [("devices_ids", 1, STR, MANY, None)],
    "CDIDevice": [("name", 1, STR, ONE, None)],
    "AllocateResponse": [("container_responses", 1, MSG, MANY, "ContainerAllocateResponse")],
    "ContainerAllocateResponse": [
        ("envs", 1, MSG, MANY, "ContainerAllocateResponse.EnvsEntry"),
        ("mounts", 2, MSG, MANY, "Mount"),
        ("devices", 3, MSG, MANY, "DeviceSpec"),
        ("annotations", 4, MSG, MANY, "ContainerAllocateResponse.AnnotationsEntry"),
        ("cdi_devices", 5, MSG, MANY, "CDIDevice"),
    ],
    "Mount": [
        ("container_path", 1, STR, ONE, None),
        ("host_path", 2, STR, ONE, None),
        ("read_only", 3, BOOL, ONE, None),
    ],
    "DeviceSpec": [
        ("container_path", 1, STR, ONE, None),
        ("host_path", 2, STR, ONE, None),
        ("permissions", 3, STR, ONE, None),
    ],
}

# service -> [(method, input, output, server streaming)]
SERVICES = {
    "Registration": [("Register", "RegisterRequest", "Empty", False)],
    "DevicePlugin": [
        ("GetDevicePluginOptions", "Empty", "DevicePluginOptions", False),
        ("ListAndWatch", "Empty", "ListAndWatchResponse", True),
        (
            "GetPreferredAllocation",
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
            False,
        ),
        ("Allocate", "AllocateRequest", "AllocateResponse", False),
        ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", False),
    ],
}


# kubelet's PodResources v1 (package v1): message -> fields, as FIELD_TABLE
PODRESOURCES_FIELD_TABLE: dict[str, list[tuple[str, int, int, str, str | None]]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        ("devices", 1, MSG, MANY, "ContainerDevices"),
        ("cpu_ids", 2, I64, MANY, None),
        ("memory", 3, MSG, MANY, "ContainerMemory"),
    ],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, MSG, MANY, "PodResources")],
    "PodResources": [
        ("name", 1, STR, ONE, None),
        ("namespace", 2, STR, ONE, None),
        ("containers", 3, MSG, MANY, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, STR, ONE, None),
        ("devices", 2, MSG, MANY, "ContainerDevices"),
        ("cpu_ids", 3, I64, MANY, None),
        ("memory", 4, MSG, MANY, "ContainerMemory"),
        ("dynamic_resources", 5, MSG, MANY, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, STR, ONE, None),
        ("size", 2, U64, ONE, None),
        ("topology", 3, MSG, ONE, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, STR, ONE, None),
        ("device_ids", 2, STR, MANY, None),
        ("topology", 3, MSG, ONE, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, MSG, MANY, "NUMANode")],
    "NUMANode": [("ID", 1, I64, ONE, None)],
    "DynamicResource": [  # class_name = 1 was removed in Kubernetes 1.31
        ("claim_name", 2, STR, ONE, None),
        ("claim_namespace", 3, STR, ONE, None),
        ("claim_resources", 4, MSG, MANY, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, MSG, MANY, "CDIDevice"),
        ("driver_name", 2, STR, ONE, None),
        ("pool_name", 3, STR, ONE, None),
        ("device_name", 4, STR, ONE, None),
    ],
    "CDIDevice": [("name", 1, STR, ONE, None)],
    "GetPodResourcesRequest": [
        ("pod_name", 1, STR, ONE, None),
        ("pod_namespace", 2, STR, ONE, None),
    ],
    "GetPodResourcesResponse": [("pod_resources", 1, MSG, ONE, "PodResources")],
}

PODRESOURCES_SERVICES = {
    "PodResourcesLister": [
        ("List", "ListPodResourcesRequest", "ListPodResourcesResponse", False),
        (
            "GetAllocatableResources",
            "AllocatableResourcesRequest",
            "AllocatableResourcesResponse",
            False,
        ),
        ("Get", "GetPodResourcesRequest", "GetPodResourcesResponse", False),
    ],
}


def fields_of(descriptor: Any, package: str) -> list[tuple[str, int, int, str, str | None]]:
    """A message descriptor's fields as the tables write them."""
    actual = []
    for field in descriptor.fields:
        message_type = None
        if field.message_type is not None:
            message_type = field.message_type.full_name.removeprefix(f"{package}.")
        actual.append(
            (field.name, field.number, field.type, MANY if field.is_repeated else ONE, message_type)
        )
    return actual


def methods_of(descriptor: Any) -> list[tuple[str, str, str, bool]]:
    return [
        (method.name, method.input_type.name, method.output_type.name, method.server_streaming)
        for method in descriptor.methods
    ]


def test_package_is_v1beta1() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert set(api_pb2.DESCRIPTOR.message_types_by_name) == set(FIELD_TABLE)


@pytest.mark.parametrize("message", sorted(FIELD_TABLE))
def test_message_fields_match_kubelet(message: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert fields_of(descriptor, "v1beta1") == FIELD_TABLE[message]


def test_map_fields_are_string_to_string() -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"]
    for name in ("envs", "annotations"):
        entry = descriptor.fields_by_name[name].message_type
        assert entry is not None
        assert entry.GetOptions().map_entry
        assert [(f.name, f.type) for f in entry.fields] == [("key", STR), ("value", STR)]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_services_and_streaming(service: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"v1beta1.{service}"
    assert methods_of(descriptor) == SERVICES[service]
    assert not any(method.client_streaming for method in descriptor.methods)


def test_podresources_package_is_v1_under_its_own_file_name() -> None:
    # Both protos are files named api.proto: one descriptor pool holds them only under
    # different names (proto/generate.py compiles this one as podresources/v1/api.proto).
    assert podresources_pb2.DESCRIPTOR.package == "v1"
    assert podresources_pb2.DESCRIPTOR.name == "podresources/v1/api.proto"
    assert api_pb2.DESCRIPTOR.name != podresources_pb2.DESCRIPTOR.name
    assert set(podresources_pb2.DESCRIPTOR.message_types_by_name) == set(PODRESOURCES_FIELD_TABLE)


@pytest.mark.parametrize("message", sorted(PODRESOURCES_FIELD_TABLE))
def test_podresources_message_fields_match_kubelet(message: str) -> None:
    descriptor = podresources_pb2.DESCRIPTOR.message_types_by_name[message]
    assert fields_of(descriptor, "v1") == PODRESOURCES_FIELD_TABLE[message]


def test_podresources_keeps_the_removed_class_name_number_reserved() -> None:
    descriptor = podresources_pb2.DESCRIPTOR.message_types_by_name["DynamicResource"]
    assert "class_name" not in descriptor.fields_by_name
    assert 1 not in descriptor.fields_by_number


def test_podresources_service_paths_are_kubelets() -> None:
    descriptor = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert descriptor.full_name == "v1.PodResourcesLister"
    assert methods_of(descriptor) == PODRESOURCES_SERVICES["PodResourcesLister"]
    assert not any(method.client_streaming for method in descriptor.methods)


def test_committed_stubs_match_regeneration(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    generator.generate(tmp_path)
    committed = ROOT / "hami_plugin" / "deviceplugin" / "api"
    for package in (".", "podresources"):
        for name in ("__init__.py", "api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
            path = Path(package) / name
            assert (tmp_path / path).read_text() == (committed / path).read_text(), (
                f"{path} is stale: run `make proto`"
            )
