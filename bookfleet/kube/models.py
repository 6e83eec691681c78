"""The custom resources (group bookfleet.io, version v1alpha1), defined once: the CRDs are generated from these.

Python sees snake_case, Kubernetes sees camelCase. Specs reject unknown fields (a typo is an error, not a silent
default); statuses ignore them, because kopf keeps its own bookkeeping in status too. Rules the schema can express
carry a CEL twin in `x-kubernetes-validations`, so the API server rejects what these models reject.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from bookfleet import spark
from bookfleet.wire import DigestType

GROUP = "bookfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

Quantity = Annotated[int | str, Field(description="a Kubernetes quantity, e.g. 10Gi or 500m")]
"""Kubernetes accepts `cpu: 1` and `memory: 1Gi` alike, so quantities are int-or-string."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Secret's name: checked where it is written, since a wrong one would fail only in a pod volume or a repair's
Spark setting."""


def _unique(items: list[str]) -> list[str]:
    duplicates = sorted({item for item in items if items.count(item) > 1})
    if duplicates:
        raise ValueError(f"duplicate entries: {', '.join(duplicates)}")
    return items


ZoneList = Annotated[
    list[str],
    AfterValidator(_unique),
    Field(json_schema_extra={"x-kubernetes-list-type": "set"}),
]
"""A set of zone names (topology.kubernetes.io/zone values); duplicates are rejected by both sides."""


def _validations(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL rules for the generated schema: (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class KubeModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown spec fields are errors."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase form for the Kubernetes API (unset optional fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(KubeModel):
    model_config = ConfigDict(extra="ignore")


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A Kubernetes-style condition: one aspect of the resource, when it last changed and why."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: dt.datetime | None = None


Conditions = Annotated[
    list[Condition],
    Field(json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
]
"""At most one condition per type; server-side apply merges them by type."""


def set_condition(conditions: list[Condition], new: Condition, now: dt.datetime | None = None) -> list[Condition]:
    """Conditions with `new` in place of its type; lastTransitionTime moves only when the status changes."""
    now = now or dt.datetime.now(dt.UTC)
    old = next((c for c in conditions if c.type == new.type), None)
    changed = old is None or old.status != new.status
    since = now if changed or old.last_transition_time is None else old.last_transition_time
    placed = new.model_copy(update={"last_transition_time": since})
    return [c for c in conditions if c.type != new.type] + [placed]


class ObjectMeta(BaseModel):
    """The part of metadata the operator reads; the API server's other fields pass through untouched."""

    model_config = ConfigDict(extra="ignore")

    name: str
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class CustomResource(KubeModel):
    """Common shape of the three resources; class variables name them for the CRD and for kopf."""

    kind_name: ClassVar[str]
    plural: ClassVar[str]
    short_names: ClassVar[tuple[str, ...]]

    api_version: str = API_VERSION
    kind: str
    metadata: ObjectMeta

    @classmethod
    def singular(cls) -> str:
        return cls.kind_name.lower()

    @classmethod
    def crd_name(cls) -> str:
        return f"{cls.plural}.{GROUP}"


# --- BookieCluster -------------------------------------------------------------------------------------------


def _whole_default(default: KubeModel) -> Any:
    """A field defaulting to a whole object, the same in Python and in the CRD (the API server fills it only when
    the field is left out; its own field defaults, if different, never leak in)."""
    return Field(
        default_factory=lambda: default.model_copy(deep=True), json_schema_extra={"default": default.to_wire()}
    )


KubeObject = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]
"""A Kubernetes object kept as written (an Affinity, a Toleration): the API server validates it in the pod."""


class PodOverrides(KubeModel):
    """Scheduling, identity and pull settings merged into pods the operator (or Spark) builds. Labels and annotations
    are added (the operator's own win: selectors rely on them); tolerations are added; affinity terms are added to the
    operator's (zone pinning and bookie spreading stay); the rest is set."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[KubeObject] | None = None
    affinity: KubeObject | None = None
    priority_class_name: str | None = None
    image_pull_secrets: list[str] | None = Field(None, description="names of Secrets in the namespace")
    service_account_name: str | None = Field(None, pattern=DNS_LABEL)


class Volume(KubeModel):
    """A PersistentVolumeClaim request; no storageClassName means the cluster's default class."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            ("(has(self.storageClassName) ? self.storageClassName : '') == "
             "(has(oldSelf.storageClassName) ? oldSelf.storageClassName : '')",
             "storageClassName is immutable: a claim keeps the class it was made with, so existing bookies would "
             "stay on the old one; move to a new class with a new BookieCluster"),
        )
    )

    size: Quantity = "10Gi"
    storage_class_name: str | None = Field(None, description="immutable: the claims keep the class they were made with")


