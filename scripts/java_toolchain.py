#!/usr/bin/env python3
"""Java artifacts for tests and benchmarks: jars fetched from Maven Central, sources compiled, JVM argv.

Every jar comes from Maven Central at test time, through ``mvn dependency:copy-dependencies``, into a
cache folder outside git (``$MQTEST_CACHE``, default ``<repo>/.cache``; not an ``MQPROXY_*`` name, which
mqproxy would read as a setting). Standard library only, so tests, benchmarks and a shell can all use it.

Contracts:

* :func:`classpath` returns the jars of one named artifact set (:data:`ARTIFACT_SETS`), fetching them once.
* :func:`compile_java` compiles a folder of ``.java`` sources against a classpath once per source hash.
* :func:`jvm_argv` is the command line of a RocketMQ JVM (Java 17 flags, small heap, its own home).
* :func:`cache_lock` serialises writers of one cache entry across processes (a file lock).
* Every failure raises :class:`LauncherError` whose message is one line saying what failed
  (Maven unreachable, Java missing, javac error).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MQTEST_CACHE", REPO / ".cache"))
ROCKETMQ_VERSION = "5.3.3"

#: Named artifact sets: each is fetched with its transitive runtime dependencies into its own folder.
ARTIFACT_SETS: dict[str, tuple[str, ...]] = {
    # name server, broker, proxy and mqadmin (rocketmq-tools) of one release
    "server": tuple(
        f"org.apache.rocketmq:rocketmq-{a}:{ROCKETMQ_VERSION}"
        for a in ("namesrv", "broker", "proxy", "tools")
    ),
    # the 4.x remoting client, with the ACL 1.0 RPC hook
    "client4": ("org.apache.rocketmq:rocketmq-client:4.9.8", "org.apache.rocketmq:rocketmq-acl:4.9.8"),
    # the 5.x remoting client (pop consumption, ACL hook included since 5.3.3)
    "client5": (f"org.apache.rocketmq:rocketmq-client:{ROCKETMQ_VERSION}",),
    # the 5.x gRPC client
    "grpc-java": ("org.apache.rocketmq:rocketmq-client-java:5.2.0",),
    # Apache RocketMQ's own benchmark Producer/Consumer (org.apache.rocketmq.example.benchmark)
    "bench": ("org.apache.rocketmq:rocketmq-example:5.5.0",),
}

#: Java 17 needs these for RocketMQ's store and Netty (RocketMQ targets Java 8).
JAVA17_OPENS = (
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports",
    "java.base/sun.nio.ch=ALL-UNNAMED",
)


class LauncherError(RuntimeError):
    """Something the launcher needs failed; the message is one line saying what."""


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive file lock on ``path`` (created with its parents) for the ``with`` body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pom(coords: Sequence[str]) -> str:
    deps = []
    for coord in coords:
        group, artifact, version = coord.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>mqproxy.tests</groupId><artifactId>deps</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>\n"
    )


def _maven_failure(output: str) -> str:
    lowered = output.lower()
    if any(
        s in lowered
        for s in (
            "unknownhost",
            "could not transfer",
            "connection refused",
            "connect timed out",
            "network is unreachable",
        )
    ):
        return "Maven Central unreachable"
    for line in output.splitlines():
        if "[ERROR]" in line and line.strip() != "[ERROR]":
            return line.replace("[ERROR]", "").strip()[:300]
    return output.strip().splitlines()[-1][:300] if output.strip() else "mvn failed without output"


def fetch(name: str) -> Path:
    """The folder of jars of artifact set ``name``, fetched from Maven Central on first use."""
    coords = ARTIFACT_SETS[name]
    digest = hashlib.sha256("\n".join(coords).encode()).hexdigest()[:12]
    home = CACHE / "maven" / f"{name}-{digest}"
    lib = home / "lib"
    stamp = home / "complete"
    if stamp.exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LauncherError("Maven (mvn) not found: install it (Debian package maven) to fetch RocketMQ jars")
    with cache_lock(home / ".lock"):
        if stamp.exists():
            return lib
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_pom(coords))
        if lib.exists():
            shutil.rmtree(lib)
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(home / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={lib}",
            "-DincludeScope=runtime",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired as exc:
            raise LauncherError(f"fetching {name} from Maven Central took over 900 s") from exc
        if done.returncode != 0 or not lib.is_dir():
            raise LauncherError(
                f"fetching {name} ({', '.join(coords)}): {_maven_failure(done.stdout + done.stderr)}"
            )
        stamp.write_text("\n".join(coords) + "\n")
    return lib


def classpath(*names: str) -> str:
    """A Java class path (``dir/*`` entries) for the given artifact sets, fetched on first use."""
    return os.pathsep.join(str(fetch(n) / "*") for n in names)


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise LauncherError("Java not found: install a JDK 17 (scripts/setup-system.sh does)")
    return found


def compile_java(sources: Path | Sequence[Path], cp: str, *, name: str | None = None) -> Path:
    """Compile every ``.java`` file under ``sources`` (one folder or several) against ``cp``.

    Returns the classes folder; compiled once per hash of the sources and the class path, in the cache.
    """
    roots = [sources] if isinstance(sources, Path) else list(sources)
    files = sorted(f for root in roots for f in root.rglob("*.java"))
    if not files:
        raise LauncherError(f"no .java files under {', '.join(map(str, roots))}")
    digest = hashlib.sha256(cp.encode())
    for f in files:
        digest.update(str(f.relative_to(f.parents[1])).encode())
        digest.update(f.read_bytes())
    out = CACHE / "classes" / f"{name or roots[0].name}-{digest.hexdigest()[:12]}"
    if (out / ".complete").exists():
        return out
    javac = shutil.which("javac") or str(Path(java_executable()).parent / "javac")
    if not Path(javac).exists():
        raise LauncherError(
            "javac not found: install a JDK 17, not only a JRE (scripts/setup-system.sh does)"
        )
    with cache_lock(out.with_suffix(".lock")):
        if (out / ".complete").exists():
            return out
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        done = subprocess.run(
            [javac, "-nowarn", "-encoding", "UTF-8", "-d", str(out), "-cp", cp, *map(str, files)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip())
            raise LauncherError(f"javac failed: {first[:300]}")
        (out / ".complete").write_text("ok\n")
    return out


def jvm_argv(
    cp: str, main: str, args: Sequence[str], *, heap_mb: int = 256, home: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of a RocketMQ JVM: Java 17 flags, a small heap, ``home`` for its logs."""
    return [
        java_executable(),
        f"-Xms{min(heap_mb, 128)}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseG1GC",
        "-XX:-UsePerfData",
        *JAVA17_OPENS,
        f"-Drocketmq.home.dir={home}",
        f"-Duser.home={home}",
        *extra,
        "-cp",
        cp,
        main,
        *args,
    ]
