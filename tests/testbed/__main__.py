"""``python -m tests.testbed build|up|versions|path|images``: the test bed from the command
line."""

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
    images = sub.add_parser(
        "images", help="build the images from images/ (no registry needed) and check them"
    )
    images.add_argument(
        "--base",
        help="base image for the Dockerfiles (default: a Debian bookworm base made locally)",
    )
    images.add_argument("--no-check", action="store_true", help="build and export only")
    args = parser.parse_args(argv)

    if args.cmd == "images":
        return _images(args.base, check=not args.no_check)
    if args.cmd == "build":
        unknown = [n for n in args.names if n not in COMPONENTS]
        if unknown:
            parser.error(f"unknown component(s) {unknown}; choose from {', '.join(COMPONENTS)}")
    if args.cmd in ("build", "path"):
        try:
            if args.cmd == "build":
                ensure_all(args.names or None)
            else:
                tools = [ensure("kubernetes").path("bin"), ensure("helm").path("bin")]
                print(":".join(str(t) for t in tools))
        except BuildError as exc:
            print(exc, file=sys.stderr)
            return 1
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


def _images(base: str | None, *, check: bool) -> int:
    from . import image_checks, images

    try:
        store = images.Store()
        archives = images.build_all(store, base=base)
        for tag, archive in archives.items():
            print(f"{tag}: {archive}")
        if check:
            image_checks.check_driver(store, f"localhost/{images.RUNTIME_TEST.tag}")
            image_checks.check_executor(store, f"localhost/{images.RUNTIME.tag}")
            image_checks.check_operator(store, f"localhost/{images.OPERATOR.tag}")
    except images.ImageError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
