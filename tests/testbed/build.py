"""Build or install every test bed component into the cache, from the public registries only.

Kubernetes, etcd, Helm and MinIO come from the Go module proxy; Kafka and Spark's Kafka
connector from Maven Central. Each build is a list of named steps; a failing step raises
:class:`BuildError` naming the component, its version, the step, the log and how to retry.

Run ``python -m tests.testbed build [NAME ...]`` (``make testbed`` does).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent

from .cache import cache_root, component_dir, is_complete, recipe_digest, seal, staging
from .versions import PINS

RECIPE_REVISION = "1"  # bump to force every component to rebuild after a recipe change


class BuildError(RuntimeError):
    """A component failed to build; the message says what, where, and how to retry."""

    def __init__(self, component: str, version: str, step: str, log: Path, detail: str) -> None:
        self.component, self.version, self.step, self.log = component, version, step, log
        super().__init__(
            f"test bed: building {component} {version} failed at step '{step}'.\n"
            f"{detail}\n"
            f"Full log: {log}\n"
            f"Nothing was added to the cache. Retry with: python -m tests.testbed build {component}"
            f"  (or: make testbed). Set STATOR_CACHE to build elsewhere."
        )


@dataclass
class Step:
    """Runs one build step's commands, appending their output to the component's log."""

    component: str
    version: str
    log: Path

    def run(
        self, name: str, argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None
    ) -> str:
        started = time.monotonic()
        with self.log.open("a") as out:
            out.write(f"\n=== step {name}: {' '.join(argv)} (cwd {cwd})\n")
            out.flush()
            try:
                proc = subprocess.run(
                    list(argv),
                    cwd=cwd,
                    env={**os.environ, **(env or {})},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    check=False,
                )
            except FileNotFoundError as exc:
                raise BuildError(
                    self.component,
                    self.version,
                    name,
                    self.log,
                    f"'{argv[0]}' is not installed or not on PATH ({exc}).",
                ) from exc
            out.write(proc.stdout)
            out.write(
                f"=== step {name}: exit {proc.returncode} in {time.monotonic() - started:.1f}s\n"
            )
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
            raise BuildError(
                self.component,
                self.version,
                name,
                self.log,
                f"'{' '.join(argv[:3])} ...' exited with {proc.returncode}. Last lines:\n{tail}",
            )
        return proc.stdout

    def fail(self, name: str, detail: str) -> BuildError:
        return BuildError(self.component, self.version, name, self.log, detail)


@dataclass(frozen=True)
class Component:
    """A test bed component: where it lives in the cache and how to build it."""

    name: str
    version: str
    required: tuple[str, ...]
    builder: Callable[[Path, Step], dict[str, object]]
    recipe: tuple[str, ...] = field(default=())

    @property
    def directory(self) -> Path:
        return component_dir(self.name, self.version, recipe_digest(RECIPE_REVISION, *self.recipe))

    def path(self, rel: str) -> Path:
        return self.directory / rel

    def ready(self) -> bool:
        return is_complete(self.directory, list(self.required))


# --------------------------------------------------------------------------- Go builds


def _go_env(workdir: Path) -> dict[str, str]:
    # GOTOOLCHAIN=local unless CI chose one: never switch toolchains because a module asks.
    # GOFLAGS is reset so a user's -mod=vendor or similar cannot change what gets built.
    return {
        "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local"),
        "CGO_ENABLED": "0",
        "GOFLAGS": "-buildvcs=false",
        "GOWORK": "off",
        "GO111MODULE": "on",
        "PWD": str(workdir),
    }


def _go_module_info(step: Step, module: str, version: str, cwd: Path) -> dict[str, str]:
    out = step.run(
        "go mod download",
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd,
        _go_env(cwd),
    )
    info: dict[str, str] = json.loads(out[out.index("{") :])
    if info.get("Error"):
        raise step.fail("go mod download", str(info["Error"]))
    return info


def _stamp(pairs: dict[str, str]) -> str:
    return " ".join(f"-X {k}={v}" for k, v in pairs.items())


def _write_wrapper(src: Path, module: str, go_line: str, body: str, imports: Sequence[str]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(f"module {module}\n\ngo {go_line}\n\n{body}")
    lines = "\n".join(f'\t_ "{imp}"' for imp in imports)
    (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{lines}\n)\n")


K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The real-node bed's node agent (tests/testbed/realnodes.py): a component of its own, so the
# control plane's build is not redone for it.
KUBELET_COMMANDS = ("kubelet",)


def build_kubernetes(
    stage: Path, step: Step, commands: Sequence[str] = K8S_COMMANDS
) -> dict[str, object]:
    """Wrapper module requiring k8s.io/kubernetes, each staging module replaced by its tag."""
    version = PINS.kubernetes
    src = stage / "src"
    src.mkdir()
    info = _go_module_info(step, "k8s.io/kubernetes", version, src)
    gomod = Path(info["GoMod"]).read_text()
    staging_mods = sorted(
        set(re.findall(r"^\s*(k8s\.io/[A-Za-z0-9._-]+) v0\.0\.0\s*$", gomod, re.M))
    )
    if not staging_mods:
        raise step.fail(
            "derive staging modules", f"no 'k8s.io/<name> v0.0.0' lines in {info['GoMod']}"
        )
    go_line = re.search(r"^go (\S+)", gomod, re.M)
    godebug = re.search(r"^godebug (default=\S+)", gomod, re.M)
    major, minor, patch = version.lstrip("v").split(".")
    staging_tag = f"v0.{minor}.{patch}"
    body = f"godebug {godebug.group(1)}\n\n" if godebug else ""
    body += f"require k8s.io/kubernetes {version}\n\nreplace (\n"
    body += "".join(f"\t{m} => {m} {staging_tag}\n" for m in staging_mods) + ")\n"
    _write_wrapper(
        src,
        "stator.local/testbed/kubernetes",
        go_line.group(1) if go_line else "1.24",
        body,
        [f"k8s.io/kubernetes/cmd/{c}" for c in commands],
    )
    env = _go_env(src)
    step.run("go mod tidy", ["go", "mod", "tidy"], src, env)
    listed = step.run(
        "read release date", ["go", "list", "-m", "-json", f"k8s.io/kubernetes@{version}"], src, env
    )
    release_time = json.loads(listed).get("Time", "1970-01-01T00:00:00Z")
    stamps: dict[str, str] = {}
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        stamps |= {
            f"{pkg}.gitVersion": version,
            f"{pkg}.gitMajor": major,
            f"{pkg}.gitMinor": minor,
            f"{pkg}.gitTreeState": "clean",
            f"{pkg}.buildDate": release_time,
        }
    (stage / "bin").mkdir()
    step.run(
        "go build",
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            f"-s -w {_stamp(stamps)}",
            "-o",
            str(stage / "bin") + "/",
            *[f"k8s.io/kubernetes/cmd/{c}" for c in commands],
        ],
        src,
        env,
    )
    return {"staging_modules": staging_mods, "staging_tag": staging_tag}


def build_etcd(stage: Path, step: Step) -> dict[str, object]:
    """Separate wrapper from Kubernetes', so minimal version selection leaves each alone."""
    version = PINS.etcd
    src = stage / "src"
    body = (
        f"require (\n\tgo.etcd.io/etcd/server/v3 {version}\n"
        f"\tgo.etcd.io/etcd/etcdctl/v3 {version}\n)\n"
    )
    _write_wrapper(
        src,
        "stator.local/testbed/etcd",
        "1.24",
        body,
        ["go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3"],
    )
    env = _go_env(src)
    step.run("go mod tidy", ["go", "mod", "tidy"], src, env)
    (stage / "bin").mkdir()
    for out, pkg in (
        ("etcd", "go.etcd.io/etcd/server/v3"),
        ("etcdctl", "go.etcd.io/etcd/etcdctl/v3"),
    ):
        step.run(
            f"go build {out}",
            ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(stage / "bin" / out), pkg],
            src,
            env,
        )
    return {}


