"""``stator console``: open a driver's web console (``control/webconsole.py``).

For a pipeline in Kubernetes: read the control API's read-only token (GETs only: the console
changes nothing) from the Secret the operator made (``NAME-read``, key ``token``), port-forward
a local port to the driver's Service (``NAME-driver``, port 8081) with kubectl, and open
``/console/#token=...`` there; the command keeps the port-forward until interrupted. For a
driver reached directly (``--url``, e.g. a local ``stator run``): open its console. The token
goes only into the URL given to the browser (its fragment is never sent to the driver); it is
printed only with ``--show-token``."""

from __future__ import annotations

import argparse
import base64
import binascii
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import webbrowser
from urllib.parse import quote

from ..control.token import read_token
from ..errors import ConfigError, StatorError

# The operator's names (stator_operator.naming: read_secret_name, CONTROL_TOKEN_KEY,
# CONTROL_PORT and the Service of resources.service); a unit test keeps them equal.
SECRET_SUFFIX = "-read"  # noqa: S105 - a name's suffix, not a secret
TOKEN_KEY = "token"  # noqa: S105 - the key in the Secret, not a secret
SERVICE_SUFFIX = "-driver"
CONTROL_PORT = 8081
CONSOLE_PATH = "/console/"
FORWARD_WAIT_S = 30.0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "console",
        help="open a running job's web console (read-only)",
        description="Open a driver's web console: a pipeline's in Kubernetes (through a "
        "kubectl port-forward to its driver's Service, with the token from its Secret), or "
        "a driver's at --url. The token is printed only with --show-token.",
    )
    p.add_argument("pipeline", nargs="?", help="the StatefulPipeline's name (Kubernetes)")
    p.add_argument("--namespace", "-n", help="its namespace (default: kubectl's current one)")
    p.add_argument("--context", help="the kubeconfig context (default: the current one)")
    p.add_argument(
        "--url", help="a driver's control API to open directly, e.g. http://127.0.0.1:8081"
    )
    p.add_argument(
        "--token-file",
        help="with --url: file with the control API's bearer token (default: none: the "
        "console asks for it if the driver wants one)",
    )
    p.add_argument(
        "--port", type=int, default=0, help="local port of the port-forward (default: a free one)"
    )
    p.add_argument(
        "--no-browser", action="store_true", help="print the URL only, do not open a browser"
    )
    p.add_argument(
        "--show-token", action="store_true", help="print the URL with the token in its fragment"
    )


def console_command(args: argparse.Namespace) -> int:
    if (args.url is None) == (args.pipeline is None):
        raise ConfigError("stator console needs a pipeline's name or --url (one of them)")
    if args.url is not None:
        token = read_token(args.token_file)
        _open(args.url.rstrip("/"), token, args)
        return 0
    if args.token_file:
        raise ConfigError(
            "--token-file goes with --url; a pipeline's token is read from its Secret"
        )
    kubectl = _kubectl(args)
    token = secret_token(kubectl, args.pipeline)
    port = args.port or _free_port()
    forward = subprocess.Popen(
        [
            *kubectl,
            "port-forward",
            f"service/{args.pipeline}{SERVICE_SUFFIX}",
            f"{port}:{CONTROL_PORT}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(base, forward)
        _open(base, token, args)
        print("port-forward running; Ctrl-C to stop", flush=True)
        forward.wait()
        raise StatorError(f"kubectl port-forward ended: {_stderr(forward)}")
    except KeyboardInterrupt:
        return 0
    finally:
        if forward.poll() is None:
            forward.terminate()
            forward.wait(10)


def console_url(base: str, token: str | None) -> str:
    """The console's URL, with the token in its fragment (``webconsole.py`` says why)."""
    return f"{base}{CONSOLE_PATH}" + (f"#token={quote(token, safe='')}" if token else "")


def _open(base: str, token: str | None, args: argparse.Namespace) -> None:
    shown = console_url(base, token if args.show_token else None)
    print(f"console: {shown}" + ("" if args.show_token or not token else "  (token not shown)"))
    if not args.no_browser and not webbrowser.open(console_url(base, token)):
        print("no browser found: open the URL above (--show-token prints it with the token)")


def _kubectl(args: argparse.Namespace) -> list[str]:
    binary = shutil.which("kubectl")
    if binary is None:
        raise ConfigError("stator console needs kubectl on PATH for a pipeline (or use --url)")
    cmd = [binary]
    if args.context:
        cmd += ["--context", args.context]
    if args.namespace:
        cmd += ["--namespace", args.namespace]
    return cmd


def secret_token(kubectl: list[str], pipeline: str) -> str:
    """The control API's token of ``pipeline``, from its Secret (never printed)."""
    secret = f"{pipeline}{SECRET_SUFFIX}"
    done = subprocess.run(
        [*kubectl, "get", "secret", secret, "-o", f"jsonpath={{.data.{TOKEN_KEY}}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise StatorError(
            f"cannot read Secret {secret} (is '{pipeline}' a StatefulPipeline in this "
            f"namespace, and may you read its Secrets?): {done.stderr.strip()[:300]}"
        )
    try:
        token = base64.b64decode(done.stdout.strip(), validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise StatorError(f"Secret {secret}: key '{TOKEN_KEY}' is not base64 text") from exc
    if not token:
        raise StatorError(f"Secret {secret} has no '{TOKEN_KEY}'")
    return token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(base: str, forward: subprocess.Popen[str]) -> None:
    """Until the driver answers ``/healthz`` through the port-forward."""
    deadline = time.monotonic() + FORWARD_WAIT_S
    while time.monotonic() < deadline:
        if forward.poll() is not None:
            raise StatorError(f"kubectl port-forward failed: {_stderr(forward)}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2):  # noqa: S310 - http://
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise StatorError(
        f"the driver did not answer through the port-forward in {FORWARD_WAIT_S:.0f} s"
    )


def _stderr(process: subprocess.Popen[str]) -> str:
    if process.stderr is None or process.poll() is None:
        return "(still running)"
    return process.stderr.read().strip()[:300] or f"exit {process.returncode}"
