"""Every pod the chart, the operator and Spark create passes the `restricted` Pod Security Standard (and runs with a
read-only root filesystem, resources and no API token where it never calls the API).

The rules are the Kubernetes Pod Security Standards, restricted profile (baseline included), as of v1.30; the
real admission plugin runs them on the local-cluster tier, this checks them offline on every rendered or built spec.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from bookfleet.kube import resources

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
NEEDS_API = {"operator", "driver", "delete-cluster"}
"""Containers that call the Kubernetes API (the operator; Spark's driver creating executor pods; the chart's
uninstall hook deleting its BookieCluster)."""


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key, [])


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What in a pod spec the restricted Pod Security profile forbids, one line each."""
    found = []
    pod = spec.get("securityContext", {})
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            found.append(f"{host} is set")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']} is {sorted(kinds)}")
    for sysctl in pod.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']} is not safe")
    if pod.get("runAsUser") == 0:
        found.append("pod runs as user 0")
    pod_seccomp = pod.get("seccompProfile", {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"pod seccompProfile {pod_seccomp}")
    if pod.get("seLinuxOptions", {}).get("type") not in SELINUX_TYPES:
        found.append("pod seLinuxOptions type")
    if pod.get("appArmorProfile", {}).get("type") == "Unconfined":
        found.append("pod appArmorProfile Unconfined")
    for container in _containers(spec):
        name, context = container["name"], container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {capabilities['add']}")
        if context.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            found.append(f"{name}: runs as user 0")
        seccomp = context.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile is {seccomp}, not RuntimeDefault or Localhost")
        if context.get("seLinuxOptions", {}).get("type") not in SELINUX_TYPES:
            found.append(f"{name}: seLinuxOptions type")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount {context['procMount']}")
        if context.get("windowsOptions", {}).get("hostProcess"):
            found.append(f"{name}: hostProcess")
        if context.get("appArmorProfile", {}).get("type") == "Unconfined":
            found.append(f"{name}: appArmorProfile Unconfined")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found


def least_privilege_violations(spec: dict[str, Any], spark_sized: bool = False) -> list[str]:
    """Beyond the profile: read-only root, resources on every container, tokens only where needed.
    `spark_sized`: Spark's executor template, whose resources Spark sets from its confs."""
    found = []
    for container in _containers(spec):
        name = container["name"]
        if container.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: root filesystem is writable")
        if not spark_sized:
            limits = container.get("resources", {}).get("limits", {})
            requests = container.get("resources", {}).get("requests", {})
            if not ({"cpu", "memory"} <= requests.keys() and {"cpu", "memory"} <= limits.keys()):
                found.append(f"{name}: no cpu and memory requests and limits")
    names = {container["name"] for container in _containers(spec)}
    if not names & NEEDS_API and spec.get("automountServiceAccountToken") is not False:
        found.append(f"{sorted(names)}: service-account token mounted but the pod never calls the API")
    return found


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(where, pod spec, sized by Spark) of every pod these objects make, Spark's executor template included."""
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] == "Pod":
            yield where, obj["spec"], False
        elif obj["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"):
            yield where, obj["spec"]["template"]["spec"], False
        elif obj["kind"] == "ConfigMap" and resources.EXECUTOR_TEMPLATE_FILE in obj.get("data", {}):
            template = yaml.safe_load(obj["data"][resources.EXECUTOR_TEMPLATE_FILE])
            yield f"{where} (executor pods)", template["spec"], True


def test_every_pod_passes_the_restricted_profile(shipped_objects) -> None:
    specs = list(pod_specs(shipped_objects))
    kinds = {where.split()[0] for where, _, _ in specs}
    assert kinds == {"Deployment", "StatefulSet", "Pod", "Job", "ConfigMap"}, "operator, ZooKeeper, bookies, repair"
    problems = [f"{where}: {problem}" for where, spec, _ in specs for problem in restricted_violations(spec)]
    assert problems == []


def test_every_pod_has_a_read_only_root_resources_and_no_needless_token(shipped_objects) -> None:
    problems = [
        f"{where}: {problem}"
        for where, spec, spark_sized in pod_specs(shipped_objects)
        for problem in least_privilege_violations(spec, spark_sized)
    ]
    assert problems == []


def test_spark_application_pods_are_restricted_too(shipped_objects) -> None:
    (app,) = [obj for obj in shipped_objects if obj["kind"] == "SparkApplication"]
    for role in ("driver", "executor"):
        pod = app["spec"][role]
        spec = {"securityContext": pod["podSecurityContext"],
                "containers": [{"name": role, "securityContext": pod["securityContext"]}]}
        assert restricted_violations(spec) == []
        assert pod["coreLimit"] and pod["memory"]
        volumes = {volume["name"] for volume in app["spec"]["volumes"]}
        assert {mount["name"] for mount in pod["volumeMounts"]} <= volumes, "read-only root: /tmp is a volume"


@pytest.mark.parametrize(
    "mutation, expected",
    [
        (lambda s: s["securityContext"].pop("seccompProfile"), "seccompProfile is None"),
        (lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True), "PrivilegeEscalation"),
        (lambda s: s["containers"][0]["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}), "drop ALL"),
        (lambda s: s["securityContext"].pop("runAsNonRoot"), "runAsNonRoot"),
        (lambda s: s["volumes"].append({"name": "host", "hostPath": {"path": "/"}}), "hostPath"),
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    ],
)
def test_the_checker_catches_what_the_profile_forbids(mutation, expected, shipped_objects) -> None:
    """The checker itself: each forbidden setting put into an otherwise good bookie pod is reported."""
    (bookie,) = [obj for obj in shipped_objects if obj["kind"] == "Pod" and obj["metadata"]["name"] == "bookfleet-0"]
    spec = yaml.safe_load(yaml.safe_dump(bookie["spec"]))
    assert restricted_violations(spec) == []
    mutation(spec)
    assert any(expected in problem for problem in restricted_violations(spec))
