"""``python -m tests.testbed build|up|versions|path``: the test bed from the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from .bed import running
from .build import COMPONENTS, BuildError, ensure, ensure_all
from .versions import PINS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed")
    sub = parser.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser("build", help="build missing components into the cache")
    build.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"components to build (default all: {', '.join(COMPONENTS)})",
    )
    up = sub.add_parser("up", help="start the test bed and print how to reach it; Ctrl-C stops it")
    up.add_argument("--no-kube", action="store_true")
    up.add_argument("--no-minio", action="store_true")
    up.add_argument("--no-kafka", action="store_true")
    up.add_argument("--root", type=Path, help="directory for the components' data and logs")
    sub.add_parser("versions", help="print the pinned versions and cache directories")
    sub.add_parser("path", help="print a PATH prefix with the test bed's kubectl and helm")
    args = parser.parse_args(argv)

    if args.cmd == "build":
        unknown = [n for n in args.names if n not in COMPONENTS]
        if unknown:
            parser.error(f"unknown component(s) {unknown}; choose from {', '.join(COMPONENTS)}")
        try:
            ensure_all(args.names or None)
        except BuildError as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    if args.cmd == "path":
        try:
            tools = [ensure("kubernetes").path("bin"), ensure("helm").path("bin")]
        except BuildError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(":".join(str(t) for t in tools))
        return 0
    if args.cmd == "versions":
        dirs = {name: str(c.directory) for name, c in COMPONENTS.items()}
        print(json.dumps({"pins": asdict(PINS), "cache": dirs}, indent=2))
        return 0
    with running(
        kube=not args.no_kube, minio=not args.no_minio, kafka=not args.no_kafka, root=args.root
    ) as bed:
        print(json.dumps(bed.describe(), indent=2), flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