def _go_install(stage: Path, step: Step, target: str, ldflags: str) -> None:
    (stage / "bin").mkdir()
    env = _go_env(stage) | {"GOBIN": str(stage / "bin")}
    step.run("go install", ["go", "install", "-trimpath", "-ldflags", ldflags, target], stage, env)


def build_helm(stage: Path, step: Step) -> dict[str, object]:
    """Stamp the version, and the Kubernetes version `helm template` assumes (the test bed's)."""
    _, minor, _ = PINS.kubernetes.lstrip("v").split(".")
    stamps = {
        "helm.sh/helm/v3/internal/version.version": PINS.helm,
        "helm.sh/helm/v3/internal/version.gitTreeState": "clean",
    }
    for pkg in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        stamps |= {f"{pkg}.k8sVersionMajor": "1", f"{pkg}.k8sVersionMinor": minor}
    _go_install(stage, step, f"helm.sh/helm/v3/cmd/helm@{PINS.helm}", f"-s -w {_stamp(stamps)}")
    return {"kubernetes_assumed": f"1.{minor}"}


def build_minio(stage: Path, step: Step) -> dict[str, object]:
    stamps = {
        "github.com/minio/minio/cmd.Version": PINS.minio_release_tag.removeprefix("RELEASE."),
        "github.com/minio/minio/cmd.ReleaseTag": PINS.minio_release_tag,
    }
    _go_install(stage, step, f"github.com/minio/minio@{PINS.minio}", f"-s -w {_stamp(stamps)}")
    return {}


