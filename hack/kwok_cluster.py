"""A real Kubernetes control plane for tests and `make cluster`: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, run as local processes by `kwokctl --runtime binary`, with fake GPU nodes.

Nothing here is simulated but the nodes: kwok marks pods scheduled onto them Running and Ready without running
containers. Binaries come from hack/build-control-plane.sh (built from the Go module proxy, cached by version);
helm and kubectl from hack/install-system-deps.sh.

    python hack/kwok_cluster.py up [--name NAME]     # prints `export KUBECONFIG=...` last
    python hack/kwok_cluster.py down [--name NAME]

Clusters are named, so parallel runs coexist (each gets its own ports from kwokctl), and `up` never tears down a
cluster that is in use: every cluster records its owner in OWNERS/NAME.json, a process id for a test session or
none for `make cluster` (it lives until `down`). `up` first reaps the clusters whose owner died (a test session
killed with SIGKILL leaves etcd and kube-apiserver running), then creates its own, reuses its own persistent one,
or refuses a name a live owner holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HACK = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SLOTUNE_CACHE", Path.home() / ".cache" / "slotune"))
DEFAULT_WORKDIR = CACHE / "clusters"
DEFAULT_NAME = os.environ.get("SLOTUNE_CLUSTER", "slotune")


class ClusterInUse(RuntimeError):
    """A cluster of that name runs and its owner is alive: it is someone else's, never torn down."""


@dataclass(frozen=True)
class Owner:
    """Who a cluster belongs to: a live process (pid and its start time, so a reused pid is not mistaken for the
    owner), or nobody in particular (pid None: a persistent cluster that lives until `down`)."""

    pid: int | None
    start_ticks: int | None = None

    @classmethod
    def this_process(cls) -> Owner:
        return cls(os.getpid(), _start_ticks(os.getpid()))

    def alive(self) -> bool:
        return self.pid is None or (self.start_ticks is not None and _start_ticks(self.pid) == self.start_ticks)


def _start_ticks(pid: int) -> int | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat field 22); None if it is gone or a
    zombie (a dead owner whose parent has not reaped it yet is dead all the same)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def owners_dir(workdir: Path) -> Path:
    return workdir / "owners"


def read_owners(workdir: Path) -> dict[str, Owner]:
    """Every cluster of `workdir` that records an owner, by name (an unreadable record counts as a dead owner)."""
    owners = {}
    for path in sorted(owners_dir(workdir).glob("*.json")):
        try:
            body = json.loads(path.read_text())
            owners[path.stem] = Owner(body["pid"], body.get("start_ticks"))
        except (OSError, ValueError, KeyError, TypeError):
            owners[path.stem] = Owner(-1, -1)
    return owners


def orphans(workdir: Path) -> list[str]:
    """Names of the clusters in `workdir` whose owner process is gone."""
    return [name for name, owner in read_owners(workdir).items() if not owner.alive()]


@dataclass(frozen=True)
class GPUNode:
    """A fake node that advertises GPUs the way the NVIDIA device plugin and GPU feature discovery do."""

    name: str
    product: str
    gpus: int = 8
    memory_mib: int = 81559
    pods: int = 110  # the kubelet's default; the scale benchmark needs room for a thousand

    def manifest(self) -> dict:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.memory": str(self.memory_mib),
        }
        resources = {"cpu": "64", "memory": "512Gi", "pods": str(self.pods), "nvidia.com/gpu": str(self.gpus)}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"providerID": f"kwok://{self.name}"},
            "status": {"capacity": resources, "allocatable": resources, "phase": "Running"},
        }


DEFAULT_NODES = (
    GPUNode("gpu-h100-0", "NVIDIA-H100-80GB-HBM3"),
    GPUNode("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", memory_mib=40960),
)


