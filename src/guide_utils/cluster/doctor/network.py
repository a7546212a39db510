"""The network between the nodes, as NCCL (RCCL) will use it: the node's own hardware (HPE
Slingshot's CXI devices and ``hsn*`` interfaces under /sys), the libfabric (OFI) plugin NCCL
would load, and ``doctor --network``: one NCCL communicator at ``NCCL_DEBUG=INFO``, whose lines
say which plugin loaded and which network NCCL uses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

# --- the node: HPE Slingshot, and the plugin NCCL would load ----------------------------------
# Slingshot's network cards show up as CXI devices (/sys/class/cxi/cxi0, ...) and as the hsn0...
# interfaces (/sys/class/net, which `ip link` lists). NCCL (RCCL) reaches Slingshot only through
# the libfabric (OFI) plugin, aws-ofi-nccl (aws-ofi-rccl): without it, NCCL talks TCP over the
# hsn interfaces, whatever the site profile says. The node is asked, not the profile. On an
# InfiniBand node NCCL needs no plugin ("Using network IB"): TCP sockets there are as wrong.
PLUGINS = ("libnccl-net*.so*", "librccl-net*.so*")
LIBRARY_DIRS = ("/usr/lib64", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                "/usr/local/lib", "/usr/local/lib64")


def slingshot(root: str | os.PathLike = "/") -> str | None:
    """What shows that this node is on HPE Slingshot (its /sys under ``root``): its CXI devices,
    else its hsn* interfaces; None when it has neither."""
    sys_class = Path(root, "sys", "class")
    cxi = sorted(p.name for p in (sys_class / "cxi").glob("cxi*"))
    if cxi:
        return f"CXI devices {','.join(cxi)}"
    hsn = sorted(p.name for p in (sys_class / "net").glob("hsn*"))
    return f"interfaces {','.join(hsn)}" if hsn else None


def infiniband(root: str | os.PathLike = "/") -> str | None:
    """What shows that this node is on InfiniBand (its /sys under ``root``): its RDMA devices with
    an active port whose link layer is InfiniBand (RoCE and Ethernet-mode NICs are listed there
    too, and are not); None when it has none. NCCL uses InfiniBand itself ("Using network IB")."""
    found = []
    for device in sorted(Path(root, "sys", "class", "infiniband").glob("*")):
        for port in sorted((device / "ports").glob("*")):
            try:
                layer, state = (port / "link_layer").read_text().strip(), (port / "state").read_text().strip()
            except OSError:
                continue
            if layer == "InfiniBand" and state.endswith("ACTIVE"):
                found.append(device.name)
                break
    return f"devices {','.join(found)}" if found else None


def ofi_plugin(env: Mapping[str, str], root: str | os.PathLike = "/") -> str | None:
    """The network plugin NCCL (RCCL) would load: the one NCCL_NET_PLUGIN names, else the first
    libnccl-net / librccl-net library on LD_LIBRARY_PATH or in the system's library folders
    (under ``root``); None when there is none."""
    if env.get("NCCL_NET_PLUGIN"):
        return f"NCCL_NET_PLUGIN={env['NCCL_NET_PLUGIN']}"
    folders = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")] + list(LIBRARY_DIRS)
    for folder in folders:
        for pattern in PLUGINS:
            found = sorted(Path(root, folder.lstrip("/")).glob(pattern))
            if found:
                return "/" + found[0].relative_to(root).as_posix()
    return None


# --- the network NCCL (RCCL) uses between nodes ------------------------------------------------
# One process creates a one-rank NCCL communicator and runs an allreduce with NCCL_DEBUG=INFO:
# NCCL then says which network plugin it loaded, or that it found none, and which network it
# uses ("Using network Socket" is TCP). On a Slingshot site that means the libfabric (OFI)
# plugin did not load and gradients cross the nodes over TCP, which nothing else reports.
NCCL_PROBE = """
import sys, torch
if not torch.cuda.is_available():
    print("GUIDE_NO_GPU"); sys.exit(0)