class Storage(KubeModel):
    """Journal and ledger directories on separate volumes: the journal's fsyncs never queue behind compaction."""

    journal: Volume = _whole_default(Volume(size="2Gi"))
    ledgers: Volume = Field(default_factory=Volume)


class ResourceRequirements(KubeModel):
    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


def _resources_default(requests: dict[str, Quantity], limits: dict[str, Quantity]) -> Any:
    """Requests and limits as one default, so a user's own requests never mix with default limits they exceed."""
    return _whole_default(ResourceRequirements(requests=requests, limits=limits))


class AntiAffinity(enum.StrEnum):
    """How strongly bookies of one cluster avoid sharing a node."""

    REQUIRED = "required"
    PREFERRED = "preferred"
    NONE = "none"


BOOKIE_CONFIG_KEYS = (
    "admission-cache-ledgers", "compaction-live-ratio", "disk-check-interval", "disk-usage-recovery-limit",
    "entrylog-roll-bytes", "event-loop", "flush-interval", "gc-grace", "idle-timeout", "journal-flush-bytes",
    "journal-max-wait", "journal-roll-bytes", "max-add-bytes", "max-connection-add-bytes", "max-connections",
    "max-in-flight", "max-long-polls", "max-pending-response-bytes", "memtable-bytes", "quarantine-bytes",
    "zk-session-timeout",
)
"""The `bookfleet bookie` flags spec.bookie.config may set: all of them but those the operator sets itself (identity,
addresses, directories, ZooKeeper, zone, TLS, the settings above) and --no-verify-ledgers and --http-tls (ledger
squatting; probes over plain HTTP). The operator may not import the bookie, so the list is written here and a test
holds it to the bookie's flags."""


