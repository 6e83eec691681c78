"""The Spark repair of a lost bookie's ledgers as Kubernetes objects: the Job whose pod is Spark's driver in
client mode (or a SparkApplication for the Spark operator), the executor pod template, the driver's account."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from bookfleet import spark
from bookfleet.kube.models import (
    Bookie,
    BookieCluster,
    PodOverrides,
    ResourceRequirements,
)
from bookfleet.kube.resources.images import repair_image
from bookfleet.kube.resources.names import (
    ANNOTATION_BOOKIE_ID,
    ANNOTATION_LOST_SINCE,
    APP,
    LABEL_COMPONENT,
    LABEL_NAME,
    REPAIR,
    TLS_DIR,
    ZK_AUTH_KEY,
    ZK_TLS_DIR,
    hashed_name,
    labels,
    mount_zookeeper_tls,
    object_metadata,
    owned_by,
    quantity_bytes,
    repair_name,
    replicator_secret_name,
    security_env,
    tls_enabled,
    tls_mount,
    tls_volume,
    utc_seconds,
)
from bookfleet.kube.resources.pods import (
    SCRATCH,
    container_security_context,
    pod_security_context,
    scratch_volume,
    with_overrides,
)
from bookfleet.meta.zk import ZK_AUTH_ENV, ZK_TLS_DIR_ENV
from bookfleet.security.tls import TLS_DIR_ENV

EXECUTOR_CONTAINER = "executor"
EXECUTOR_TEMPLATE_DIR = "/etc/bookfleet/spark"
EXECUTOR_TEMPLATE_FILE = "executor-pod-template.yaml"
EXECUTOR_TEMPLATE_PREFIX = "bookfleet-repair-executor"
"""The ConfigMap holding the pod template Spark's driver gives every executor pod (see executor_template_name)."""

K8S_MASTER = "k8s://https://kubernetes.default.svc"
REPAIR_JOB = "spark_repair"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
METRICS_PORT = 9464
"""The driver's bookfleet_repair_* counters (container port `metrics`, scraped by the chart's repair PodMonitor)."""
METRICS_LINGER_S = 120.0
"""A driver something scraped during its run waits at most this long for one more scrape after it, so its last
counts are not lost (replication.metricsserver); one nothing scraped ends at once."""
METRICS_CONTAINER_PORT = {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
EXECUTOR_PREFIX_MAX = 47
"""Spark refuses longer executor pod name prefixes."""

REPAIR_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete", "deletecollection"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "delete", "deletecollection"],
    },
]
"""What Spark's driver in client mode does in its namespace: create, watch, label and delete its executor pods, and
create and delete their config map. No services (only a cluster-mode driver has one; the driver is told not to
delete any) and no volumes (executors mount none). RBAC cannot tell an executor pod from a bookie: the chart's
admission policy lets the repair account change or delete only pods labelled as repair pods."""



def driver_lock_wait(cluster: BookieCluster) -> float:
    """The driver's --lock-wait-s: the default, but at most half the Job's activeDeadlineSeconds, so a driver waiting
    for another repair's locks ends by itself (the Job Succeeded, what is still locked left marked for the next
    attempt) rather than being failed by Kubernetes mid-wait."""
    return min(spark.DEFAULT_LOCK_WAIT_S, cluster.spec.auto_recovery.repair.active_deadline_seconds / 2)


def _submit_parts(cluster: BookieCluster, ledgers: Iterable[int]) -> tuple[list[str], str, list[str]]:
    """spark-submit's options, application file and application arguments, as the Spark module builds them."""
    repair, image = cluster.spec.auto_recovery.repair, repair_image(cluster)
    argv = spark.spark_submit_options(
        K8S_MASTER,
        cluster.spec.zookeeper,
        ledgers,
        executors=repair.executors,
        executor_memory=repair.executor_memory,
        throttle_mb_s=repair.throttle_mb_per_s or None,
        image=image,
        job=REPAIR_JOB,
        lock_wait_s=driver_lock_wait(cluster),
        local_max_mb=repair.local_mode_max_mb,
        local_cores=repair.executors * repair.executor_cores,
    )
    app = argv.index(spark.app_path(REPAIR_JOB, image))
    served = ["--metrics-port", str(METRICS_PORT), "--metrics-linger-s", f"{METRICS_LINGER_S:g}"]
    return argv[:app], argv[app], [*argv[app + 1 :], *served]


def _client_mode(options: list[str]) -> list[str]:
    """The Job's pod is the driver itself, so its exit status is the repair's outcome."""
    options = list(options)
    if "--deploy-mode" in options:
        options[options.index("--deploy-mode") + 1] = "client"
    else:
        options += ["--deploy-mode", "client"]
    return options


