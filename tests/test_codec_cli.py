"""`hami decode` / `hami encode`, in-process and through the installed console script."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hami_plugin.cli import main

ROOT = Path(__file__).resolve().parent.parent
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
REGISTER = "hami.io/node-nvidia-register"
A100 = (
    '[{"id":"GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76","count":10,"devmem":81920,"devcore":100,'
    '"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core"}]'
)


def run(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str = ""
) -> tuple[int, str, str]:
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        code = main(argv)
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return code, out, err


def test_decode_pod_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["decode", TO_ALLOCATE, ";GPU-aaa,NVIDIA,1000,30:;"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out) == [
        [],
        [{"uuid": "GPU-aaa", "type": "NVIDIA", "usedmem": 1000, "usedcores": 30}],
        [],
    ]


def test_decode_register_has_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["decode", REGISTER, A100], capsys)
    assert code == 0
    assert json.loads(out) == [
        {
            "id": "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76",
            "index": 0,
            "count": 10,
            "devmem": 81920,
            "devcore": 100,
            "type": "NVIDIA A100-SXM4-80GB",
            "numa": 0,
            "mode": "hami-core",
            "health": False,
        }
    ]


def test_register_round_trip_through_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, decoded, _ = run(["decode", REGISTER, A100], capsys)
    code, out, _ = run(["encode", REGISTER], capsys, stdin=decoded)
    assert (code, out) == (0, A100 + "\n")


def test_encode_pod_devices(capsys: pytest.CaptureFixture[str]) -> None:
    payload = json.dumps([[{"uuid": "GPU-a", "type": "NVIDIA", "usedmem": 3000, "usedcores": 30}]])
    code, out, _ = run(["encode", TO_ALLOCATE], capsys, stdin=payload)
    assert (code, out) == (0, "GPU-a,NVIDIA,3000,30:;\n")


def test_decode_value_from_stdin(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["decode", "hami.io/mutex.lock", "-"], capsys, "2024-05-10T08:01:02Z,ns,p\n")
    assert code == 0
    assert json.loads(out) == {"time": "2024-05-10T08:01:02Z", "namespace": "ns", "pod": "p"}


@pytest.mark.parametrize(
    ("argv", "stdin", "needle"),
    [
        (["decode", TO_ALLOCATE, "uuid,type,100:;"], "", "missing fields"),
        (["decode", "example.com/unknown", "x"], "", "unsupported annotation key"),
        (["decode", REGISTER, "[]"], "", "no gpu found on node"),
        (["encode", TO_ALLOCATE], "not json", "input is not JSON"),
        (["encode", TO_ALLOCATE], '[[{"uuid":"a","usedmem":1,"usedcores":0}]]', 'has no "type"'),
        (["encode", REGISTER], '[{"id":"a","count":1,"devmem":1,"devcore":1}]', 'has no "type"'),
        (
            ["encode", TO_ALLOCATE],
            '[[{"uuid":"a:b","type":"N","usedmem":1,"usedcores":1}]]',
            "contains",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(
    argv: list[str], stdin: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys, stdin)
    assert code == 1
    assert out == ""
    assert needle in err
    assert err.count("\n") == 1


ALLOCATED = "hami.io/vgpu-devices-allocated"
_FORM = "(a device is uuid,type,usedmem,usedcores)"


@pytest.mark.parametrize(
    ("key", "value", "decoded", "message"),
    [
        # HAMi's DecodeContainerDevices skips a piece without ",": garbage is no device at all
        (TO_ALLOCATE, "garbage", [[]],
         f'decodes to no devices: HAMi\'s parser skips "garbage" {_FORM} and accepts the value'),
        (ALLOCATED, "a:b:c:d:e", [[]],
         f'decodes to no devices: HAMi\'s parser skips "a", "b", "c" and 2 more {_FORM} and '
         "accepts the value"),
        (ALLOCATED, "GPU-a,N,1,2:junk:;",
         [[{"uuid": "GPU-a", "type": "N", "usedmem": 1, "usedcores": 2}], []],
         f'HAMi\'s parser skips "junk" {_FORM}; the devices printed are the rest'),
        (ALLOCATED, "", [[]], "decodes to no devices (HAMi's parser accepts it too)"),
        # what HAMi's device plugin leaves once every container is allocated
        (TO_ALLOCATE, ";;", [[], [], []],
         "decodes to no devices: every container is empty (allocated, or no GPU)"),
        # a comma-form register skips empty segments
        (REGISTER, ":", [], "decodes to no devices (HAMi's parser accepts it too)"),
    ],
)  # fmt: skip
def test_a_value_that_decodes_to_nothing_says_so(
    key: str, value: str, decoded: object, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["decode", key, value], capsys)
    assert code == 1
    assert json.loads(out) == decoded  # printed all the same
    assert err == f"hami decode: {key}: {message}\n"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (TO_ALLOCATE, "GPU-a,NVIDIA,1,2:;;"),  # empty containers beside a device are normal
        (REGISTER, A100),
        ("nvidia.com/use-gputype", ""),  # not a device list
    ],
)
def test_a_value_with_devices_decodes_quietly(
    key: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["decode", key, value], capsys)
    assert (code, err) == (0, "")
    assert out


@pytest.mark.parametrize(
    ("value", "prefix"),
    [
        ("GPU-a,ten,7680,100,P4,0,true:", "invalid count field: "),
        ("GPU-a,10,lots,100,P4,0,true:", "invalid memory field: "),
        ("GPU-a,10,7680,all,P4,0,true:", "invalid core field: "),
        ("GPU-a,10,7680,100,P4,near,maybe:", "invalid health field: "),
        ("GPU-a,10,7680,100,P4,near,true:", "invalid numa field: "),
        ("GPU-a,10,7680,100,P4,0,true,first,hami-core:", "invalid index field: "),
        ("GPU-a,10,7680,100,P4,0,true,-1,hami-core:", "index field must not be negative: -1 "),
    ],
)
def test_decode_legacy_register_reports_hamis_prefix(
    value: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """HAMi v2.10 DecodeNodeDevices' prefixes (docs/hami-reference.md 1.5.2), after the annotation
    key."""
    code, out, err = run(["decode", REGISTER, value], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"hami decode: {REGISTER}: {prefix}")
    assert err.endswith(f' in segment "{value.rstrip(":")}"\n')


def test_console_script_and_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hami_plugin", "decode", TO_ALLOCATE, "GPU-a,NVIDIA,1,2:;"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0][0]["uuid"] == "GPU-a"
    script = Path(sys.executable).parent / "hami"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert "decode" in result.stdout


HAMI_REGISTER = (  # what HAMi v2.10's device plugin writes: Go's omitempty on every field
    '[{"id":"GPU-0","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100-SXM4-80GB",'
    '"mode":"hami-core","health":true},{"id":"GPU-1","index":1,"count":10,"devmem":81920,'
    '"devcore":100,"type":"NVIDIA A100-SXM4-80GB","numa":1,"devicevendor":"NVIDIA"}]'
)


def encode(key: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hami_plugin", "encode", key], cwd=ROOT, input=stdin,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_encode_takes_hamis_own_register_json() -> None:
    """GPU 0 has no "index", NUMA node 0 and an empty mode are left out, an unhealthy GPU has
    no "health": read as zero, as HAMi reads them; members we do not use are ignored."""
    done = encode(REGISTER, HAMI_REGISTER)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == HAMI_REGISTER.replace(',"devicevendor":"NVIDIA"', "") + "\n"
    decoded = subprocess.run(
        [sys.executable, "-m", "hami_plugin", "decode", REGISTER, done.stdout.strip()],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    gpus = json.loads(decoded.stdout)
    assert [(g["index"], g["numa"], g["mode"], g["health"]) for g in gpus] == [
        (0, 0, "hami-core", True),
        (1, 1, "", False),
    ]


def test_encode_reports_every_problem_at_once() -> None:
    done = encode(REGISTER, '[{"id":"GPU-0","count":"10"},{"devmem":1,"devcore":100}]')
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        'hami encode: device 0: "count" must be an integer',
        'hami encode: device 0 has no "devmem"',
        'hami encode: device 0 has no "devcore"',
        'hami encode: device 0 has no "type"',
        'hami encode: device 1 has no "id"',
        'hami encode: device 1 has no "count"',
        'hami encode: device 1 has no "type"',
    ]
    done = encode(TO_ALLOCATE, '[[{"uuid":"a"}],[{"type":"N","usedmem":1,"usedcores":0}]]')
    assert done.stderr.splitlines() == [
        'hami encode: container 0 device 0 has no "type"',
        'hami encode: container 0 device 0 has no "usedmem"',
        'hami encode: container 0 device 0 has no "usedcores"',
        'hami encode: container 1 device 0 has no "uuid"',
    ]