def _known_bookie_settings(config: dict[str, str]) -> dict[str, str]:
    unknown = sorted(set(config) - set(BOOKIE_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown bookie settings {', '.join(unknown)} (known: {', '.join(BOOKIE_CONFIG_KEYS)})")
    return config


BookieConfigMap = Annotated[
    dict[str, Annotated[str, Field(max_length=256)]],
    AfterValidator(_known_bookie_settings),
    Field(json_schema_extra={"maxProperties": len(BOOKIE_CONFIG_KEYS), **_validations(
        (f"self.all(key, key in {list(BOOKIE_CONFIG_KEYS)})",
         "config keys must be bookie settings the operator does not set itself: " + ", ".join(BOOKIE_CONFIG_KEYS)))}),
]
"""At most one value per known key (maxProperties also bounds the CEL rule's cost)."""


class BookieSettings(KubeModel):
    """Flags every bookie of the cluster is started with."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            ("self.diskUsageLwm < self.diskUsageThreshold", "diskUsageLwm must be below diskUsageThreshold"),
            ("self.port != self.httpPort", "port and httpPort must differ"),
            ("self.port == oldSelf.port", "bookie.port is immutable: every bookie's id, in ZooKeeper and in every "
             "ledger's ensemble, includes it"),
        )
    )

    port: int = Field(3181, ge=1, le=65535, description="immutable: part of every bookie's id")
    http_port: int = Field(8000, ge=1, le=65535)
    disk_usage_threshold: float = Field(0.95, gt=0, le=1, description="above this usage the bookie turns read-only")
    disk_usage_lwm: float = Field(0.90, gt=0, le=1, description="below this usage a read-only bookie is writable again")
    gc_interval_seconds: int = Field(60, ge=1)
    extra_args: list[str] = Field(default_factory=list, description="appended to the bookie command line")
    config: BookieConfigMap = Field(
        default_factory=dict, description="more bookie settings by their flag names (bookfleet bookie --help), e.g. "
        "journal-max-wait: \"0.002\"; a change rolls the bookies like any other"
    )

    @model_validator(mode="after")
    def _check(self) -> BookieSettings:
        if self.disk_usage_lwm >= self.disk_usage_threshold:
            raise ValueError(
                f"diskUsageLwm {self.disk_usage_lwm} must be below diskUsageThreshold {self.disk_usage_threshold}"
            )
        if self.port == self.http_port:
            raise ValueError(f"port and httpPort must differ (both {self.port})")
        return self


class RepairLauncher(enum.StrEnum):
    JOB = "job"
    SPARK_APPLICATION = "sparkapplication"


class RepairSpec(KubeModel):
    """How a repair runs: a Job running spark-submit on Spark's Kubernetes scheduler, or a SparkApplication."""

    launcher: RepairLauncher = RepairLauncher.JOB
    executors: int = Field(2, ge=1)
    executor_memory: str = Field("1g", pattern=r"^[0-9]+[kmgtKMGT]?$", description="Spark memory, e.g. 1g or 512m")
    throttle_mb_per_s: float = Field(0, ge=0, description="repair bandwidth cap per executor; 0 is unlimited")
    service_account_name: str = Field("bookfleet-repair", pattern=DNS_LABEL)
    image: str = Field(
        "", description="image of repair drivers and their executors (a JRE and pyspark); empty: the repair image of "
        "the operator's own version, so an upgraded operator repairs with the image it ships with"
    )
    backoff_limit: int = Field(3, ge=0, description="retries of a failed repair pod, with Kubernetes' backoff")
    active_deadline_seconds: int = Field(
        3600, ge=60, description="a repair Job still running after this long is failed, and retried as a new attempt"
    )
    executor_cores: int = Field(1, ge=1, description="CPU request and limit of each executor pod")
    local_mode_max_mb: float = Field(
        spark.DEFAULT_LOCAL_MODE_MAX_MB, ge=0, description="a repair planned to copy at most this many MB runs in its "
        "driver pod alone (Spark local mode, executors x executorCores cores) instead of starting executor pods; 0 "
        "starts executors for every repair"
    )
    max_concurrent: int = Field(
        3, ge=1, description="repairs (Jobs or SparkApplications) of this cluster running at once; the repairs of "
        "further lost or draining bookies wait their turn (their Bookie's Repaired condition says RepairQueued), so "
        "a lost zone repairs in waves instead of starting a driver and its executors per bookie at once"
    )
    ttl_seconds_after_finished: int = Field(
        86400, ge=0, description="a finished repair (Job or SparkApplication) is deleted this long after it ends; "
        "the Bookie's Repaired condition keeps its outcome"
    )
    driver_resources: ResourceRequirements = _resources_default(
        requests={"cpu": "500m", "memory": "1536Mi"}, limits={"cpu": "2", "memory": "2Gi"}
    )
    driver_pod_template: PodOverrides = Field(
        default_factory=PodOverrides, description="the driver pod's settings; its serviceAccountName replaces "
        "serviceAccountName above (that account then needs the repair Role's rules)"
    )
    executor_pod_template: PodOverrides = Field(default_factory=PodOverrides)


class AutoRecoverySpec(KubeModel):
    enabled: bool = True
    lost_bookie_recovery_delay_seconds: int = Field(
        60, ge=0, description="how long a lost bookie may take to come back with its data before repair starts"
    )
    planned_restart_delay_seconds: int = Field(
        600, ge=0, description="how long a bookie drained or evicted through the eviction API, or shut down with its "
        "node, may take to come back with its data before repair starts (when longer than the loss delay)"
    )
    repair: RepairSpec = Field(default_factory=RepairSpec)


class TlsMode(enum.StrEnum):
    OPERATOR = "Operator"
    """The operator runs the cluster's CA and issues and renews certificates into Secrets."""
    CERT_MANAGER = "CertManager"
    """cert-manager Certificates, signed by `certManagerIssuer`, fill the same Secrets."""
    DISABLED = "Disabled"


ClientCertificateNames = Annotated[
    list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]],
    AfterValidator(_unique),
    Field(json_schema_extra={"x-kubernetes-list-type": "set"}),
]
"""Names of client-role certificates (DNS labels); duplicates are rejected by both sides."""


