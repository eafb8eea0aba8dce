"""A real Kubernetes control plane for tests and `make cluster`: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, run as local processes by `kwokctl --runtime binary`, with fake GPU nodes.

Nothing here is simulated but the nodes: kwok marks pods scheduled onto them Running and Ready without running
containers. Binaries come from hack/build-control-plane.sh (built from the Go module proxy, cached by version);
helm and kubectl from hack/install-system-deps.sh.

    python hack/kwok_cluster.py up      # prints `export KUBECONFIG=...` last
    python hack/kwok_cluster.py down
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class GPUNode:
    """A fake node that advertises GPUs the way the NVIDIA device plugin and GPU feature discovery do."""

    name: str
    product: str
    gpus: int = 8
    memory_mib: int = 81559

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
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus)}
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

    def up(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.down()
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
    action = argv[1] if len(argv) > 1 else "up"
    cluster = Cluster("slotune", DEFAULT_WORKDIR, binaries())
    if action == "down":
        cluster.down()
        return 0
    cluster.up()
    print(f"control plane {cluster.server_version()} with nodes {', '.join(n.name for n in cluster.nodes)}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