_SPARK_ENV = {"driver": "spark.kubernetes.driverEnv", "executor": "spark.executorEnv"}


def _spark_security(cluster: BookieCluster, *pods: str) -> dict[str, str]:
    """Spark settings that give the driver and/or executor pods Spark creates the replicator's TLS directory and
    the ZooKeeper credential, and the driver alone the ZooKeeper TLS directory: executors only copy entries between
    bookies and never open a ZooKeeper session (bookfleet.replication.spark_repair)."""
    settings = {}
    secret = cluster.spec.security.zookeeper_auth_secret
    zookeeper_tls = cluster.spec.security.zookeeper_tls_secret
    for pod in pods:
        if tls_enabled(cluster):
            settings[f"spark.kubernetes.{pod}.secrets.{replicator_secret_name(cluster.metadata.name)}"] = TLS_DIR
            settings[f"{_SPARK_ENV[pod]}.{TLS_DIR_ENV}"] = TLS_DIR
        if secret:
            settings[f"spark.kubernetes.{pod}.secretKeyRef.{ZK_AUTH_ENV}"] = f"{secret}:{ZK_AUTH_KEY}"
    if zookeeper_tls and "driver" in pods:
        settings[f"spark.kubernetes.driver.secrets.{zookeeper_tls}"] = ZK_TLS_DIR
        settings[f"{_SPARK_ENV['driver']}.{ZK_TLS_DIR_ENV}"] = ZK_TLS_DIR
    return settings


def _conf(settings: Mapping[str, str]) -> list[str]:
    return [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]


def repair_command(cluster: BookieCluster, name: str, ledgers: Iterable[int] = ()) -> list[str]:
    """spark-submit in client mode on Spark's Kubernetes scheduler; executors are pods owned by the driver pod."""
    options, app, app_args = _submit_parts(cluster, ledgers)
    executor_labels = labels(cluster.metadata.name, REPAIR)
    kubernetes = {
        "spark.kubernetes.namespace": cluster.metadata.namespace,
        "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
        "spark.kubernetes.executor.podNamePrefix": name[:EXECUTOR_PREFIX_MAX].rstrip("-"),
        "spark.kubernetes.authenticate.caCertFile": f"{SERVICE_ACCOUNT_DIR}/ca.crt",
        "spark.kubernetes.authenticate.oauthTokenFile": f"{SERVICE_ACCOUNT_DIR}/token",
        "spark.kubernetes.container.image.pullPolicy": cluster.spec.image_pull_policy,
        "spark.driver.host": "$(POD_IP)",
        # Spark 4 tells executors the bind address (spark.kubernetes.executor.useDriverPodIP): it must be the pod IP.
        "spark.driver.bindAddress": "$(POD_IP)",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.kubernetes.driver.service.deleteOnTermination": "false",  # a client-mode driver has none
        **{f"spark.kubernetes.executor.label.{key}": value for key, value in executor_labels.items()},
        **_spark_security(cluster, "executor"),
    }
    executors = _executor_conf(cluster.spec.auto_recovery.repair.executor_cores)
    application = app.removeprefix("local://")
    return ["spark-submit", *_client_mode(options), *_conf(kubernetes | executors), application, *app_args]


def _executor_conf(cores: int) -> dict[str, str]:
    """Executor pods from the restricted template, with CPU requested and capped (Spark sets memory itself:
    request = limit = executor memory + overhead)."""
    return {
        "spark.kubernetes.executor.podTemplateFile": f"{EXECUTOR_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_FILE}",
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        "spark.executor.cores": str(cores),
        "spark.kubernetes.executor.request.cores": str(cores),
        "spark.kubernetes.executor.limit.cores": str(cores),
    }


def executor_template_name(cluster: BookieCluster) -> str:
    """Named by its cluster and its content (the cluster's executor settings go into it): a new template gets a new
    ConfigMap, and each cluster has its own, owned by it (deleted with it)."""
    return hashed_name(EXECUTOR_TEMPLATE_PREFIX, cluster.metadata.name, _executor_template_text(cluster))


def _executor_template_text(cluster: BookieCluster) -> str:
    return yaml.safe_dump(executor_pod_template(cluster), sort_keys=False)