def build_coredns(stage: Path, step: Step) -> dict[str, object]:
    """Cluster DNS for the real-node bed's pods (a host process; its kubernetes plugin)."""
    _go_install(stage, step, f"github.com/coredns/coredns@{PINS.coredns}", "-s -w")
    return {}


# --------------------------------------------------------------------------- Maven builds

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


def _pom(artifact: str, deps: Sequence[tuple[str, str, str]]) -> str:
    dep_xml = "".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>\n"
        for g, a, v in deps
    )
    return dedent(f"""\
        <project xmlns="http://maven.apache.org/POM/4.0.0">
          <modelVersion>4.0.0</modelVersion>
          <groupId>local.stator.testbed</groupId>
          <artifactId>{artifact}</artifactId>
          <version>1</version>
          <packaging>pom</packaging>
          <dependencies>
        {dep_xml}  </dependencies>
        </project>
        """)


MAVEN_SETTINGS = """\
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <!-- Some poms (Spark's) name extra repositories; resolve everything from Maven Central. -->
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo1.maven.org/maven2</url></mirror>
  </mirrors>
</settings>
"""


def _copy_dependencies(
    stage: Path, step: Step, artifact: str, deps: Sequence[tuple[str, str, str]]
) -> Path:
    src = stage / "src"
    src.mkdir()
    (src / "pom.xml").write_text(_pom(artifact, deps))
    (src / "settings.xml").write_text(MAVEN_SETTINGS)
    lib = stage / "lib"
    step.run(
        "mvn copy-dependencies",
        [
            "mvn",
            "-B",
            "-q",
            "-s",
            str(src / "settings.xml"),
            "-f",
            str(src / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={lib}",
        ],
        src,
    )
    if not lib.is_dir() or not any(lib.glob("*.jar")):
        raise step.fail("mvn copy-dependencies", f"no jars were copied into {lib}")
    return lib


def build_kafka(stage: Path, step: Step) -> dict[str, object]:
    """Kafka's own pom leaves out a logging backend; reload4j + slf4j-reload4j supply one."""
    lib = _copy_dependencies(
        stage,
        step,
        "kafka",
        [
            ("org.apache.kafka", f"kafka_{PINS.kafka_scala}", PINS.kafka),
            ("ch.qos.reload4j", "reload4j", PINS.reload4j),
            ("org.slf4j", "slf4j-reload4j", PINS.slf4j),
        ],
    )
    return {"jars": sorted(p.name for p in lib.glob("*.jar"))}


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _artifact_name(jar: str) -> str:
    """'kafka-clients-3.9.2.jar' -> 'kafka-clients': the name without its version."""
    return re.sub(r"-\d[\w.+-]*\.jar$", "", jar)


def build_spark_kafka(stage: Path, step: Step) -> dict[str, object]:
    """The connector and what it needs that pyspark does not already ship (no duplicate classes)."""
    import pyspark

    if pyspark.__version__ != PINS.spark:
        raise step.fail(
            "check pyspark",
            f"installed pyspark is {pyspark.__version__}, the connector "
            f"pin is {PINS.spark}; run 'make install' so they match",
        )
    lib = _copy_dependencies(
        stage,
        step,
        "spark-kafka",
        [
            ("org.apache.spark", f"spark-sql-kafka-0-10_{PINS.kafka_scala}", PINS.spark),
        ],
    )
    shipped = {_artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar")}
    dropped = []
    for jar in sorted(lib.glob("*.jar")):
        if _artifact_name(jar.name) in shipped:
            jar.unlink()
            dropped.append(jar.name)
    return {"jars": sorted(p.name for p in lib.glob("*.jar")), "already_in_pyspark": dropped}


# --------------------------------------------------------------------------- registry


def _bin(*names: str) -> tuple[str, ...]:
    return tuple(f"bin/{n}" for n in names)


COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("kubernetes", PINS.kubernetes, _bin(*K8S_COMMANDS), build_kubernetes),
        Component(
            "kubelet",
            PINS.kubernetes,
            _bin(*KUBELET_COMMANDS),
            functools.partial(build_kubernetes, commands=KUBELET_COMMANDS),
            KUBELET_COMMANDS,
        ),
        Component("etcd", PINS.etcd, _bin("etcd", "etcdctl"), build_etcd),
        Component("coredns", PINS.coredns, _bin("coredns"), build_coredns),
        Component("helm", PINS.helm, _bin("helm"), build_helm, (PINS.kubernetes,)),
        Component("minio", PINS.minio, _bin("minio"), build_minio, (PINS.minio_release_tag,)),
        Component(
            "kafka",
            PINS.kafka,
            (
                f"lib/kafka_{PINS.kafka_scala}-{PINS.kafka}.jar",
                f"lib/kafka-clients-{PINS.kafka}.jar",
                f"lib/reload4j-{PINS.reload4j}.jar",
            ),
            build_kafka,
            (PINS.kafka_scala, PINS.reload4j, PINS.slf4j),
        ),
        Component(
            "spark-kafka",
            PINS.spark,
            (
                f"lib/spark-sql-kafka-0-10_{PINS.kafka_scala}-{PINS.spark}.jar",
                f"lib/spark-token-provider-kafka-0-10_{PINS.kafka_scala}-{PINS.spark}.jar",
            ),
            build_spark_kafka,
            (PINS.kafka_scala,),
        ),
    )
}