class Security(KubeModel):
    tls: TlsMode = Field(TlsMode.OPERATOR, description="who issues the bookie protocol's mutual-TLS certificates")
    cert_manager_issuer: str | None = Field(None, description="the cert-manager Issuer (kind/name or name) to use")
    certificate_days: int = Field(90, ge=2, description="lifetime of issued certificates")
    renew_before_days: int = Field(30, ge=1, description="renew a certificate this long before it expires")
    zookeeper_auth_secret: str | None = Field(
        None, description="Secret whose key `auth` holds the ZooKeeper digest credential USER:PASSWORD"
    )
    zookeeper_tls_secret: str | None = Field(
        None, pattern=DNS_SUBDOMAIN, max_length=253, description="kubernetes.io/tls Secret (ca.crt, tls.crt, "
        "tls.key) for TLS to ZooKeeper: every session of the cluster (bookies, repair drivers, the operator) checks "
        "ZooKeeper's certificate against ca.crt and presents tls.crt, as ZooKeeper's ssl.clientAuth=need asks; "
        "zookeeper must then name ZooKeeper's secureClientPort (absent: plain TCP)"
    )
    client_certificates: ClientCertificateNames = Field(
        default_factory=list, description="client-role certificates kept issued and renewed like the bookies', each "
        "in the Secret <cluster>-tls-client-<name> (ca.crt, tls.crt, tls.key: a client's TLS directory)"
    )


class LabelSelectorRequirement(KubeModel):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(KubeModel):
    """A Kubernetes label selector; empty selects everything."""

    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None


class NetworkPeer(KubeModel):
    """Client pods allowed to reach the bookie port, as a NetworkPolicy peer: pods matching podSelector (all, when
    absent) in namespaces matching namespaceSelector (the cluster's own namespace, when absent)."""

    model_config = ConfigDict(
        json_schema_extra=_validations(("has(self.namespaceSelector) || has(self.podSelector)",
                                        "a client peer needs namespaceSelector or podSelector"))
    )

    namespace_selector: LabelSelector | None = None
    pod_selector: LabelSelector | None = None

    @model_validator(mode="after")
    def _check(self) -> NetworkPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError("a client peer needs namespaceSelector or podSelector")
        return self


class NetworkPolicySpec(KubeModel):
    """The cluster's NetworkPolicies (bookie port and repair pods). Always admitted: the cluster's own pods, the
    operator, and pods of the cluster's namespace labelled `bookfleet.io/client: "true"`; `clients` adds others,
    e.g. Pulsar brokers in their own namespace."""

    enabled: bool = Field(True, description="false: the operator creates no NetworkPolicies (and removes its own)")
    clients: list[NetworkPeer] = Field(default_factory=list, description="more peers allowed on the bookie port")


