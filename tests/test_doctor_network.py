"""The doctor's network check (``doctor --network``): which network NCCL or RCCL uses between
nodes, read from its NCCL_DEBUG=INFO lines. The lines below have the forms NCCL 2.18-2.23, RCCL
and the aws-ofi plugin print (their source's format strings; host, pid and thread made up);
the probe itself needs a GPU and says so on a CPU node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from guide_utils.cluster.doctor import Job, diagnose, gather, render
from guide_utils.cluster.doctor.network import (expects_plugin, infiniband, judge_network, nccl_network,
                                                network_problems, ofi_plugin, slingshot)

SLINGSHOT = {"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3", "FI_CXI_DISABLE_HOST_REGISTER": "1"}

LOGS = {
    # NCCL 2.18 (the message before 2.19), no plugin: internal sockets
    "2.18 sockets": """\
nid001:4711:4711 [0] NCCL INFO NCCL version 2.18.5+cuda12.1
nid001:4711:4790 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
nid001:4711:4790 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.100.0.1<0>
nid001:4711:4790 [0] NCCL INFO Using network Socket
""",
    # NCCL 2.21: dlopen's error, then the internal plugin
    "2.21 sockets": """\
nid001:528157:528157 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared \
object file: No such file or directory : when loading libnccl-net.so
nid001:528157:528157 [0] NCCL INFO NET/Plugin: Using internal network plugin.
NCCL version 2.21.5+cuda12.4
nid001:528157:528268 [0] NCCL INFO Using network Socket
""",
    # NCCL 2.23 with the aws-ofi-nccl plugin on Slingshot
    "2.23 ofi": """\
nid001:58239:58239 [0] NCCL INFO NCCL version 2.23.4+cuda12.6
nid001:58239:58245 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v8)
nid001:58239:58245 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.13.2-aws
nid001:58239:58245 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
nid001:58239:58245 [0] NCCL INFO Using network AWS Libfabric
""",
    # RCCL (LUMI-like) with aws-ofi-rccl
    "rccl ofi": """\
