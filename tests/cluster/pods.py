"""One Pod run as local processes: its network namespace, volumes, containers, probes, restarts and status.

The process kubelet (`tests/cluster/kubelet.py`) makes one `PodWorker` per Pod scheduled to its nodes; the worker
thread owns everything about that Pod until it has terminated and its namespace is gone.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from bookfleet import childprocess
from tests.cluster import images
from tests.cluster.network import Bridge

log = logging.getLogger("kubelet")
PODINIT = Path(__file__).resolve().parent / "podinit.py"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values; `$$` escapes, unknown names stay as written."""

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VARIABLE.sub(replace, text)


class ContainerConfigError(Exception):
    """The container cannot be started as specified (CreateContainerConfigError / an unmapped image)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Probe:
    """A probe's spec and its running counts."""

    spec: dict[str, Any]
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    def due(self, started_at: float) -> bool:
        return time.monotonic() >= max(self.next_at, started_at + self.spec.get("initialDelaySeconds", 0))

    def record(self, passed: bool) -> None:
        self.next_at = time.monotonic() + self.period
        self.successes, self.failures = (self.successes + 1, 0) if passed else (0, self.failures + 1)

    @property
    def failed(self) -> bool:
        return self.failures >= self.spec.get("failureThreshold", 3)

    @property
    def passed(self) -> bool:
        return self.successes >= self.spec.get("successThreshold", 1)


@dataclass
class Container:
    """One container's process and the state Kubernetes reports for it."""

    spec: dict[str, Any]
    init: bool = False
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    started_time: str = ""
    restarts: int = 0
    last_exit: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    ready: bool = False
    started: bool = False
    restart_at: float = 0.0
    probes: dict[str, Probe] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _exit_code(process: subprocess.Popen) -> int:
    code = process.returncode
    return 128 - code if code < 0 else code