def executor_pod_template(cluster: BookieCluster) -> dict[str, Any]:
    """The pod Spark starts each executor from: restricted, no API token (executors never call the API), /tmp, and
    the cluster's executorPodTemplate settings (Spark adds its own labels to these)."""
    metadata: dict[str, Any] = {}
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [
            {"name": EXECUTOR_CONTAINER, "securityContext": container_security_context(), "volumeMounts": [SCRATCH]}
        ],
        "volumes": [scratch_volume()],
    }
    with_overrides(metadata, spec, cluster.spec.auto_recovery.repair.executor_pod_template)
    return {"apiVersion": "v1", "kind": "Pod", **({"metadata": metadata} if metadata else {}), "spec": spec}


def repair_job(
    cluster: BookieCluster, bookie: Bookie, lost_since: dt.datetime, ledgers: Iterable[int] = (), attempt: int = 0
) -> dict[str, Any]:
    """The repair of a lost bookie's ledgers as a Job, owned by the cluster (the Bookie may go before it ends)."""
    name = repair_name(cluster.metadata.name, bookie.metadata.name, lost_since, attempt)
    namespace, repair = cluster.metadata.namespace, cluster.spec.auto_recovery.repair
    job_labels = labels(cluster.metadata.name, REPAIR, bookie.metadata.name)
    downward = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    template = {"name": "executor-template", "mountPath": EXECUTOR_TEMPLATE_DIR, "readOnly": True}
    container = {
        "name": "driver",
        "image": repair_image(cluster),
        "imagePullPolicy": cluster.spec.image_pull_policy,
        "command": repair_command(cluster, name, ledgers),
        "env": downward + security_env(cluster, with_tls_dir=True),
        "ports": [
            {"name": "driver", "containerPort": DRIVER_PORT, "protocol": "TCP"},
            {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"},
            METRICS_CONTAINER_PORT,
        ],
        "resources": repair.driver_resources.to_wire(),
        "volumeMounts": [SCRATCH, template],
        "securityContext": container_security_context(),
    }
    volumes = [scratch_volume(), {"name": template["name"], "configMap": {"name": executor_template_name(cluster)}}]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": repair.service_account_name,
        "automountServiceAccountToken": True,  # the driver creates and watches its executor pods
        "restartPolicy": "Never",
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
    }
    if tls_enabled(cluster):  # the driver's TLS directory: the replicator's certificate
        container["volumeMounts"].append(tls_mount())
        volumes.append(tls_volume(replicator_secret_name(cluster.metadata.name)))
    mount_zookeeper_tls(cluster, container, volumes)
    metadata = object_metadata(name, namespace, job_labels)
    metadata["annotations"] = repair_annotations(bookie, lost_since)
    pod_metadata: dict[str, Any] = {"labels": job_labels}
    with_overrides(pod_metadata, pod_spec, repair.driver_pod_template)
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": repair.backoff_limit,
            "activeDeadlineSeconds": repair.active_deadline_seconds,
            "ttlSecondsAfterFinished": repair.ttl_seconds_after_finished,
            "template": {"metadata": pod_metadata, "spec": pod_spec},
        },
    }
    return owned_by(manifest, cluster)


def repair_annotations(bookie: Bookie, lost_since: dt.datetime) -> dict[str, str]:
    """Which loss a repair answers: the bookie's id and its loss time (the attempts of one loss share both)."""
    return {ANNOTATION_LOST_SINCE: utc_seconds(lost_since).isoformat(), ANNOTATION_BOOKIE_ID: bookie.spec.bookie_id}


def spark_application(
    cluster: BookieCluster, bookie: Bookie, lost_since: dt.datetime, ledgers: Iterable[int] = (), attempt: int = 0
) -> dict[str, Any]:
    """The same repair for clusters running the Spark operator (sparkoperator.k8s.io/v1beta2)."""
    name = repair_name(cluster.metadata.name, bookie.metadata.name, lost_since, attempt)
    repair = cluster.spec.auto_recovery.repair
    options, app, app_args = _submit_parts(cluster, ledgers)
    confs = dict(options[i + 1].split("=", 1) for i, option in enumerate(options) if option == "--conf")
    pod_labels = labels(cluster.metadata.name, REPAIR, bookie.metadata.name)
    metadata = object_metadata(name, cluster.metadata.namespace, pod_labels)
    metadata["annotations"] = repair_annotations(bookie, lost_since)
    manifest = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": metadata,
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": repair_image(cluster),
            "imagePullPolicy": cluster.spec.image_pull_policy,
            "mainApplicationFile": app,
            "arguments": app_args,
            "sparkVersion": spark.SPARK_VERSION,
            "timeToLiveSeconds": repair.ttl_seconds_after_finished,
            "sparkConf": {**confs, **_spark_security(cluster, "driver", "executor")},
            "restartPolicy": {
                "type": "OnFailure",
                "onFailureRetries": repair.backoff_limit,
                "onFailureRetryInterval": 10,
                "onSubmissionFailureRetries": repair.backoff_limit,
                "onSubmissionFailureRetryInterval": 10,
            },
            "driver": _spark_pod(repair.driver_pod_template, pod_labels, {
                **_spark_driver_resources(repair.driver_resources),
                "serviceAccount": repair.service_account_name,
                "ports": [METRICS_CONTAINER_PORT],
            }),
            "executor": _spark_pod(repair.executor_pod_template, pod_labels, {
                "instances": repair.executors,
                "cores": repair.executor_cores,
                "coreLimit": str(repair.executor_cores),
                "memory": repair.executor_memory,
            }),
            "volumes": [scratch_volume()],
        },
    }
    pull_secrets = [*(repair.driver_pod_template.image_pull_secrets or ()),
                    *(repair.executor_pod_template.image_pull_secrets or ())]
    if pull_secrets:
        manifest["spec"]["imagePullSecrets"] = list(dict.fromkeys(pull_secrets))
    return owned_by(manifest, cluster)