def ensure(name: str, *, quiet: bool = False) -> Component:
    """Return the component, building it first if the cache has no complete copy."""
    comp = COMPONENTS[name]
    if comp.ready():
        return comp
    logs = cache_root() / "testbed" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # One builder per component across processes (make testbed and a test may race).
    with (logs / f".{comp.name}-{comp.version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if comp.ready():
            return comp
        _build(comp, logs, quiet)
    return comp


def _build(comp: Component, logs: Path, quiet: bool) -> None:
    log = logs / f"{comp.name}-{comp.version}.log"
    log.write_text("")
    step = Step(comp.name, comp.version, log)
    started = time.monotonic()
    if not quiet:
        print(
            f"test bed: building {comp.name} {comp.version} (log: {log})",
            file=sys.stderr,
            flush=True,
        )
    with staging(comp.directory) as stage:
        extra = comp.builder(stage, step)
        missing = [rel for rel in comp.required if not (stage / rel).is_file()]
        if missing:
            raise step.fail(
                "verify outputs", f"the build finished but these files are missing: {missing}"
            )
        src = stage / "src"
        if src.is_dir():  # keep the recipe (go.mod, pom.xml) for reference, drop nothing else
            for child in src.iterdir():
                if child.name not in {"go.mod", "go.sum", "tools.go", "pom.xml", "settings.xml"}:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        seal(
            stage,
            {
                "component": comp.name,
                "version": comp.version,
                "required": list(comp.required),
                "seconds": round(time.monotonic() - started, 1),
                **extra,
            },
        )
    if not quiet:
        print(
            f"test bed: {comp.name} {comp.version} ready in {time.monotonic() - started:.0f}s "
            f"at {comp.directory}",
            file=sys.stderr,
            flush=True,
        )


def ensure_all(names: Sequence[str] | None = None) -> list[Component]:
    return [ensure(n) for n in (names or list(COMPONENTS))]