def binaries() -> Path:
    """Directory of the control-plane binaries, building them first if the cache lacks them."""
    result = subprocess.run([str(HACK / "build-control-plane.sh")], check=True, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    return Path(result.stdout.strip().splitlines()[-1])


def tools_dir() -> Path:
    versions = dict(
        line.split("=", 1) for line in (HACK / "versions.env").read_text().splitlines() if "=" in line
        and not line.startswith("#")
    )
    return CACHE / "tools" / versions["HELM_PYPI_PACKAGE"]


@dataclass
class Cluster:
    name: str
    workdir: Path
    bin_dir: Path
    nodes: tuple[GPUNode, ...] = DEFAULT_NODES
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()  # kwokctl --extra-args COMPONENT=FLAG=VALUE, e.g. a wider service range

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / f"{self.name}.kubeconfig"

    @property
    def kubectl_path(self) -> str:
        bundled = tools_dir() / "kubectl"
        return str(bundled) if bundled.exists() else shutil.which("kubectl") or "kubectl"

    def _kwokctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = os.environ | {"KWOK_WORKDIR": str(self.workdir)} | self.env
        return subprocess.run(
            [str(self.bin_dir / "kwokctl"), "--name", self.name, *args],
            env=env, check=check, capture_output=True, text=True,
        )

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args],
            check=check, capture_output=True, text=True, input=input,
        )

    @property
    def owner_file(self) -> Path:
        return owners_dir(self.workdir) / f"{self.name}.json"

    def exists(self) -> bool:
        return (self.workdir / "clusters" / self.name).exists() or self.owner_file.exists()

    def owner(self) -> Owner | None:
        return read_owners(self.workdir).get(self.name) if self.owner_file.exists() else None

    def reap_orphans(self) -> list[str]:
        """Delete the clusters of this workdir whose owner died; their names."""
        reaped = orphans(self.workdir)
        for name in reaped:
            Cluster(name, self.workdir, self.bin_dir).down()
            sys.stderr.write(f"reaped cluster {name}: its owner process is gone\n")
        return reaped

    def up(self, owner: Owner | None = None) -> bool:
        """Start this cluster for `owner` (default: this process). False when the persistent cluster of this name
        already runs and is reused; raises ClusterInUse when a live owner holds the name."""
        owner = owner or Owner.this_process()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.reap_orphans()
        if self.exists():
            held, serving = self.owner(), self._serving()
            persistent = owner.pid is None and held is not None and held.pid is None
            if persistent and serving:
                return False  # `make cluster` twice: the same persistent cluster, untouched
            if not persistent and (serving or held is not None):
                who = "persistent (make clean-cluster)" if held is None or held.pid is None else f"pid {held.pid}"
                raise ClusterInUse(f"cluster {self.name} in {self.workdir} is in use ({who}); pick another name")
            self.down()  # remains nobody uses: a persistent cluster that stopped (a reboot), or an unowned dead one
        owners_dir(self.workdir).mkdir(parents=True, exist_ok=True)
        # Recorded before creating, so a session killed while the cluster starts still leaves a reapable record.
        self.owner_file.write_text(json.dumps({"pid": owner.pid, "start_ticks": owner.start_ticks}))
        try:
            self._create()
        except BaseException:
            self.down()
            raise
        return True

    def _serving(self) -> bool:
        return self.kubeconfig.exists() and self.kubectl("get", "--raw", "/readyz", "--request-timeout=5s",
                                                         check=False).returncode == 0

    def _create(self) -> None:
        b = self.bin_dir
        started = time.monotonic()
        result = self._kwokctl(
            "create", "cluster", "--runtime", "binary", "--wait", "120s", "--timeout", "180s",
            "--kubeconfig", str(self.kubeconfig),
            "--etcd-binary", str(b / "etcd"),
            "--kube-apiserver-binary", str(b / "kube-apiserver"),
            "--kube-controller-manager-binary", str(b / "kube-controller-manager"),
            "--kube-scheduler-binary", str(b / "kube-scheduler"),
            "--kwok-controller-binary", str(b / "kwok"),
            *(arg for extra in self.extra_args for arg in ("--extra-args", extra)),
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kwokctl create cluster failed:\n{result.stdout}\n{result.stderr}")
        self._wait_for_api()
        for node in self.nodes:
            self.kubectl("apply", "-f", "-", input=json.dumps(node.manifest()))
        self._wait_for_nodes_ready()
        sys.stderr.write(f"cluster {self.name} up in {time.monotonic() - started:.1f} s\n")

    def down(self) -> None:
        if (self.workdir / "clusters" / self.name).exists():
            self._kwokctl("delete", "cluster", check=False)
        self.kubeconfig.unlink(missing_ok=True)
        self.owner_file.unlink(missing_ok=True)

    def _wait_for_api(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # The default ServiceAccount appears a moment after the API is ready; pods need it.
            ready = self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0
            if ready and self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise TimeoutError("kube-apiserver did not become ready")

    def _wait_for_nodes_ready(self, timeout_s: float = 60) -> None:
        names = [n.name for n in self.nodes]
        self.kubectl("wait", "--for=condition=Ready", f"--timeout={int(timeout_s)}s", *(f"node/{n}" for n in names))

    def api_client(self):  # -> kubernetes.client.ApiClient; imported lazily so `make cluster` needs no venv
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def server_version(self) -> str:
        info = json.loads(self.kubectl("version", "-o", "json").stdout)
        return info["serverVersion"]["gitVersion"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kwok_cluster.py", description="a kwok control plane for slotune")
    parser.add_argument("action", choices=("up", "down"), nargs="?", default="up")
    parser.add_argument("--name", default=DEFAULT_NAME, help="cluster name (default $SLOTUNE_CLUSTER or slotune)")
    args = parser.parse_args(argv[1:])
    cluster = Cluster(args.name, DEFAULT_WORKDIR, binaries())
    if args.action == "down":
        cluster.down()
        return 0
    try:
        created = cluster.up(Owner(None))  # persistent: lives until `down`, whoever started it
    except ClusterInUse as error:
        print(error, file=sys.stderr)
        return 1
    state = "up" if created else "already up (reused)"
    print(f"cluster {cluster.name} {state}: control plane {cluster.server_version()} with nodes "
          f"{', '.join(n.name for n in cluster.nodes)}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
