"""``python -m guide_utils links``: a cluster of hosts on this machine, joined by links of a
chosen rate (and delay, where the kernel has netem), to see the network term of the step
model hold or fail (network namespaces, a bridge, tc; see :mod:`guide_utils.perf.links.emulated`).

  rate     build the links, measure their rate and latency (one TCP connection), remove them
  run      build the links, run a command on every host (each in its namespace, on its core), remove them
  measure  the study: per link, the allreduce benchmark and a short training with DDP, Horovod
           over Gloo and over MPI, against the step model (chapter 11); --record FILE keeps it
  show     the table of a recorded study
  clean    remove what runs killed outright (SIGKILL) left behind

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ip and tc (iproute2). Nothing outside the
namespaces it makes is changed or addressed; everything it made is removed on exit.
"""

from __future__ import annotations

import sys

from ...core.cli import ArgumentParser, one_line_errors
from ...core.errors import GuideError

PROG = "python -m guide_utils links"


def build_parser() -> ArgumentParser:
    import argparse

    p = ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0],
                       epilog="Examples:\n  sudo python -m guide_utils links rate --rate 100Mbit/s\n"
                              "  sudo python -m guide_utils links run --rate 1Gbit/s -- sh -c 'echo $LINKS_RANK'\n"
                              "  sudo python -m guide_utils links measure --record links.jsonl")
    sub = p.add_subparsers(dest="what", required=True, metavar="{rate,run,measure,show,clean}")
    for name in ("rate", "run", "measure"):
        s = sub.add_parser(name, help=f"see {PROG} --help")
        s.add_argument("--workers", type=int, default=2, help="hosts, one worker each (default 2)")
        many = name == "measure"
        s.add_argument("--rate", nargs="+" if many else None, default=["100Mbit/s", "1Gbit/s", "10Gbit/s"]
                       if many else "100Mbit/s", help="link rate(s), e.g. 100Mbit/s 1Gbit/s")
        s.add_argument("--delay", help="added one-way delay per link, e.g. 0.5ms (needs netem in the kernel)")
    sub.choices["run"].add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS, on every host")
    sub.choices["run"].add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    sub.choices["measure"].add_argument("--runtime", nargs="+", help="torch-gloo, horovod-gloo, horovod-mpi "
                                                                     "(default: every one this machine has)")
    sub.choices["measure"].add_argument("--max-bytes", default="16M", help="largest allreduce (default 16M)")
    sub.choices["measure"].add_argument("--record", help="write the results here, replacing the file")
    show = sub.add_parser("show", help="the table of a recorded study")
    show.add_argument("file", nargs="?", help="a --record file (default: the recorded study)")
    sub.add_parser("clean", help="remove namespaces left by killed runs")
    return p


def _rate(args) -> int:
    from .emulated import Cluster, Link
    from .study import measure_rate

    with Cluster(args.workers, Link.of(args.rate, args.delay)) as cluster:
        r = measure_rate(cluster)
        pin = "each host on a core of its own" if cluster.pinned else \
            f"{args.workers} hosts share {cluster.cores} cores"
        print(f"{cluster.link.label()}: measured {r['rate_Mbit']:.1f} Mbit/s ({r['bytes'] >> 20} MiB in "
              f"{r['seconds']:.2f} s), latency {r['latency_s'] * 1e6:.0f} us one way; {pin}")
    return 0


def _run(args) -> int:
    from ...runtime import local
    from .emulated import Cluster, Link

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise GuideError("give the command to run on every host after --, e.g. links run -- hostname -I")
    with Cluster(args.workers, Link.of(args.rate, args.delay)) as cluster:
        if not cluster.pinned:
            print(f"{args.workers} hosts on {cluster.cores} cores: they share cores", file=sys.stderr)
        done = local.run([[*cluster.prefix(i), *command] for i in range(args.workers)],
                         each=[cluster.env(i) for i in range(args.workers)], timeout=args.timeout, show=False)
        for i, d in enumerate(done):
            for line in d.stdout.splitlines():
                print(f"[{i}] {line}")
    return 0


def _measure(args) -> int:
    from .. import record
    from .emulated import Link
    from .study import measure, table

    if args.workers != 2:
        raise GuideError("the study measures 2 workers (--workers 2)")
    first, rows = measure([Link.of(r, args.delay) for r in args.rate], runtimes=args.runtime,
                          max_bytes=args.max_bytes)
    if args.record:
        record.write(args.record, first, rows)
    print(table(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


def _show(args) -> int:
    import json
    from pathlib import Path

    from .study import recorded, table

    if args.file:
        lines = [json.loads(x) for x in Path(args.file).read_text(encoding="utf-8").splitlines() if x.strip()]
        first, rows = lines[0], lines[1:]
    else:
        first, rows = recorded()
    print(table(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"{first['hardware']}; {first['date']}; load {first['load_avg_1min']}; commit {first['commit']}")
    return 0


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.what == "clean":
        from .emulated import clean, privileges

        reason = privileges()
        if reason:
            raise GuideError(reason)
        gone = clean(stale_only=True)
        print(f"removed {len(gone)} namespace(s) of runs that are gone" + (f": {' '.join(gone)}" if gone else ""))
        return 0
    return {"rate": _rate, "run": _run, "measure": _measure, "show": _show}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