nid005000:1234:1234 [0] NCCL INFO RCCL version 2.18.3+hip6.0 HEAD:2a5d09f
nid005000:1234:1300 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)
nid005000:1234:1300 [0] NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0
nid005000:1234:1300 [0] NCCL INFO Using network AWS Libfabric
""",
}


def test_the_network_lines_of_each_version_are_read():
    assert nccl_network(LOGS["2.18 sockets"]) == {"library": "NCCL", "version": "2.18.5", "plugin": None,
                                                  "ofi": None, "no_plugin": True, "network": "Socket"}
    found = nccl_network(LOGS["2.21 sockets"])
    assert (found["version"], found["no_plugin"], found["network"]) == ("2.21.5", True, "Socket")
    assert nccl_network(LOGS["2.23 ofi"]) == {"library": "NCCL", "version": "2.23.4", "plugin": "AWS Libfabric",
                                              "ofi": "aws-ofi-nccl 1.13.2-aws", "no_plugin": False,
                                              "network": "AWS Libfabric"}
    found = nccl_network(LOGS["rccl ofi"])
    assert (found["library"], found["version"], found["ofi"], found["network"]) == \
        ("RCCL", "2.18.3", "aws-ofi-rccl 1.4.0", "AWS Libfabric")


def test_sockets_are_a_problem_only_where_the_site_expects_a_plugin():
    """On Slingshot (hsn interfaces, libfabric's CXI settings, NCCL_NET) TCP sockets mean the
    plugin did not load; on an Ethernet cluster they are the network."""
    assert expects_plugin(SLINGSHOT) and expects_plugin({"NCCL_NET": "AWS Libfabric"})
    assert not expects_plugin({"NCCL_SOCKET_IFNAME": "enp2s0"}) and not expects_plugin({})
    for name in ("2.18 sockets", "2.21 sockets"):
        [problem] = network_problems(nccl_network(LOGS[name]), SLINGSHOT)
        assert "uses TCP sockets between nodes (it found no network plugin" in problem and "NCCL_NET=" in problem
        assert network_problems(nccl_network(LOGS[name]), {"NCCL_SOCKET_IFNAME": "enp2s0"}) == []
    for name in ("2.23 ofi", "rccl ofi"):
        assert network_problems(nccl_network(LOGS[name]), SLINGSHOT) == []
    [silent] = network_problems(nccl_network("NCCL version 2.21.5+cuda12.4\n"), SLINGSHOT)
    assert "did not say which network" in silent


def test_the_check_on_a_node_without_a_gpu_says_so_and_passes():
    out = subprocess.run([sys.executable, "-m", "guide_utils", "doctor", "--network"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **SLINGSHOT})
    if "not checked" not in out.stdout:
        pytest.skip(f"this machine has a GPU: {out.stdout.strip()}")
    assert out.returncode == 0 and out.stdout.strip() == "network  not checked (no GPU here: NCCL needs one)"


RECORDED = Path(__file__).parent / "data" / "nccl"


def test_recorded_runs_of_the_probe_are_judged():
    """The probe as it ran on one NVIDIA H100 (80GB HBM3, PyTorch 2.11.0+cu130 with NCCL 2.28.9,
    no network plugin, Ethernet only; 2026-11-27, channel lines left out): sockets, which are
    this machine's network; and with NCCL_NET="AWS Libfabric" and no plugin, NCCL stops."""
    log = (RECORDED / "2.28.9-h100-sockets.log").read_text()
    line, problems = judge_network(0, log, {})
    assert line == "network  NCCL 2.28.9: Socket (net plugin: none)" and problems == []
    [problem] = judge_network(0, log, SLINGSHOT)[1]
    assert problem.startswith("NCCL uses TCP sockets between nodes (it found no network plugin")
    forced = (RECORDED / "2.28.9-h100-nccl-net-forced.log").read_text()
    line, [problem] = judge_network(1, forced, {"NCCL_NET": "AWS Libfabric"})
    assert line == "network  NCCL 2.28.9 did not start"
    assert "NCCL WARN Failed to initialize any NET plugin" in problem and "NCCL_NET='AWS Libfabric'" in problem


def _node(root: Path, *interfaces: str, cxi: tuple[str, ...] = ()) -> Path:
    """A stand-in for a node's /sys: its network interfaces (as `ip link` lists them) and CXI devices."""
    for name in interfaces:
        (root / "sys/class/net" / name).mkdir(parents=True)
    for name in cxi:
        (root / "sys/class/cxi" / name).mkdir(parents=True)
    return root


def test_slingshot_is_recognised_by_the_node_not_by_the_profile(tmp_path):
    """A Cray EX node (CXI devices, hsn interfaces) with no profile settings at all: TCP
    sockets are a PROBLEM there; on an InfiniBand or Ethernet node they are not."""
    cray = _node(tmp_path / "cray", "lo", "hsn0", "hsn1", "nmn0", cxi=("cxi0", "cxi1"))
    hsn_only = _node(tmp_path / "hsn", "lo", "hsn0")
    other = _node(tmp_path / "ib", "lo", "eth0", "ib0")
    assert (slingshot(cray), slingshot(hsn_only), slingshot(other)) == ("CXI devices cxi0,cxi1", "interfaces hsn0",
                                                                        None)
    assert expects_plugin({}, slingshot(cray)) and not expects_plugin({}, slingshot(other))
    for name in ("2.18 sockets", "2.21 sockets"):
        [problem] = network_problems(nccl_network(LOGS[name]), {}, slingshot(cray))
        assert problem.startswith("NCCL uses TCP sockets between nodes (it found no network plugin"), problem
        assert "this node is on HPE Slingshot (CXI devices cxi0,cxi1)" in problem and "aws-ofi" in problem
        assert network_problems(nccl_network(LOGS[name]), {}, slingshot(other)) == []
    assert network_problems(nccl_network(LOGS["2.23 ofi"]), {}, slingshot(cray)) == []
    line, [problem] = judge_network(0, LOGS["2.21 sockets"], {}, slingshot(hsn_only))
    assert line == "network  NCCL 2.21.5: Socket (net plugin: none; HPE Slingshot: interfaces hsn0)"


def _rdma(root: Path, device: str, layer: str, state: str = "4: ACTIVE") -> Path:
    """A stand-in for an RDMA device of a node's /sys/class/infiniband, with one port."""
    port = root / "sys/class/infiniband" / device / "ports/1"
    port.mkdir(parents=True)
    (port / "link_layer").write_text(f"{layer}\n")
    (port / "state").write_text(f"{state}\n")
    return root


def test_sockets_on_an_infiniband_node_are_a_problem(tmp_path):
    """An InfiniBand node (an active port of link layer InfiniBand) with no profile settings:
    NCCL should say "Using network IB" by itself, so TCP sockets are a PROBLEM naming the node's
    devices and what turns IB off. A RoCE or Ethernet-mode NIC (listed there too), or a port that
    is down, is not InfiniBand; and IB itself is no problem."""
    ib_node = _rdma(_node(tmp_path / "ib", "lo", "ib0"), "mlx5_0", "InfiniBand")
    _rdma(ib_node, "mlx5_1", "Ethernet")
    roce = _rdma(tmp_path / "roce", "mlx5_0", "Ethernet")
    down = _rdma(tmp_path / "down", "mlx5_0", "InfiniBand", "1: DOWN")
    assert (infiniband(ib_node), infiniband(roce), infiniband(down), infiniband(tmp_path / "none")) == (
        "devices mlx5_0", None, None, None)
    for name in ("2.18 sockets", "2.21 sockets"):
        [problem] = network_problems(nccl_network(LOGS[name]), {"NCCL_IB_DISABLE": "1"}, None, infiniband(ib_node))
        assert problem.startswith("NCCL uses TCP sockets between nodes although this node is on InfiniBand "
                                  "(devices mlx5_0), which NCCL uses by itself (network IB)"), problem
        assert "NCCL_IB_DISABLE ('1')" in problem and "libibverbs" in problem and "\n" not in problem
        assert network_problems(nccl_network(LOGS[name]), {}, None, infiniband(roce)) == []
    line, problems = judge_network(0, LOGS["2.18 sockets"].replace("Socket", "IB"), {}, None, infiniband(ib_node))
    assert problems == [] and line == "network  NCCL 2.18.5: IB (net plugin: none; InfiniBand: devices mlx5_0)"


def test_the_plugin_is_looked_for_where_nccl_looks(tmp_path):
    plugin = tmp_path / "opt/aws-ofi-nccl/lib/libnccl-net.so"
    plugin.parent.mkdir(parents=True)
    plugin.touch()
    assert ofi_plugin({}, tmp_path) is None
    assert ofi_plugin({"LD_LIBRARY_PATH": "/opt/cray/lib:/opt/aws-ofi-nccl/lib"}, tmp_path) == \
        "/opt/aws-ofi-nccl/lib/libnccl-net.so"
    assert ofi_plugin({"NCCL_NET_PLUGIN": "ofi"}, tmp_path) == "NCCL_NET_PLUGIN=ofi"
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/librccl-net.so").touch()  # RCCL's, in a system folder
    assert ofi_plugin({}, tmp_path) == "/usr/lib64/librccl-net.so"


def test_the_doctor_says_when_a_slingshot_node_has_no_plugin(tmp_path):
    """A GPU job on a Slingshot node (a Cray EX site without a profile's NCCL settings, or the
    guide's image with nothing of the host bound in): one WARNING line before anything trains."""
    node = _node(tmp_path, "hsn0", cxi=("cxi0",))
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    job = Job("pytorch", "ddp", quick=True)  # the node's facts only: no framework is imported
    facts = gather(env, job=job, root=str(node))
    [warning] = diagnose(facts).warnings
    assert warning.startswith("this node is on HPE Slingshot (CXI devices cxi0) but NCCL would find no libfabric")
    assert "GUIDE_APPTAINER_NET_LIBS" in warning
    assert re.search(r"^network +HPE Slingshot \(CXI devices cxi0\); OFI plugin: none found$",
                     render(facts, diagnose(facts)), re.M)
    (node / "opt/ofi").mkdir(parents=True)
    (node / "opt/ofi/libnccl-net.so").touch()
    bound = gather({**env, "LD_LIBRARY_PATH": "/opt/ofi"}, job=job, root=str(node))
    assert diagnose(bound).warnings == [] and bound.ofi_plugin == "/opt/ofi/libnccl-net.so"
    assert diagnose(gather({}, job=job, root=str(node))).warnings == []  # a CPU job uses no NCCL
    assert diagnose(gather(env, job=job, root=str(_node(tmp_path / "eth", "eth0")))).warnings == []


def test_nccl_net_naming_ib_or_socket_asks_for_that_transport_not_for_a_plugin():
    """NCCL_NET=IB or Socket (any case) names NCCL's own transports: a site that sets Socket on
    an Ethernet cluster gets no PROBLEM for sockets; any other value names a plugin. A probe
    that fails says what fits the value: InfiniBand's libraries for IB, the plugin otherwise."""
    for value in ("Socket", "socket", "IB", "ib"):
        assert not expects_plugin({"NCCL_NET": value}), value
    assert expects_plugin({"NCCL_NET": "OFI"}) and expects_plugin({"NCCL_NET": "AWS Libfabric"})
    assert network_problems(nccl_network(LOGS["2.21 sockets"]), {"NCCL_NET": "Socket"}) == []
    forced = (RECORDED / "2.28.9-h100-nccl-net-forced.log").read_text()
    _, [ib] = judge_network(1, forced, {"NCCL_NET": "IB"})
    assert "NCCL_NET='IB' NCCL stops when it cannot open InfiniBand" in ib and "libibverbs" in ib
    assert "aws-ofi" not in ib
    _, [plain] = judge_network(1, forced, {})
    assert plain.startswith("one NCCL communicator failed (") and "aws-ofi" not in plain and "NCCL_DEBUG=INFO" in plain
    _, [plugin] = judge_network(1, forced, {"NCCL_NET": "OFI"})
    assert "NCCL_NET='OFI' NCCL stops when that plugin does not load" in plugin