class Retention(enum.StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


class VolumeRetentionPolicy(KubeModel):
    """What becomes of a bookie's volumes, as a StatefulSet's persistentVolumeClaimRetentionPolicy says it.

    whenDeleted: Retain leaves the PVCs when the cluster (or a Bookie) is deleted, so a cluster created again under
    the same name finds its bookies' data; Delete lets them go with it. whenScaled: what happens after a scaled-down
    bookie is drained: Delete removes its PVCs; Retain keeps them until the ordinal is wanted again, when they are
    replaced by fresh ones (the drained data is needed by no ledger, and its cookie is gone from ZooKeeper, so the
    bookie could not start on it)."""

    when_deleted: Retention = Retention.RETAIN
    when_scaled: Retention = Retention.RETAIN


class RolloutSpec(KubeModel):
    """How pods that are not of the current spec are restarted: one bookie at a time, only while every other one is
    ready and registered, and one cluster at a time among the clusters an operator manages."""

    paused: bool = Field(False, description="true: no bookie of this cluster is restarted for a new spec or a new "
                         "operator (a restart already begun is still waited for), and the cluster gives the turn to "
                         "the next one")


class Autoscaling(KubeModel):
    """Bookies that follow their disks: one more when a bookie's ledger volume passes scaleUpDiskUsage, one fewer,
    drained as any scale-down is, when every bookie is under scaleDownDiskUsage and the others would hold its data
    under scaleUpDiskUsage; never two at once, within cooldownSeconds of the last, or outside minReplicas..maxReplicas.
    The operator then owns spec.replicas."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            ("self.minReplicas <= self.maxReplicas", "minReplicas must not be above maxReplicas"),
            ("self.scaleDownDiskUsage < self.scaleUpDiskUsage", "scaleDownDiskUsage must be below scaleUpDiskUsage"),
        )
    )

    min_replicas: int = Field(3, ge=1, description="never fewer bookies (at least the largest ensemble size)")
    max_replicas: int = Field(ge=1, description="never more bookies")
    scale_up_disk_usage: float = Field(
        0.8, gt=0, le=1, description="a bookie whose ledger volume is used this much adds a bookie (below "
        "bookie.diskUsageThreshold, where it turns read-only)"
    )
    scale_down_disk_usage: float = Field(0.4, ge=0, lt=1, description="every bookie used less than this removes one")
    cooldown_seconds: int = Field(600, ge=0, description="no scaling within this long of the last")

    @model_validator(mode="after")
    def _check(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas {self.min_replicas} must not be above maxReplicas {self.max_replicas}")
        if self.scale_down_disk_usage >= self.scale_up_disk_usage:
            raise ValueError(f"scaleDownDiskUsage {self.scale_down_disk_usage} must be below scaleUpDiskUsage "
                             f"{self.scale_up_disk_usage}")
        return self


class BookieClusterSpec(KubeModel):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            ("self.zookeeper == oldSelf.zookeeper", "zookeeper is immutable: every bookie's cookie and every ledger's "
             "metadata live in that ZooKeeper (bookies pointed elsewhere crash-loop on their cookies)"),
        )
    )

    replicas: int = Field(3, ge=1)
    image: str = Field("", description="the bookies' image; empty: the bookie image of the operator's own version "
                       "(an operator upgrade then rolls the bookies onto it, one cluster at a time)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    zookeeper: str = Field(min_length=1, description="ZooKeeper connect string, e.g. zookeeper:2181; immutable")
    storage: Storage = Field(default_factory=Storage)
    resources: ResourceRequirements = _resources_default(
        requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "2", "memory": "2Gi"}
    )
    max_unavailable: int = Field(
        1, ge=0, description="bookies a voluntary disruption (node drain, eviction) may take down at once"
    )
    zones: ZoneList = Field(default_factory=list, description="bookies spread round-robin over these zones")
    anti_affinity: AntiAffinity = AntiAffinity.PREFERRED
    bookie: BookieSettings = Field(default_factory=BookieSettings)
    auto_recovery: AutoRecoverySpec = Field(default_factory=AutoRecoverySpec)
    security: Security = Field(default_factory=Security)
    persistent_volume_claim_retention_policy: VolumeRetentionPolicy = Field(default_factory=VolumeRetentionPolicy)
    pod_template: PodOverrides = Field(default_factory=PodOverrides, description="settings of every bookie pod")
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    rollout_timeout_seconds: int = Field(
        600, ge=30, description="a bookie restarted by a rollout and not ready and registered after this long halts "
        "the rollout (condition RolloutStuck); it is never counted lost"
    )
    autoscaling: Autoscaling | None = Field(
        None, description="scale replicas with the bookies' disk usage (absent: replicas is what the spec says)"
    )


class BookieClusterStatus(StatusModel):
    observed_generation: int | None = Field(None, description="the metadata.generation of the spec this status and the"
                                           " ZooKeeper settings reflect")
    desired_bookies: int | None = None
    ready_bookies: int | None = None
    updated_bookies: int | None = Field(None, description="bookies ready and registered in a pod of the current spec")
    phase: str | None = None
    conditions: Conditions = Field(default_factory=list)


class BookieCluster(CustomResource):
    """A fleet of bookies that keeps every ledger stored on it fully replicated."""

    kind_name: ClassVar[str] = "BookieCluster"
    plural: ClassVar[str] = "bookieclusters"
    short_names: ClassVar[tuple[str, ...]] = ("bkc",)

    kind: Literal["BookieCluster"] = "BookieCluster"
    spec: BookieClusterSpec
    status: BookieClusterStatus = Field(default_factory=BookieClusterStatus)


_VALIDATED_CLUSTERS: dict[tuple[str, str], BookieCluster] = {}


def validated_cluster(body: dict[str, Any]) -> BookieCluster:
    """BookieCluster.model_validate(body), once per version of the object (its uid and resourceVersion): every pass
    of its Bookies and of its 100,000 Ledgers reads it, and a validation, with its defaulted sub-objects copied, cost
    a tenth of a settled Ledger's pass. The model is shared: never changed in place."""
    meta = body.get("metadata") or {}
    key = (meta.get("uid"), meta.get("resourceVersion"))
    if key[0] is None or key[1] is None:
        return BookieCluster.model_validate(body)
    if (cluster := _VALIDATED_CLUSTERS.get(key)) is None:
        if len(_VALIDATED_CLUSTERS) >= 256:  # old versions of a few clusters: forgotten wholesale
            _VALIDATED_CLUSTERS.clear()
        cluster = _VALIDATED_CLUSTERS[key] = BookieCluster.model_validate(body)
    return cluster


# --- Bookie --------------------------------------------------------------------------------------------------


class DesiredState(enum.StrEnum):
    WRITABLE = "Writable"
    READ_ONLY = "ReadOnly"
    DECOMMISSIONED = "Decommissioned"


class BookiePhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    READ_ONLY = "ReadOnly"
    LOST = "Lost"
    DECOMMISSIONING = "Decommissioning"
    DECOMMISSIONED = "Decommissioned"


class BookieSpec(KubeModel):
    cluster: str = Field(min_length=1, description="the BookieCluster this bookie belongs to")
    bookie_id: str = Field(min_length=1, description="stable DNS name and port, the bookie's identity in ZooKeeper")
    zone: str | None = None
    storage: Storage = Field(default_factory=Storage)
    desired_state: DesiredState = DesiredState.WRITABLE


class BookieStatus(StatusModel):
    phase: BookiePhase | None = None
    bookie_id: str | None = None
    pod: str | None = None
    registered: bool | None = None
    ledgers: int | None = None
    disk_usage: float | None = Field(None, description="used fraction of the ledger volume")
    lost_since: dt.datetime | None = None
    conditions: Conditions = Field(default_factory=list)


class Bookie(CustomResource):
    """One bookie of a BookieCluster: its identity, zone and volumes outlive any pod that runs it."""

    kind_name: ClassVar[str] = "Bookie"
    plural: ClassVar[str] = "bookies"
    short_names: ClassVar[tuple[str, ...]] = ("bk",)

    kind: Literal["Bookie"] = "Bookie"
    spec: BookieSpec
    status: BookieStatus = Field(default_factory=BookieStatus)


# --- Ledger --------------------------------------------------------------------------------------------------


class SecretKeyRef(KubeModel):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)