def _spark_driver_resources(wanted: ResourceRequirements) -> dict[str, Any]:
    """driverResources as the Spark operator's driver spec says them: the CPU request and limit as given, whole
    cores for Spark's own count, and the memory request as the driver's memory (Spark adds its overhead on top)."""
    requests, limits = wanted.requests, wanted.limits
    cpu = requests.get("cpu", limits.get("cpu", "1"))
    driver: dict[str, Any] = {"cores": max(1, math.ceil(_cpus(cpu))), "coreRequest": str(cpu)}
    if "cpu" in limits:
        driver["coreLimit"] = str(limits["cpu"])
    if memory := requests.get("memory", limits.get("memory")):
        driver["memory"] = f"{quantity_bytes(memory) // 2**20}m"
    return driver


def _cpus(quantity: str | int | float) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


_SPARK_POD_FIELDS = {"nodeSelector": "nodeSelector", "tolerations": "tolerations", "affinity": "affinity",
                     "priorityClassName": "priorityClassName", "serviceAccountName": "serviceAccount"}
"""Pod fields as the Spark operator's driver and executor specs name them (image pull secrets are the
application's)."""


def _spark_pod(overrides: PodOverrides, pod_labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    """A SparkApplication's driver or executor: restricted, /tmp, with the pod overrides merged as for a Job."""
    metadata: dict[str, Any] = {"labels": dict(pod_labels)}
    pod_spec: dict[str, Any] = {}
    with_overrides(metadata, pod_spec, overrides)
    spark_pod = {**spec, **metadata, "podSecurityContext": pod_security_context(),
                 "securityContext": container_security_context(), "volumeMounts": [SCRATCH]}
    spark_pod.update({_SPARK_POD_FIELDS[key]: value for key, value in pod_spec.items() if key in _SPARK_POD_FIELDS})
    return spark_pod


REPAIR_OBJECT_LABELS = {LABEL_NAME: APP, LABEL_COMPONENT: REPAIR}


def repair_namespace_objects(cluster: BookieCluster) -> list[dict[str, Any]]:
    """What the cluster's repair Jobs need in its namespace: its executor pod template and Spark's driver account."""
    return [executor_template(cluster), *repair_account_objects(cluster)]


def executor_template(cluster: BookieCluster) -> dict[str, Any]:
    """The ConfigMap of the executor pod template, the cluster's own (named by its content, owned by the cluster)."""
    return owned_by({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(executor_template_name(cluster), cluster.metadata.namespace, REPAIR_OBJECT_LABELS),
        "data": {EXECUTOR_TEMPLATE_FILE: _executor_template_text(cluster)},
    }, cluster)


def repair_account_objects(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Spark's driver account (ServiceAccount, Role and RoleBinding, limited to the namespace and to REPAIR_RULES).
    Every cluster of the namespace that names the same account shares these objects, so none of them is their
    controller: each adds itself to their owners (`owner_claim`) and they go with the last."""
    namespace, service_account = cluster.metadata.namespace, cluster.spec.auto_recovery.repair.service_account_name
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": object_metadata(service_account, namespace, REPAIR_OBJECT_LABELS)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_metadata(service_account, namespace, REPAIR_OBJECT_LABELS),
            "rules": REPAIR_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_metadata(service_account, namespace, REPAIR_OBJECT_LABELS),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
            "subjects": [subject],
        },
    ]
