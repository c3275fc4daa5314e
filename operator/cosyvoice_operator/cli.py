"""``cosyvoice-operator``: run the operator, or render a CosyVoiceService's children without a cluster.

    cosyvoice-operator run --all-namespaces --liveness http://0.0.0.0:8080/healthz
    cosyvoice-operator run -n speech -n speech-canary
    cosyvoice-operator render -f examples/minimal.yaml | kubectl apply --dry-run=server -f -
    cosyvoice-operator simulate --set heldout --jobs 2 --out docs/autoscaling   # autoscaling policy vs HPA/KEDA
    cosyvoice-operator simulate --trace-file load.csv --outage 600:900 --json   # replay your own traffic
    cosyvoice-operator simulate --trace-file load.csv --service tts.yaml        # ... under your CR's policy
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from . import render as rendering
from .constants import LEASE_NAME, OPERATOR_VERSION
from .manifest import services
from .spec import InvalidSpec


def render_file(text: str, namespace: str = "default") -> list[dict[str, Any]]:
    """Children of every CosyVoiceService in a YAML stream; other documents are ignored.

    Raises InvalidSpec naming the offending resource. Owner references are left out: without a
    cluster there is no uid to point at.
    """
    objects: list[dict[str, Any]] = []
    for svc in services(text):
        owner = rendering.Owner(name=svc.name, namespace=svc.namespace or namespace)
        objects.extend(rendering.render(owner, svc.spec).objects)
    return objects


class _PlainDumper(yaml.SafeDumper):  # type: ignore[misc]
    """No &anchors/*aliases: output meant for people and for kubectl."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _write(objects: list[dict[str, Any]], fmt: str, out: TextIO) -> None:
    if fmt == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, out, indent=2)
        out.write("\n")
    else:
        yaml.dump_all(objects, out, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        objects = render_file(text, namespace=args.namespace)
    except (InvalidSpec, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except yaml.YAMLError as exc:
        print(f"error: {args.file} is not YAML: {exc}", file=sys.stderr)
        return 1
    _write(objects, args.output, sys.stdout)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import kopf  # imported here so that `render` works without the operator's runtime

    from . import admin, handlers, leader, runtime  # noqa: F401  # handlers: registers them

    try:
        policy = admin.load(args.config)
        timing = leader.Timing(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_json else kopf.LogFormat.FULL)
    namespaces = list(args.namespace or [])
    memo = kopf.Memo(namespaces=None if args.all_namespaces else namespaces, resync_seconds=args.resync_seconds,
                     cluster_domain=args.cluster_domain, policy=policy)
    options = runtime.Options(namespaces=namespaces, clusterwide=args.all_namespaces, liveness=args.liveness,
                              resync_seconds=args.resync_seconds, cluster_domain=args.cluster_domain, policy=policy,
                              leader_election=args.leader_elect, lease_name=args.lease_name,
                              lease_namespace=args.lease_namespace, identity=args.identity, timing=timing)
    return runtime.run(options, memo)


def _cmd_simulate(args: argparse.Namespace) -> int:
    import time

    try:
        from .autoscaling import simulate  # numpy (and matplotlib for --out) only when simulating
        if args.out:
            import matplotlib  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name} is missing: pip install 'cosyvoice-operator[simulate]'", file=sys.stderr)
        return 1
    return simulate.run_cli(args, time.perf_counter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosyvoice-operator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {OPERATOR_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator against the current cluster")
    scope = run.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", action="append", help="namespace to serve (repeatable; globs allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace")
    run.add_argument("--liveness", metavar="URL", default=None,
                     help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--resync-seconds", type=float, default=60.0,
                     help="period of the full resync: drift, status, GPU capacity (default 60)")
    run.add_argument("--cluster-domain", default="cluster.local", help="DNS domain used in status.endpoint")
    run.add_argument("--config", metavar="FILE", default=None,
                     help="the administrator's settings: metrics sources and bounds (YAML; see docs/operations.md)")
    run.add_argument("--leader-elect", action="store_true",
                     help="act only while holding a Lease, so that several replicas never act at once")
    run.add_argument("--lease-name", default=LEASE_NAME, help="name of the leader election Lease")
    run.add_argument("--lease-namespace", default=None,
                     help="namespace of the Lease (default: $POD_NAMESPACE, else the service account's namespace)")
    run.add_argument("--identity", default=None, help="this replica's identity in the Lease (default: $POD_NAME)")
    run.add_argument("--lease-duration", type=float, default=15.0, help="seconds a Lease holds without renewal")
    run.add_argument("--renew-deadline", type=float, default=10.0,
                     help="seconds the leader keeps acting without a successful renewal")
    run.add_argument("--retry-period", type=float, default=2.0, help="seconds between Lease attempts")
    run.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    run.add_argument("--log-json", action="store_true", help="log as JSON lines")
    run.set_defaults(func=_cmd_run)

    rend = sub.add_parser("render", help="print the objects a CosyVoiceService produces (no cluster needed)")
    rend.add_argument("-f", "--file", required=True, help="YAML file with CosyVoiceService(s), or - for stdin")
    rend.add_argument("-n", "--namespace", default="default", help="namespace for resources that set none")
    rend.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="format (default yaml)")
    rend.set_defaults(func=_cmd_render)

    sim = sub.add_parser("simulate", help="replay traffic traces against the autoscaling policy, HPA v2, KEDA, "
                                          "an oracle and a static pool (see docs/autoscaling.md)")
    from .autoscaling.simconfig import add_arguments
    add_arguments(sim)
    sim.set_defaults(func=_cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `render ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
