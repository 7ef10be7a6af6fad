"""The annotation codec against every example of docs/hami-reference.md 1.4-1.7, plus properties."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol import codec
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.govalues import format_go_duration, parse_go_duration
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ContainerDevice,
    GpuDevice,
    GpuPolicyName,
    HandshakeState,
    MigPlacement,
    MigProfile,
    NodePolicy,
    ScoringWeights,
)

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def dev(uuid: str, mem: int, cores: int, type_: str = "NVIDIA") -> ContainerDevice:
    return ContainerDevice(uuid, type_, mem, cores)


# --- 1.4.3 pod device lists ----------------------------------------------------------------

POD_EXAMPLES = [
    (f"{UUID_A},NVIDIA,3000,30:;", ((dev(UUID_A, 3000, 30),), ())),
    (
        f"{UUID_A},NVIDIA,3000,0:;{UUID_A},NVIDIA,5000,0:;",
        ((dev(UUID_A, 3000, 0),), (dev(UUID_A, 5000, 0),), ()),
    ),
    (
        "GPU-aaa,NVIDIA,4096,50:GPU-bbb,NVIDIA,4096,50:;",
        ((dev("GPU-aaa", 4096, 50), dev("GPU-bbb", 4096, 50)), ()),
    ),
    (";GPU-aaa,NVIDIA,1000,30:;", ((), (dev("GPU-aaa", 1000, 30),), ())),
    (";;", ((), (), ())),
    (";;;", ((), (), (), ())),
    (
        "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76,NVIDIA,500,3:;"
        "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,NVIDIA,500,3:;",
        (
            (dev("GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76", 500, 3),),
            (dev("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", 500, 3),),
            (),
        ),
    ),
]


@pytest.mark.parametrize(("value", "decoded"), POD_EXAMPLES)
def test_pod_examples_decode(value: str, decoded: object) -> None:
    assert codec.decode_pod_devices(value) == decoded


@pytest.mark.parametrize(("value", "decoded"), POD_EXAMPLES)
def test_pod_examples_encode(value: str, decoded: tuple[tuple[ContainerDevice, ...], ...]) -> None:
    # The writer produced the value without the trailing entry decode adds back.
    assert codec.encode_pod_devices(decoded[:-1]) == value
    # HAMi's own decode -> re-encode appends one ';' (e.g. "A:;" -> "A:;;").
    assert codec.encode_pod_devices(decoded) == value + ";"


def test_allocated_example_after_device_plugin() -> None:
    # Example 5: the device plugin erases every entry of example 1 and re-encodes.
    decoded = codec.decode_pod_devices(f"{UUID_A},NVIDIA,3000,30:;")
    assert codec.encode_pod_devices(tuple(() for _ in decoded)) == ";;"


def test_missing_fields_is_an_error_naming_key_and_piece() -> None:
    with pytest.raises(AnnotationError) as caught:
        codec.decode_pod_devices("uuid,type,100:;", ANNOTATION_DEVICES_ALLOCATED)
    message = str(caught.value)
    assert message.startswith(ANNOTATION_DEVICES_ALLOCATED + ": ")
    assert (
        "pod annotation format error, missing fields, do not use nodeName in task spec" in message
    )
    assert '"uuid,type,100"' in message
    assert caught.value.key == ANNOTATION_DEVICES_ALLOCATED


@pytest.mark.parametrize(
    "value",
    [
        "GPU-a,NVIDIA,1x,3:;",
        "GPU-a,NVIDIA,2147483648,3:;",
        "GPU-a,NVIDIA,10,-2147483649:;",
        "GPU-a,NVIDIA, 10,3:;",
        "GPU-a,NVIDIA,1_0,3:;",
        "GPU-a,NVIDIA,,3:;",
    ],
)
def test_bad_numbers_are_errors(value: str) -> None:
    with pytest.raises(AnnotationError):
        codec.decode_pod_devices(value)


def test_go_int_accepts_sign_and_leading_zeros_and_int32_edges() -> None:
    decoded = codec.decode_container_devices("G,NVIDIA,+007,-2147483648:G,NVIDIA,2147483647,0:")
    assert decoded == (dev("G", 7, -(2**31)), dev("G", 2**31 - 1, 0))


def test_extra_fields_ignored_and_commaless_pieces_skipped() -> None:
    assert codec.decode_container_devices("G,NVIDIA,1,2,extra,more:junk::") == (dev("G", 1, 2),)


def test_encoder_refuses_separators_in_fields() -> None:
    with pytest.raises(AnnotationError):
        codec.encode_pod_devices(((dev("GPU:x", 1, 1),),))
    with pytest.raises(AnnotationError):
        codec.encode_pod_devices(((dev("GPU-x", 1, 1, type_="NV;IDIA"),),))


def test_oversized_value_is_rejected_quickly() -> None:
    with pytest.raises(AnnotationError, match="exceeds the 262144-byte limit"):
        codec.decode_pod_devices("G,NVIDIA,1,1:" * 100_000)
    with pytest.raises(AnnotationError, match="byte limit"):
        codec.decode_node_devices("[" * (1 << 20))


def test_many_separators_within_limit_are_handled() -> None:
    assert len(codec.decode_pod_devices(";" * 200_000)) == 200_001
    assert codec.decode_container_devices(":" * 200_000) == ()


# --- properties -------------------------------------------------------------------------------

# utf-8: no lone surrogates, which no annotation (a JSON string) can carry
field_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters=",:;"), max_size=12)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
devices = st.builds(ContainerDevice, field_text, field_text, int32, int32)
pods = st.lists(st.lists(devices, max_size=4).map(tuple), max_size=5).map(tuple)


@given(pods)
def test_decode_encode_restores_pod_plus_trailing_entry(
    pod: tuple[tuple[ContainerDevice, ...]],
) -> None:
    encoded = codec.encode_pod_devices(pod)
    assert codec.decode_pod_devices(encoded) == (*pod, ())


@given(pods)
def test_encode_decode_of_hami_written_strings(pod: tuple[tuple[ContainerDevice, ...]]) -> None:
    written = codec.encode_pod_devices(pod)  # a string HAMi itself would write
    decoded = codec.decode_pod_devices(written)
    assert codec.encode_pod_devices(decoded[:-1]) == written
    assert codec.encode_pod_devices(decoded) == written + ";"


@given(st.lists(devices, max_size=6).map(tuple))
def test_container_round_trip_is_exact(container: tuple[ContainerDevice, ...]) -> None:
    written = codec.encode_container_devices(container)
    assert codec.decode_container_devices(written) == container
    assert codec.encode_container_devices(codec.decode_container_devices(written)) == written


hostile = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=",:;0123456789-+GPUNVIDIA[]{}\"' \\tx", max_size=300),
    st.binary(max_size=200).map(lambda raw: raw.decode("latin-1")),
)


@given(hostile)
def test_hostile_strings_raise_only_annotation_error(value: str) -> None:
    decoders = (
        codec.decode_pod_devices,
        codec.decode_container_devices,
        codec.decode_node_devices,
        codec.parse_handshake,
        codec.parse_gpu_policy,
        codec.parse_node_policy,
        codec.parse_scoring_weights,
        codec.parse_device_cordon,
    )
    for decode in decoders:
        with contextlib.suppress(AnnotationError):
            decode(value)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["id", "ID", "count", "health", "numa", "migProfiles", "placements", "x"]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_hostile_json_raises_only_annotation_error(data: object) -> None:
    import json

    with contextlib.suppress(AnnotationError):
        codec.decode_node_devices(
            json.dumps(data) if isinstance(data, list) else f"[{json.dumps(data)}]"
        )


def test_deeply_nested_json_is_an_annotation_error() -> None:
    with pytest.raises(AnnotationError):
        codec.decode_node_devices("[" * 100_000 + "]" * 100_000)


# --- 1.5 node register annotation -------------------------------------------------------------

V100_JSON = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,'
    '"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)
V100_DEVICES = (
    GpuDevice(
        "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec",
        0,
        10,
        32768,
        100,
        "NVIDIA-Tesla V100-PCIE-32GB",
        0,
        "hami-core",
        True,
    ),
    GpuDevice(UUID_A, 1, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB", 1, "hami-core", True),
)
A100_JSON = (
    '[{"id":"GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76","count":10,"devmem":81920,"devcore":100,'
    '"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core"}]'
)
A100_DEVICES = (
    GpuDevice(
        "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76",
        0,
        10,
        81920,
        100,
        "NVIDIA A100-SXM4-80GB",
        0,
        "hami-core",
        False,
    ),
)


@pytest.mark.parametrize(
    ("value", "decoded"), [(V100_JSON, V100_DEVICES), (A100_JSON, A100_DEVICES)]
)
def test_register_json_examples_both_directions(value: str, decoded: tuple[GpuDevice, ...]) -> None:
    assert codec.decode_node_devices(value) == decoded
    assert codec.encode_node_devices(decoded) == value


def test_register_v28_devicepairscore_and_key_order_and_case() -> None:
    v28 = (
        '[{"id":"GPU-x","count":10,"devmem":24564,"devcore":100,"type":"NVIDIA GeForce RTX 4090",'
        '"mode":"hami-core","health":true,"devicepairscore":{}}]'
    )
    assert codec.decode_node_devices(v28) == (
        GpuDevice("GPU-x", 0, 10, 24564, 100, "NVIDIA GeForce RTX 4090", 0, "hami-core", True),
    )
    fixture = (
        '[{"id":"GPU-0","count":5,"devmem":8192,"devcore":100,"type":"NVIDIA-Tesla P4",'
        '"numa":0,"health":true,"index":0}]'
    )
    assert codec.decode_node_devices(fixture) == (
        GpuDevice("GPU-0", 0, 5, 8192, 100, "NVIDIA-Tesla P4", 0, "", True),
    )
    # Go matches keys case-insensitively; missing mode stays empty (not hami-core).
    assert codec.decode_node_devices('[{"ID":"G","Count":2,"HEALTH":true}]') == (
        GpuDevice("G", 0, 2, 0, 0, "", 0, "", True),
    )


def test_register_mig_profiles_round_trip() -> None:
    device = GpuDevice(
        "GPU-m",
        2,
        7,
        81920,
        100,
        "NVIDIA A100-SXM4-80GB",
        0,
        "mig",
        True,
        (MigProfile("1g.5gb", 4864, 15, 1, (MigPlacement(6, 1),)),),
    )
    text = codec.encode_node_devices([device])
    assert (
        '"migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,'
        '"placements":[{"start":6,"size":1}]}],"health":true}' in text
    )
    assert codec.decode_node_devices(text) == (device,)


def test_register_json_escapes_like_go() -> None:
    device = GpuDevice("G<&>", 0, 1, 1, 1, "NVIDIA é", 0, "hami-core", True)
    text = codec.encode_node_devices([device])
    assert '"id":"G\\u003c\\u0026\\u003e"' in text
    assert '"type":"NVIDIA é"' in text
    assert codec.decode_node_devices(text) == (device,)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[]", "no gpu found on node"),
        ("null", "node annotation missing device separator"),
        ('[{"id":"G","count":"10"}]', "cannot unmarshal"),
        ('[{"id":"G","count":1.5}]', "cannot unmarshal"),
        ('[{"id":"G","index":-1}]', "out of range"),
        ('[{"id":"G","health":"true"}]', "cannot unmarshal"),
        ('[{"id":"G"', "invalid JSON"),
        ("[1]", "a device must be a JSON object"),
    ],
)
def test_register_json_errors(value: str, message: str) -> None:
    with pytest.raises(AnnotationError, match=message):
        codec.decode_node_devices(value)


P4 = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


def test_register_comma_seven_and_nine_fields() -> None:
    seven = f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true:"
    nine = f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:"
    expected7 = GpuDevice(P4, 0, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", True)
    expected9 = GpuDevice(P4, 1, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", True)
    assert codec.decode_node_devices(seven) == (expected7,)
    assert codec.decode_node_devices(nine) == (expected9,)
    assert codec.encode_node_devices_legacy([expected7], fields=7) == seven
    assert codec.encode_node_devices_legacy([expected9]) == nine


def test_register_comma_two_devices_protocol_doc() -> None:
    value = (
        "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        f"{UUID_A},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    )
    decoded = codec.decode_node_devices(value)
    assert [device.uuid for device in decoded] == [V100_DEVICES[0].uuid, UUID_A]
    assert all(device.index == 0 and device.mode == "hami-core" for device in decoded)
    assert codec.encode_node_devices_legacy(decoded, fields=7) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("GPU-a,10,7680,100,P4,0,true", "node annotation missing device separator"),
        ("GPU-a:", 'malformed node annotation segment: "GPU-a"'),
        ("GPU-a,10,7680:", "unexpected field count 3 in node annotation"),
        ("GPU-a,10,7680,100,P4,0,true,1:", "unexpected field count 8 in node annotation"),
    ],
)
def test_register_comma_errors(value: str, message: str) -> None:
    with pytest.raises(AnnotationError, match=message):
        codec.decode_node_devices(value)


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (
            "GPU-a,ten,7680,100,P4,0,true:",
            'invalid count field: strconv.ParseInt: parsing "ten": invalid syntax',
        ),
        (
            "GPU-a,2147483648,7680,100,P4,0,true:",
            'invalid count field: strconv.ParseInt: parsing "2147483648": value out of range',
        ),
        (
            "GPU-a,10,7.5G,100,P4,0,true:",
            'invalid memory field: strconv.ParseInt: parsing "7.5G": invalid syntax',
        ),
        (
            "GPU-a,10,7680,,P4,0,true:",
            'invalid core field: strconv.ParseInt: parsing "": invalid syntax',
        ),
        (
            "GPU-a,10,7680,100,P4,0,maybe:",
            'invalid health field: strconv.ParseBool: parsing "maybe": invalid syntax',
        ),
        (
            "GPU-a,10,7680,100,P4,one,true:",
            'invalid numa field: strconv.Atoi: parsing "one": invalid syntax',
        ),
        (
            "GPU-a,10,7680,100,P4,0,true,first,hami-core:",
            'invalid index field: strconv.Atoi: parsing "first": invalid syntax',
        ),
        (
            "GPU-a,10,7680,100,P4,0,true,-1,hami-core:",
            "index field must not be negative: -1",
        ),
    ],
)
def test_register_comma_field_errors_carry_hamis_prefix(value: str, detail: str) -> None:
    """HAMi v2.10 `pkg/device/devices.go` DecodeNodeDevices (lines 332-361) wraps Go's
    strconv error after a fixed prefix; the segment is named after it."""
    with pytest.raises(AnnotationError) as raised:
        codec.decode_node_devices(f"GPU-ok,10,7680,100,P4,0,true:{value}")
    segment = value.rstrip(":")
    assert raised.value.detail == f'{detail} in segment "{segment}"'
    assert raised.value.key == "hami.io/node-nvidia-register"


def test_register_comma_fields_are_checked_in_hamis_order() -> None:
    """count, memory, core, health (field 6) before numa (field 5), index, index sign."""
    fields = ["GPU-a", "ten", "lots", "all", "P4", "near", "maybe", "first", "hami-core"]
    repairs = [(1, "10"), (2, "7680"), (3, "100"), (6, "true"), (5, "0"), (7, "-1")]
    seen = []
    for position, repair in repairs:
        with pytest.raises(AnnotationError) as raised:
            codec.decode_node_devices(",".join(fields) + ":")
        seen.append(raised.value.detail.split(":")[0])
        fields[position] = repair
    with pytest.raises(AnnotationError) as raised:
        codec.decode_node_devices(",".join(fields) + ":")
    seen.append(raised.value.detail.split(":")[0])
    assert seen == [
        "invalid count field",
        "invalid memory field",
        "invalid core field",
        "invalid health field",
        "invalid numa field",
        "invalid index field",
        "index field must not be negative",
    ]


@pytest.mark.parametrize("value", [":", "::"])
def test_register_comma_empty_lists(value: str) -> None:
    assert codec.decode_node_devices(value) == ()


gpu_devices = st.builds(
    GpuDevice,
    uuid=st.text(max_size=10),
    index=st.integers(0, 2**32),
    split_count=int32,
    memory_mib=int32,
    cores_percent=int32,
    type=st.text(max_size=10),
    numa_node=st.integers(-(2**40), 2**40),
    mode=st.text(max_size=6),
    healthy=st.booleans(),
)


@given(st.lists(gpu_devices, min_size=1, max_size=4))
def test_register_json_round_trip(devices_: list[GpuDevice]) -> None:
    text = codec.encode_node_devices(devices_)
    assert codec.decode_node_devices(text) == tuple(devices_)
    assert codec.encode_node_devices(codec.decode_node_devices(text)) == text


# --- 1.6 handshake -------------------------------------------------------------------------


def test_handshake_values() -> None:
    requesting = codec.parse_handshake("Requesting_2024-01-23 04:30:04")
    assert requesting.state is HandshakeState.REQUESTING
    assert requesting.time == datetime(2024, 1, 23, 4, 30, 4)
    assert codec.format_handshake_requesting(datetime(2024, 1, 23, 4, 30, 4)) == (
        "Requesting_2024-01-23 04:30:04"
    )
    old_layout = codec.parse_handshake("Requesting_2024.01.23 04:30:04")
    assert old_layout.time == datetime(2024, 1, 23, 4, 30, 4)
    assert codec.parse_handshake("Requesting").time is None
    reported = codec.parse_handshake(
        "Reported 2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.777756895"
    )
    assert reported.state is HandshakeState.REPORTED
    assert reported.time == datetime(2024, 1, 23, 4, 30, 4)
    assert codec.parse_handshake("Deleted_2024-01-23 04:30:04").state is HandshakeState.DELETED
    assert codec.parse_handshake("garbage").state is HandshakeState.UNKNOWN


# --- pod-level user annotations ---------------------------------------------------------------


def test_pod_gpu_options_parsed() -> None:
    options = codec.parse_pod_gpu_options(
        {
            "nvidia.com/use-gputype": "A100, V100,,",
            "nvidia.com/nouse-gputype": "T4",
            "nvidia.com/use-gpuuuid": " GPU-a , GPU-b,",
            "nvidia.com/nouse-gpuuuid": "GPU-c",
            "nvidia.com/numa-bind": "True",
            "nvidia.com/vgpu-mode": "hami-core",
            "hami.io/gpu-scheduler-policy": "numa,binpack",
            "hami.io/node-scheduler-policy": "spread",
            "hami.io/device-scoring-weights": "memory=2, slot=0,core=1",
        }
    )
    assert options.use_gpu_types == ("A100", "V100")
    assert options.nouse_gpu_types == ("T4",)
    assert options.use_gpu_uuids == ("GPU-a", "GPU-b")
    assert options.nouse_gpu_uuids == ("GPU-c",)
    assert options.numa_bind is True
    assert options.vgpu_mode == "hami-core"
    assert options.gpu_policy is not None
    assert options.gpu_policy.names == (GpuPolicyName.NUMA, GpuPolicyName.BINPACK)
    assert options.gpu_policy.chain
    assert options.node_policy is NodePolicy.SPREAD
    assert options.scoring_weights == ScoringWeights(slot=0, core=1, memory=2)


def test_pod_gpu_options_defaults_and_numa_bind_parse_bool() -> None:
    empty = codec.parse_pod_gpu_options({})
    assert empty.gpu_policy is None and empty.node_policy is None and not empty.numa_bind
    for value in ("1", "t", "T", "TRUE", "true", "True"):
        assert codec.parse_pod_gpu_options({"nvidia.com/numa-bind": value}).numa_bind
    for value in ("yes", "0", "false", ""):
        assert not codec.parse_pod_gpu_options({"nvidia.com/numa-bind": value}).numa_bind


@pytest.mark.parametrize(
    ("text", "names", "chain"),
    [
        ("binpack", (GpuPolicyName.BINPACK,), False),
        ("spread", (GpuPolicyName.SPREAD,), False),
        ("mutex", (GpuPolicyName.MUTEX,), False),
        ("topology-aware", (GpuPolicyName.TOPOLOGY_AWARE,), False),
        ("numa", (GpuPolicyName.NUMA,), True),
        ("binpack,", (GpuPolicyName.BINPACK,), True),
        (" spread , numa , spread", (GpuPolicyName.SPREAD, GpuPolicyName.NUMA), True),
        ("mutex,binpack", (GpuPolicyName.MUTEX, GpuPolicyName.BINPACK), True),
    ],
)
def test_gpu_policy_parse(text: str, names: tuple[GpuPolicyName, ...], chain: bool) -> None:
    policy = codec.parse_gpu_policy(text)
    assert policy.names == names
    assert policy.chain is chain


def test_unknown_policies_are_errors() -> None:
    with pytest.raises(AnnotationError, match='unknown GPU scheduler policy "packbin"'):
        codec.parse_pod_gpu_options({"hami.io/gpu-scheduler-policy": "packbin"})
    with pytest.raises(AnnotationError, match='unknown node scheduler policy "fill"'):
        codec.parse_pod_gpu_options({"hami.io/node-scheduler-policy": "fill"})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("slot=1,core=1", "expected slot, core, and memory weights"),
        ("slot=1,core=1,memory=1,x=1", "expected slot, core, and memory weights"),
        ("slot=1,core,memory=1", "expected key=value entries"),
        ("slot=1,core=x,memory=1", '"core" weight must be an integer'),
        ("slot=1,core=1.5,memory=1", '"core" weight must be an integer'),
        ("slot=-1,core=1,memory=1", '"slot" weight must not be negative'),
        ("slot=1,gpu=1,memory=1", 'unknown weight "gpu"'),
        ("slot=1,slot=1,memory=1", 'duplicate "slot" weight'),
        ("slot=0,core=0,memory=0", "at least one weight must be positive"),
    ],
)
def test_scoring_weight_errors(value: str, message: str) -> None:
    with pytest.raises(AnnotationError, match=message) as caught:
        codec.parse_scoring_weights(value)
    assert caught.value.key == "hami.io/device-scoring-weights"


def test_device_cordon() -> None:
    assert codec.parse_device_cordon(" GPU-a, ,GPU-b,,") == frozenset({"GPU-a", "GPU-b"})
    assert codec.parse_device_cordon("") == frozenset()


def test_pod_options_keep_hamis_reading_of_blanks() -> None:
    unset = codec.parse_pod_gpu_options({})
    assert unset.use_gpu_types is None and unset.use_gpu_uuids is None
    assert unset.vgpu_mode is None
    blank = codec.parse_pod_gpu_options(
        {"nvidia.com/use-gputype": "  ", "nvidia.com/nouse-gpuuuid": ""}
    )
    assert blank.use_gpu_types is None and blank.nouse_gpu_uuids is None
    itemless = codec.parse_pod_gpu_options(
        {"nvidia.com/use-gputype": ",", "nvidia.com/use-gpuuuid": " , ", "nvidia.com/vgpu-mode": ""}
    )
    assert itemless.use_gpu_types == () and itemless.use_gpu_uuids == ()
    assert itemless.vgpu_mode == ""


@pytest.mark.parametrize(
    ("text", "names", "exact"),
    [
        ("", (), True),
        ("   ", (), True),
        ("binpack", (GpuPolicyName.BINPACK,), True),
        (" binpack", (GpuPolicyName.BINPACK,), False),
        ("mutex ", (GpuPolicyName.MUTEX,), False),
        (" numa, binpack", (GpuPolicyName.NUMA, GpuPolicyName.BINPACK), True),
    ],
)
def test_pod_gpu_policy_blanks(text: str, names: tuple[GpuPolicyName, ...], exact: bool) -> None:
    policy = codec.parse_pod_gpu_options({"hami.io/gpu-scheduler-policy": text}).gpu_policy
    assert policy is not None
    assert (policy.names, policy.exact) == (names, exact)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spread", NodePolicy.SPREAD),
        ("binpack", NodePolicy.BINPACK),
        (" spread", NodePolicy.BINPACK),
        ("", NodePolicy.BINPACK),
    ],
)
def test_pod_node_policy_is_exactly_spread_or_binpack(text: str, expected: NodePolicy) -> None:
    options = codec.parse_pod_gpu_options({"hami.io/node-scheduler-policy": text})
    assert options.node_policy is expected


def test_flag_policies_stay_strict() -> None:
    with pytest.raises(AnnotationError, match="empty GPU scheduler policy"):
        codec.parse_gpu_policy(" ")
    assert codec.parse_node_policy(" spread ") is NodePolicy.SPREAD


# --- Go durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300),
        ("28s", 28),
        ("1m30s", 90),
        ("1.5h", 5400),
        ("300ms", 0.3),
        ("2h45m", 9900),
        ("0", 0),
        ("-1m", -60),
        (".5s", 0.5),
        ("1us", 0.000001),
        ("1µs", 0.000001),
    ],
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "m", "5x", "1m 30s", "--1s", ".s", "1h-2m"])
def test_parse_go_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300, "5m0s"),
        (28, "28s"),
        (90, "1m30s"),
        (3600, "1h0m0s"),
        (1.5, "1.5s"),
        (0.5, "500ms"),
        (0, "0s"),
        (-60, "-1m0s"),
        (0.000001, "1µs"),
    ],
)
def test_format_go_duration(seconds: float, text: str) -> None:
    assert format_go_duration(timedelta(seconds=seconds)) == text


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_go_duration_round_trip(microseconds: int) -> None:
    duration = timedelta(microseconds=microseconds)
    assert parse_go_duration(format_go_duration(duration)) == duration