class LedgerSpec(KubeModel):
    """A ledger's replication; immutable once created, because a ledger's quorums are fixed for its life."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            ("self.ensembleSize >= self.writeQuorum", "ensembleSize must be >= writeQuorum"),
            ("self.writeQuorum >= self.ackQuorum", "writeQuorum must be >= ackQuorum"),
            ("self == oldSelf", "a Ledger's spec is immutable: create a new Ledger instead"),
        )
    )

    cluster: str = Field(min_length=1, description="the BookieCluster (same namespace) that stores the ledger")
    ensemble_size: int = Field(3, ge=1)
    write_quorum: int = Field(3, ge=1)
    ack_quorum: int = Field(2, ge=1)
    digest_type: DigestType = DigestType.CRC32C
    password_secret_ref: SecretKeyRef | None = None
    zones: ZoneList = Field(default_factory=list, description="place the ensemble in these zones only")
    ledger_id: int | None = Field(None, ge=0, description="adopt this existing ledger instead of creating one")

    @model_validator(mode="after")
    def _check_quorums(self) -> LedgerSpec:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum:
            raise ValueError(
                f"ensembleSize {self.ensemble_size} >= writeQuorum {self.write_quorum} >= "
                f"ackQuorum {self.ack_quorum} does not hold"
            )
        return self


class SegmentStatus(StatusModel):
    """The ensemble (bookie ids) that holds the ledger's entries from firstEntryId on."""

    first_entry_id: int
    bookies: list[str]
    write_sets_sharing_a_zone: int | None = Field(
        None, description="write sets holding two replicas in one zone (after a zone was lost and repaired onto the "
                          "zones left); absent when the cluster has no zones")


class UnderReplicationStatus(StatusModel):
    missing_bookies: list[str] = Field(default_factory=list)
    since: dt.datetime | None = None