import torch.distributed as dist
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
dist.destroy_process_group()
"""
_NCCL_LINES = {  # what NCCL 2.18-2.23 and RCCL print at NCCL_DEBUG=INFO, with the OFI plugin's own lines
    "library": re.compile(r"\b(NCCL|RCCL) version\s*:?\s*(\d+\.\d+\.\d+)"),
    "plugin": re.compile(r"NET/Plugin ?: Loaded net plugin (.+?) \(v\d+\)"),
    "ofi": re.compile(r"NET/OFI (?:Initializing|Using) (aws-ofi-[nr]ccl)\s*(\S*)"),
    "no_plugin": re.compile(r"NET/Plugin ?: .*(?:No plugin found|Could not find|Plugin load returned)|"
                            r"Using internal (?:network plugin|implementation)"),
    "network": re.compile(r"NCCL INFO Using network (.+?)\s*$"),
}
SOCKETS = "Socket"


def nccl_network(log: str) -> dict[str, Any]:
    """What an NCCL_DEBUG=INFO log says about the network: the library and its version, the
    network plugin loaded (None: none; its OFI version where it says), whether NCCL looked for
    a plugin and found none, and the network NCCL uses (None when it never said)."""
    found: dict[str, Any] = {"library": None, "version": None, "plugin": None, "ofi": None, "no_plugin": False,
                             "network": None}
    for line in log.splitlines():
        if m := _NCCL_LINES["library"].search(line):
            found["library"], found["version"] = m.group(1), m.group(2)
        elif m := _NCCL_LINES["plugin"].search(line):
            found["plugin"] = m.group(1)
        elif m := _NCCL_LINES["ofi"].search(line):
            found["ofi"] = " ".join(filter(None, m.groups()))
        elif _NCCL_LINES["no_plugin"].search(line):
            found["no_plugin"] = True
        elif m := _NCCL_LINES["network"].search(line):
            found["network"] = m.group(1)
    return found


# NCCL_NET values that name NCCL's own transports (NCCL matches them without regard to case):
# a site that sets one asks for that transport, not for a plugin.
BUILT_IN_NETS = {"ib": "IB", "socket": "Socket"}


def built_in_net(env: Mapping[str, str]) -> str | None:
    """NCCL_NET's value where it names one of NCCL's own transports (IB, Socket), else None."""
    return BUILT_IN_NETS.get(env.get("NCCL_NET", "").lower())  # NCCL compares with strcasecmp


def expects_plugin(env: Mapping[str, str], node: str | None = None) -> str | None:
    """Why NCCL should use a network plugin here, or None: the node is on Slingshot (``node``,
    what :func:`slingshot` found), or the site's settings say so (NCCL_NET naming a plugin
    rather than IB or Socket, NCCL_NET_PLUGIN set, libfabric's Slingshot (CXI) provider tuned,
    the hsn* interfaces given to NCCL)."""
    if node:
        return f"this node is on HPE Slingshot ({node}), which NCCL reaches only through the libfabric (OFI) plugin"
    plugin_named = bool(env.get("NCCL_NET")) and built_in_net(env) is None
    if (plugin_named or env.get("NCCL_NET_PLUGIN") or any(k.startswith("FI_CXI_") for k in env)
            or env.get("NCCL_SOCKET_IFNAME", "").lstrip("=^").startswith("hsn")):
        return "this site's settings expect the libfabric (OFI) plugin"
    return None


def network_problems(found: dict[str, Any], env: Mapping[str, str], node: str | None = None,
                     ib: str | None = None) -> list[str]:
    """PROBLEM lines: TCP sockets (or no network line at all) where the node or the site expects
    a plugin, and TCP sockets on an InfiniBand node (``ib``: what :func:`infiniband` found)."""
    reason = expects_plugin(env, node)
    library = found["library"] or "NCCL"
    if not reason:
        if ib and found["network"] == SOCKETS:
            return [f"{library} uses TCP sockets between nodes although this node is on InfiniBand ({ib}), which "
                    f"NCCL uses by itself (network IB): leave NCCL_IB_DISABLE ({env.get('NCCL_IB_DISABLE', '')!r}) "
                    f"and NCCL_NET ({env.get('NCCL_NET', '')!r}) unset, and give NCCL libibverbs (rdma-core) and "
                    f"/dev/infiniband (in an image: the host's, bound in by the site profile)"]
        return []
    if found["network"] == SOCKETS:
        why = "it found no network plugin" if found["no_plugin"] else "the plugin it loaded was not used"
        return [f"{library} uses TCP sockets between nodes ({why}; NCCL_NET={env.get('NCCL_NET', '')!r}), although "
                f"{reason}: put the site's aws-ofi plugin (libnccl-net.so, RCCL: librccl-net.so) on LD_LIBRARY_PATH "
                f"or load its module (in an image: GUIDE_APPTAINER_NET_LIBS in the site profile), and set "
                f'NCCL_NET="AWS Libfabric" so that NCCL stops instead of falling back']
    if found["network"] is None:
        return [f"{library} did not say which network it uses (no 'Using network' line at NCCL_DEBUG=INFO): "
                f"check the probe's output above"]
    return []


def network_report(env: Mapping[str, str] = os.environ, timeout: float = 180, root: str = "/",
                   ) -> tuple[str, list[str]]:
    """Run the NCCL probe on this node's first GPU; (report line, PROBLEM lines). On a node
    without a GPU (or a PyTorch without CUDA/ROCm) there is nothing to check: a line says so.
    ``root``: where this node's /sys is (a stand-in tree in tests)."""
    run_env = {**env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "PYTHONWARNINGS": "ignore"}
    try:
        out = subprocess.run([sys.executable, "-c", NCCL_PROBE], capture_output=True, text=True, env=run_env,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return "network  NCCL probe did not finish", [f"creating one NCCL communicator took over {timeout:.0f} s"]
    if "GUIDE_NO_GPU" in out.stdout:
        return "network  not checked (no GPU here: NCCL needs one)", []
    return judge_network(out.returncode, out.stdout + out.stderr, env, slingshot(root), infiniband(root))


def judge_network(returncode: int, log: str, env: Mapping[str, str], node: str | None = None,
                  ib: str | None = None) -> tuple[str, list[str]]:
    """The report line and PROBLEM lines of one probe run (its exit status and NCCL's log) on a
    node that is on Slingshot (``node``: what :func:`slingshot` found) or not (None), on
    InfiniBand (``ib``: what :func:`infiniband` found) or not."""
    found = nccl_network(log)
    if returncode != 0:
        lines = [line.strip() for line in log.splitlines() if line.strip()]
        error = next((line for line in lines if " WARN " in line or "Error" in line), lines[-1] if lines else "")
        failed = f"one NCCL communicator failed ({error[-160:] or f'exit {returncode}'})"
        net, built_in = env.get("NCCL_NET", ""), built_in_net(env)
        if built_in == "IB":
            fix = (f"with NCCL_NET={net!r} NCCL stops when it cannot open InfiniBand: give it libibverbs "
                   f"(rdma-core) and /dev/infiniband (in an image: the host's, bound in by the site profile), or "
                   f"leave NCCL_NET unset")
        elif net and built_in is None:
            fix = (f"with NCCL_NET={net!r} NCCL stops when that plugin does not load: put the site's aws-ofi "
                   f"plugin on LD_LIBRARY_PATH or load its module (NCCL_DEBUG=INFO shows where NCCL looked)")
        else:
            fix = "NCCL_DEBUG=INFO (the probe's output above) shows the step that failed"
        return f"network  {found['library'] or 'NCCL'} {found['version'] or '?'} did not start", [f"{failed}; {fix}"]
    plugin = found["plugin"] or ("none" if found["no_plugin"] else "?")
    ofi = f" ({found['ofi']})" if found["ofi"] else ""
    on = (f"; HPE Slingshot: {node}" if node else "") + (f"; InfiniBand: {ib}" if ib else "")
    return (f"network  {found['library'] or 'NCCL'} {found['version'] or '?'}: {found['network'] or '?'} "
            f"(net plugin: {plugin}{ofi}{on})", network_problems(found, env, node, ib))