class PodWorker:
    """Runs one Pod until it terminates or is deleted, reporting its status to the API server."""

    def __init__(self, kubelet: Any, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.api = kubelet.api
        self.bridge: Bridge = kubelet.bridge
        self.pod = pod
        self.uid = pod["metadata"]["uid"]
        self.name, self.namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        self.spec = pod["spec"]
        self.dir = kubelet.state / "pods" / self.uid
        self.netns = ""
        self.pod_ip = ""
        self.init_containers = [Container(spec, init=True) for spec in self.spec.get("initContainers", [])]
        self.containers = [Container(spec) for spec in self.spec["containers"]]
        self.mounts: dict[str, Path] = {}
        self.volumes_ready = False
        self.phase = "Pending"
        self.stop_requested = threading.Event()
        self.eviction: str | None = None
        """Why the kubelet evicted the pod, once it has: it ends Failed (reason Evicted) and stays until deleted."""
        self.grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        self.done = threading.Event()
        self.last_status: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def request_stop(self, grace: float | None = None) -> None:
        if grace is not None:
            self.grace = min(self.grace, grace)
        self.stop_requested.set()

    def evict(self, message: str) -> None:
        """Node-pressure eviction, as a kubelet does it: the containers are stopped and the pod ends Failed."""
        self.eviction = message
        self.request_stop()

    def _run(self) -> None:
        try:
            self._setup()
            self._loop()
        except Exception:
            log.exception("pod %s/%s failed in the kubelet", self.namespace, self.name)
        finally:
            self._teardown()
            self.done.set()

    def _setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.netns, self.pod_ip = self.bridge.attach(self.uid)
        etc = Path("/etc/netns") / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions ndots:1 attempts:1 timeout:1\n")
        self.kubelet.write_hosts(self)
        self._report()

    def _loop(self) -> None:
        while not self.stop_requested.is_set():
            if self.phase in ("Succeeded", "Failed"):
                break
            if self.volumes_ready or self._try_volumes():
                self._step()
            self._report()
            self.stop_requested.wait(0.5)
        self._stop_all(self.grace)
        if self.eviction is not None:
            self.phase = "Failed"
        self._report()

    def _teardown(self) -> None:
        for container in (*self.init_containers, *self.containers):
            self._kill(container, signal.SIGKILL)
        if self.netns:
            self.bridge.detach(self.netns)
            shutil.rmtree(Path("/etc/netns") / self.netns, ignore_errors=True)

    # --- volumes ------------------------------------------------------------------------------------------------

    def _fs_group(self) -> int | None:
        return self.spec.get("securityContext", {}).get("fsGroup")

    def _own(self, path: Path, recursive: bool) -> None:
        group = self._fs_group()
        if group is None:
            return
        paths = [path, *path.rglob("*")] if recursive else [path]
        for item in paths:
            os.chown(item, -1, group, follow_symlinks=False)
            if item.is_dir():
                item.chmod(item.stat().st_mode | 0o2070)
            elif not item.is_symlink():
                item.chmod(item.stat().st_mode | 0o060)

    def _try_volumes(self) -> bool:
        """Volumes can wait on the API (a claim not bound yet, a ConfigMap not published yet): retry, never give up."""
        try:
            self._prepare_volumes()
        except (KeyError, ApiException, ContainerConfigError) as error:
            for container in (*self.init_containers, *self.containers):
                container.waiting = ("ContainerCreating", f"volumes not ready: {error}")
            return False
        self.volumes_ready = True
        return True

    def _prepare_volumes(self) -> None:
        for volume in self.spec.get("volumes", []):
            name = volume["name"]
            target = self.dir / "volumes" / name
            if "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
                self._own(target, recursive=False)
            elif "persistentVolumeClaim" in volume:
                target = self.kubelet.claim_path(self.namespace, volume["persistentVolumeClaim"]["claimName"])
                self._own(target, recursive=True)
            elif "configMap" in volume or "secret" in volume or "projected" in volume:
                target.mkdir(parents=True, exist_ok=True)
                sources = volume["projected"]["sources"] if "projected" in volume else [volume]
                for source in sources:
                    self._project(source, target)
            elif "downwardAPI" in volume:
                target.mkdir(parents=True, exist_ok=True)
                self._project(volume, target)
            else:
                raise ContainerConfigError("UnsupportedVolume", f"volume {name}: type not supported here")
            self.mounts[name] = target

    def _project(self, source: dict[str, Any], target: Path) -> None:
        """ConfigMap, Secret, downward API and service-account token files, world-readable like defaultMode 0644."""
        files: dict[str, bytes] = {}
        if "configMap" in source:
            data = self.kubelet.read_config_map(self.namespace, source["configMap"]["name"])
            files = self._items(source["configMap"], {key: value.encode() for key, value in data.items()})
        elif "secret" in source:
            name = source["secret"].get("secretName") or source["secret"]["name"]
            data = self.kubelet.read_secret(self.namespace, name)
            files = self._items(source["secret"], {key: base64.b64decode(value) for key, value in data.items()})
        elif "downwardAPI" in source:
            for item in source["downwardAPI"]["items"]:
                files[item["path"]] = str(self.field(item["fieldRef"]["fieldPath"])).encode()
        elif "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            files[token["path"]] = self.kubelet.service_account_token(self.pod, token).encode()
        for path, content in files.items():
            file = target / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(content)
            file.chmod(0o644)

    @staticmethod
    def _items(source: dict[str, Any], data: dict[str, bytes]) -> dict[str, bytes]:
        if "items" not in source:
            return data
        return {item["path"]: data[item["key"]] for item in source["items"] if item["key"] in data}

    # --- containers ---------------------------------------------------------------------------------------------

    def field(self, path: str) -> str:
        """A downward-API field of this pod."""
        metadata = self.pod["metadata"]
        fields = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.spec.get("nodeName", ""),
            "spec.serviceAccountName": self.spec.get("serviceAccountName", ""),
            "status.podIP": self.pod_ip,
            "status.hostIP": self.bridge.host_address,
        }
        if path in fields:
            return fields[path]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return metadata.get(match.group(1), {}).get(match.group(2), "")
        raise ContainerConfigError("CreateContainerConfigError", f"fieldRef {path} is not supported")

    def _env(self, container: dict[str, Any], image: images.Image) -> dict[str, str]:
        env = dict(image.env)
        env.update({
            "HOSTNAME": self.spec.get("hostname", self.name),
            "KUBERNETES_SERVICE_HOST": self.bridge.host_address,
            "KUBERNETES_SERVICE_PORT": str(self.kubelet.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.kubelet.api_port),
        })
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self.kubelet.read_config_map(self.namespace, source["configMapRef"]["name"])
            else:
                raw = self.kubelet.read_secret(self.namespace, source["secretRef"]["name"])
                data = {key: base64.b64decode(value).decode() for key, value in raw.items()}
            env.update({prefix + key: value for key, value in data.items()})
        for variable in container.get("env", []):
            env[variable["name"]] = self._env_value(variable, env)
        return env

    def _env_value(self, variable: dict[str, Any], env: dict[str, str]) -> str:
        if "valueFrom" not in variable:
            return expand(variable.get("value", ""), env)
        source = variable["valueFrom"]
        if "fieldRef" in source:
            return self.field(source["fieldRef"]["fieldPath"])
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self.kubelet.read_config_map(self.namespace, ref["name"])[ref["key"]]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return base64.b64decode(self.kubelet.read_secret(self.namespace, ref["name"])[ref["key"]]).decode()
        if "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            resources = next(c for c in self.spec["containers"] if c["name"] == ref.get("containerName", c["name"]))
            kind, resource = ref["resource"].split(".", 1)
            return str(resources.get("resources", {}).get(kind, {}).get(resource, "0"))
        raise ContainerConfigError("CreateContainerConfigError", f"env {variable['name']}: unsupported valueFrom")

    def _security(self, container: dict[str, Any], image: images.Image) -> dict[str, Any]:
        pod_context, context = self.spec.get("securityContext", {}), container.get("securityContext", {})
        uid = context.get("runAsUser", pod_context.get("runAsUser", image.user))
        gid = context.get("runAsGroup", pod_context.get("runAsGroup", uid))
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) and uid == 0:
            raise ContainerConfigError("CreateContainerConfigError", "runAsNonRoot and the image runs as root")
        groups = [gid, *pod_context.get("supplementalGroups", [])]
        if self._fs_group() is not None:
            groups.append(self._fs_group())
        return {"uid": uid, "gid": gid, "groups": groups,
                "readOnlyRootFilesystem": bool(context.get("readOnlyRootFilesystem"))}

    def _launch_spec(self, container: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
        image = images.resolve(container["image"], self.kubelet.state)
        if image is None:
            raise ContainerConfigError("ErrImagePull", f"image {container['image']} has no local stand-in")
        env = self._env(container, image)
        if argv is None:
            command = container.get("command") or image.entrypoint
            args = container.get("args") or ([] if container.get("command") else image.cmd)
            argv = [expand(part, env) for part in (*command, *args)]
        mounts = [{"source": str(source), "target": target, "readOnly": True} for target, source in image.files.items()]
        for mount in container.get("volumeMounts", []):
            source = self.mounts[mount["name"]]
            if mount.get("subPath"):
                source = source / mount["subPath"]
            read_only = bool(mount.get("readOnly"))
            mounts.append({"source": str(source), "target": mount["mountPath"], "readOnly": read_only})
        if any(images.ROOT.is_relative_to(mount["target"]) for mount in mounts):
            # A volume over the checkout's parent (an emptyDir at /tmp with the clone under /tmp) would hide the
            # code and virtualenv that stand in for the image's filesystem: bring them back on top of it.
            mounts.append({"source": str(images.ROOT), "target": str(images.ROOT), "readOnly": True})
        for mount in mounts:
            if not any(Path(mount["target"]).is_relative_to(hidden) for hidden in image.hidden):
                self.kubelet.mount_point(mount["target"], Path(mount["source"]).is_dir())
        return {
            "argv": argv, "env": env, "mounts": mounts, "hidden": image.hidden,
            "hostname": self.spec.get("hostname", self.name)[:63],
            "workingDir": container.get("workingDir", "/tmp"), **self._security(container, image),
        }

    def _popen(self, spec: dict[str, Any], name: str, log_file: Path | None) -> subprocess.Popen:
        spec_file = self.dir / f"{name}.json"
        spec_file.write_text(json.dumps(spec))
        output = log_file.open("ab") if log_file else subprocess.DEVNULL
        return childprocess.popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--uts", sys.executable, str(PODINIT), str(spec_file)],
            on_parent_death=signal.SIGKILL, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def log_path(self, container: Container) -> Path:
        return self.dir / f"{container.name}.log"

    def _start(self, container: Container) -> None:
        try:
            spec = self._launch_spec(container.spec)
        except ContainerConfigError as error:
            container.waiting = (error.reason, str(error))
            container.restart_at = time.monotonic() + 5
            return
        except KeyError as error:
            container.waiting = ("CreateContainerConfigError", f"missing {error}")
            container.restart_at = time.monotonic() + 5
            return
        container.process = self._popen(spec, container.name, self.log_path(container))
        container.started_at, container.started_time = time.monotonic(), now()
        container.waiting, container.exit, container.ready = None, None, False
        container.started = "startupProbe" not in container.spec
        container.probes = {
            kind: Probe(container.spec[kind]) for kind in ("startupProbe", "livenessProbe", "readinessProbe")
            if kind in container.spec
        }

    def _restartable(self, container: Container, code: int) -> bool:
        policy = self.spec.get("restartPolicy", "Always")
        if container.init:
            return policy != "Never" and code != 0
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _on_exit(self, container: Container) -> None:
        assert container.process is not None
        code = _exit_code(container.process)
        container.exit = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                          "startedAt": container.started_time, "finishedAt": now()}
        container.process, container.ready, container.started = None, False, False
        if self._restartable(container, code) and not self.stop_requested.is_set():
            container.last_exit, container.exit = container.exit, None
            container.restarts += 1
            delay = min(10 * 2 ** (container.restarts - 1), 60)
            container.waiting = ("CrashLoopBackOff", f"back-off {delay}s restarting failed container")
            container.restart_at = time.monotonic() + delay

    def _step(self) -> None:
        pending_init = next((c for c in self.init_containers if not (c.exit and c.exit["exitCode"] == 0)), None)
        if pending_init is not None:
            self._drive(pending_init)
            if pending_init.exit and pending_init.exit["exitCode"] != 0:
                self.phase = "Failed"
            return
        for container in self.containers:
            self._drive(container)
        if any(c.running or c.exit is None for c in self.containers):
            self.phase = "Running" if any(c.running or c.restarts for c in self.containers) else "Pending"
        else:
            self.phase = "Succeeded" if all(c.exit["exitCode"] == 0 for c in self.containers) else "Failed"

    def _drive(self, container: Container) -> None:
        if container.process is not None and container.process.poll() is not None:
            self._on_exit(container)
        if container.process is None and container.exit is None and time.monotonic() >= container.restart_at:
            self._start(container)
        # Not while its zone is cut: the kubelet of a cut zone still reaches its own pods, but these probes go from
        # the host over the pod's link the cut took down (they restarted the zone's bookies mid-cut).
        if container.running and not self.kubelet.cut_off(self):
            self._probe(container)

    # --- probes -------------------------------------------------------------------------------------------------

    def _probe(self, container: Container) -> None:
        startup = container.probes.get("startupProbe")
        if startup and not container.started:
            if startup.due(container.started_at):
                startup.record(self._check(container, startup.spec))
                container.started = startup.passed
                if startup.failed:
                    self._restart(container, "startup probe failed")
            return
        liveness = container.probes.get("livenessProbe")
        if liveness and liveness.due(container.started_at):
            liveness.record(self._check(container, liveness.spec))
            if liveness.failed:
                self._restart(container, "liveness probe failed")
                return
        readiness = container.probes.get("readinessProbe")
        if readiness is None:
            container.ready = container.started
        elif readiness.due(container.started_at):
            readiness.record(self._check(container, readiness.spec))
            container.ready = readiness.passed or (container.ready and not readiness.failed)

    def _restart(self, container: Container, why: str) -> None:
        log.info("pod %s/%s container %s: %s, restarting", self.namespace, self.name, container.name, why)
        self._terminate(container, self.grace)

    def _port(self, container: Container, port: int | str) -> int:
        if isinstance(port, int):
            return port
        return next(p["containerPort"] for p in container.spec.get("ports", []) if p.get("name") == port)

    def _check(self, container: Container, probe: dict[str, Any]) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                url = f"http://{self.pod_ip}:{self._port(container, get['port'])}{get.get('path', '/')}"
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    return 200 <= response.status < 400
            if "tcpSocket" in probe:
                port = self._port(container, probe["tcpSocket"]["port"])
                with socket.create_connection((self.pod_ip, port), timeout=timeout):
                    return True
            if "exec" in probe:
                spec = self._launch_spec(container.spec, argv=probe["exec"]["command"])
                process = self._popen(spec, f"{container.name}-probe", None)
                try:
                    return process.wait(timeout) == 0
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    return False
        except (OSError, ValueError, StopIteration, ContainerConfigError):
            return False
        return False

    # --- stopping -----------------------------------------------------------------------------------------------

    @staticmethod
    def _kill(container: Container, signum: int) -> None:
        if container.process is not None and container.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container.process.pid, signum)

    def _terminate(self, container: Container, grace: float) -> None:
        """SIGTERM, then SIGKILL after the grace period."""
        self._kill(container, signal.SIGTERM)
        if container.process is not None:
            try:
                container.process.wait(grace)
            except subprocess.TimeoutExpired:
                self._kill(container, signal.SIGKILL)
                container.process.wait()
            self._on_exit(container)

    def _stop_all(self, grace: float) -> None:
        running = [c for c in (*self.init_containers, *self.containers) if c.process is not None]
        for container in running:
            self._kill(container, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for container in running:
            assert container.process is not None
            try:
                container.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(container, signal.SIGKILL)
                container.process.wait()
            self._on_exit(container)

    def kill_now(self) -> None:
        """Node failure: every process dies at once, no grace, no status report."""
        for container in (*self.init_containers, *self.containers):
            self._kill(container, signal.SIGKILL)
        self.kubelet = _Detached(self.kubelet)
        self.stop_requested.set()

    # --- status -------------------------------------------------------------------------------------------------

    def _container_status(self, container: Container) -> dict[str, Any]:
        if container.running:
            state: dict[str, Any] = {"running": {"startedAt": container.started_time}}
        elif container.exit is not None:
            state = {"terminated": container.exit}
        else:
            reason, message = container.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        status = {
            "name": container.name, "image": container.spec["image"], "imageID": "",
            "containerID": f"process://{container.process.pid}" if container.running and container.process else "",
            "ready": container.ready, "started": container.running and container.started,
            "restartCount": container.restarts, "state": state, "lastState": {},
        }
        if container.last_exit:
            status["lastState"] = {"terminated": container.last_exit}
        return status

    def status(self) -> dict[str, Any]:
        initialized = all(c.exit and c.exit["exitCode"] == 0 for c in self.init_containers)
        ready = self.phase == "Running" and all(c.ready for c in self.containers)

        def condition(kind: str, value: bool) -> dict[str, Any]:
            return {"type": kind, "status": "True" if value else "False"}

        status = {
            "phase": self.phase,
            "hostIP": self.bridge.host_address,
            "hostIPs": [{"ip": self.bridge.host_address}],
            "conditions": [
                condition("PodReadyToStartContainers", bool(self.pod_ip)),
                condition("Initialized", initialized),
                condition("ContainersReady", ready),
                condition("Ready", ready),
                condition("PodScheduled", True),
            ],
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [self._container_status(c) for c in self.init_containers]
        if self.pod_ip:
            status["podIP"], status["podIPs"] = self.pod_ip, [{"ip": self.pod_ip}]
        if self.eviction is not None:
            status["reason"], status["message"] = "Evicted", self.eviction
        return status

    def _report(self) -> None:
        status = self.status()
        if status == self.last_status:
            return
        stamped = json.loads(json.dumps(status))
        for item in stamped["conditions"]:
            item["lastTransitionTime"] = now()
        if self.kubelet.report_status(self, stamped):
            self.last_status = status
            self.kubelet.pod_changed()


class _Detached:
    """What a worker on a failed node talks to: nothing reaches the API server any more."""

    def __init__(self, kubelet: Any) -> None:
        self._kubelet = kubelet

    def report_status(self, *_: Any) -> bool:
        return True

    def pod_changed(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kubelet, name)