class RepairState(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class RepairStatus(StatusModel):
    job: str | None = None
    bookie_id: str | None = Field(None, description="the lost bookie whose ledgers the repair copies elsewhere")
    state: RepairState | None = None
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    attempts: int | None = None


class LedgerStatus(StatusModel):
    ledger_id: int | None = None
    state: str | None = Field(None, description="the state in the ledger's metadata (OPEN, IN_RECOVERY, CLOSED)")
    last_entry_id: int | None = None
    length: int | None = None
    segments: list[SegmentStatus] = Field(default_factory=list)
    under_replicated: UnderReplicationStatus | None = None
    repair: RepairStatus | None = None
    conditions: Conditions = Field(default_factory=list, description="includes DataLoss when entries are lost")


class Ledger(CustomResource):
    """A ledger stored on a BookieCluster, with its replication health and repairs."""

    kind_name: ClassVar[str] = "Ledger"
    plural: ClassVar[str] = "ledgers"
    short_names: ClassVar[tuple[str, ...]] = ("ldg",)

    kind: Literal["Ledger"] = "Ledger"
    spec: LedgerSpec
    status: LedgerStatus = Field(default_factory=LedgerStatus)


# --- what the schema cannot reject ------------------------------------------------------------------------------

VALID = "Valid"
"""Condition type that reports the problems below; the operator sets it on BookieClusters and Ledgers."""
DATA_LOSS = "DataLoss"
"""Condition type of a Ledger some of whose entries no replica holds any more."""


def zone_of(ordinal: int, zones: list[str]) -> str | None:
    """Bookies are spread round-robin over the cluster's zones, by ordinal."""
    return zones[ordinal % len(zones)] if zones else None


def cluster_problems(spec: BookieClusterSpec) -> list[str]:
    """Problems of a schema-valid BookieCluster spec, each a sentence a user can act on."""
    problems = []
    security = spec.security
    if security.tls == TlsMode.CERT_MANAGER and not security.cert_manager_issuer:
        problems.append("security.tls CertManager needs security.certManagerIssuer")
    if security.renew_before_days >= security.certificate_days:
        problems.append(
            f"security.renewBeforeDays ({security.renew_before_days}) must be less than certificateDays "
            f"({security.certificate_days})"
        )
    if spec.zones and spec.autoscaling and spec.autoscaling.min_replicas < len(spec.zones):
        problems.append(f"autoscaling.minReplicas {spec.autoscaling.min_replicas} cannot cover {len(spec.zones)} zones")
    if spec.zones and spec.replicas < len(spec.zones):
        empty = spec.zones[spec.replicas :]
        problems.append(
            f"replicas {spec.replicas} cannot cover {len(spec.zones)} zones: {', '.join(empty)} would have no bookie"
        )
    return problems


def ledger_problems(spec: LedgerSpec, cluster: BookieClusterSpec | None) -> list[str]:
    """Problems of a schema-valid Ledger spec against the cluster it names (None: the cluster does not exist)."""
    if cluster is None:
        return [f"BookieCluster {spec.cluster!r} does not exist in this namespace"]
    problems = []
    if spec.ensemble_size > cluster.replicas:
        problems.append(
            f"ensembleSize {spec.ensemble_size} is larger than BookieCluster {spec.cluster!r} "
            f"({cluster.replicas} bookies)"
        )
    if not cluster.zones:  # its bookies take their nodes' zones: creation waits for enough of them in the Ledger's
        return problems
    unknown = [zone for zone in spec.zones if zone not in cluster.zones]
    if unknown:
        problems.append(f"zones {', '.join(unknown)} are not zones of BookieCluster {spec.cluster!r}")
    elif spec.zones:
        in_zones = sum(zone_of(ordinal, cluster.zones) in spec.zones for ordinal in range(cluster.replicas))
        if spec.ensemble_size > in_zones:
            problems.append(
                f"ensembleSize {spec.ensemble_size} is larger than the {in_zones} bookies "
                f"in zones {', '.join(spec.zones)}"
            )
    return problems


def validity_condition(problems: list[str]) -> Condition:
    """The Valid condition for a list of problems: True when there are none."""
    if not problems:
        return Condition(type=VALID, status=ConditionStatus.TRUE, reason="SpecValid", message="")
    return Condition(type=VALID, status=ConditionStatus.FALSE, reason="InvalidSpec", message="; ".join(problems))


RESOURCES: tuple[type[CustomResource], ...] = (BookieCluster, Bookie, Ledger)
