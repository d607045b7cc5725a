#!/usr/bin/env python3
"""A stock Prometheus server for the dashboard test and ``scripts/render_dashboard.py``: built from its Go
module into the cache folder, run on 127.0.0.1 against scrape targets the caller names, queried over its
HTTP API. Standard library only.

Building: ``go install github.com/prometheus/prometheus/cmd/prometheus@`` :data:`VERSION` (the Go module
proxy's source of the release, checked against the Go checksum database) with the build tag
``remove_all_sd``, which Prometheus's README documents as leaving out every optional service discovery
(file, static and HTTP discovery stay): a smaller and faster build, and we only scrape static targets.
The binary lands in ``$MQTEST_CACHE/prometheus/<version>-<go version>/`` (never in git); an existing one
builds nothing. Without ``builtinassets`` the web UI is not compiled in; the HTTP API, all we use, is.

Contracts:

* :func:`build` returns the path of the ``prometheus`` binary, or raises :class:`PrometheusError` whose
  message is one line saying what failed (Go missing, Go module proxy unreachable, compile error).
  Concurrent builds wait on one file lock.
* :class:`PrometheusServer` writes a config scraping ``targets`` every ``scrape_interval_s`` into its work
  folder, starts the binary on a free 127.0.0.1 port and waits (a condition: ``/-/ready``) until it
  serves; ``stop()`` ends it. :meth:`PrometheusServer.api` answers the decoded JSON of any API call, error
  answers included (``status: "error"`` with ``errorType``/``error``), so a caller can assert on them.

Command line (``make clients`` runs the first, so tests and CI find the binary built)::

    python scripts/prometheus_server.py build     # prints the binary's path
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from go_drivers import GoBuildError, _failure, _go_version, go_executable  # scripts/ is not a package
from java_toolchain import CACHE, cache_lock
from jvm_processes import free_port, popen_in_group

MODULE = "github.com/prometheus/prometheus"
#: Prometheus 3.16's Go module version (Prometheus 3.x tags its Go module v0.3xx.y).
VERSION = "v0.316.0"
BUILD_TAGS = "remove_all_sd"
BUILD_TIMEOUT_S = 3000.0
START_LIMIT_S = 60.0


class PrometheusError(RuntimeError):
    """Prometheus could not be built or started; the message is one line saying why."""


def build() -> Path:
    """The ``prometheus`` binary of :data:`VERSION`, built into the cache folder on first use."""
    try:
        go = go_executable()
        out_dir = CACHE / "prometheus" / f"{VERSION}-{_go_version(go)}"
    except GoBuildError as exc:
        raise PrometheusError(str(exc)) from exc
    binary = out_dir / "prometheus"
    if binary.exists():
        return binary
    with cache_lock(out_dir / ".lock"):
        if binary.exists():
            return binary
        partial = out_dir / ".partial"
        env = dict(os.environ, GOBIN=str(partial), CGO_ENABLED="0")
        env.pop("GOFLAGS", None)  # `go install pkg@version` takes no -mod flag
        argv = [go, "install", "-trimpath", "-tags", BUILD_TAGS, f"{MODULE}/cmd/prometheus@{VERSION}"]
        try:
            done = subprocess.run(
                argv, cwd=out_dir, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PrometheusError(f"go install prometheus took over {BUILD_TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            raise PrometheusError(f"go install prometheus@{VERSION}: {_failure(done.stderr + done.stdout)}")
        (partial / "prometheus").replace(binary)
    return binary


def scrape_config(targets: Mapping[str, Sequence[str]], scrape_interval_s: float) -> str:
    """A Prometheus config (YAML is a superset of JSON) with one static job per ``targets`` entry."""
    interval = f"{int(scrape_interval_s * 1000)}ms"
    jobs = [
        {"job_name": job, "scrape_interval": interval, "scrape_timeout": interval,
         "static_configs": [{"targets": list(addresses)}]}
        for job, addresses in targets.items()
    ]
    return json.dumps({"global": {"scrape_interval": interval, "evaluation_interval": interval},
                       "scrape_configs": jobs}, indent=1)


class PrometheusServer:
    """One Prometheus process over the work folder ``workdir`` (config, TSDB and log inside it)."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        scrape_interval_s: float = 1.0,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.targets = targets
        self.scrape_interval_s = scrape_interval_s
        self.address = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start and wait until ready; returns ``host:port``. A free port another process takes between
        our probe and Prometheus's bind is retried on a new port (twice)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(scrape_config(self.targets, self.scrape_interval_s), encoding="utf-8")
        for attempt in range(3):
            try:
                return self._start_once(config)
            except PrometheusError as exc:
                if "address already in use" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, config: Path) -> str:
        self.address = f"127.0.0.1:{free_port()}"
        log = self.workdir / "prometheus.log"
        with open(log, "ab") as out:
            self.proc = popen_in_group(  # ends with this process, should it die without stop()
                [str(self.binary), f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                 f"--web.listen-address={self.address}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
            )
        deadline = time.monotonic() + START_LIMIT_S
        while not self._ready():
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}: {' | '.join(tail)}")
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(f"prometheus not ready on {self.address} after {START_LIMIT_S:.0f} s")
            time.sleep(0.1)
        return self.address

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str | float) -> dict[str, Any]:
        """``GET /api/v1/<path>?params``, decoded; error answers (HTTP 4xx/5xx with a JSON body) too."""
        query = urllib.parse.urlencode({k.rstrip("_"): v for k, v in params.items()})
        url = f"http://{self.address}/api/v1/{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                answer: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read())
        return answer

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help=f"build prometheus {VERSION} into the cache folder")
    parser.parse_args(argv)
    try:
        print(build())
    except PrometheusError as exc:
        print(f"prometheus_server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
