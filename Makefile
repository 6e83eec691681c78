# Two commands matter: `make run` and `make test`. Both set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# checkov (the manifest security scan in `make test`) in a virtualenv of its own (its pins clash with pytest's),
# built once per version outside the clone, like the Kubernetes binaries.
CHECKOV_VERSION := 3.3.30
CHECKOV_HOME := $(HOME)/.cache/bookfleet/checkov-$(CHECKOV_VERSION)
CHECKOV_STAMP := $(CHECKOV_HOME)/.installed

.PHONY: setup lock images run test test-cluster kube-binaries promtool bookkeeper-reference pulsar-broker pulsar-demo bench-bookkeeper cluster cluster-demo cluster-node-failure cluster-zone-loss cluster-zone-partition cluster-pulsar chaos floors bench lint crds clean

setup: $(STAMP)

# constraints.txt pins every package of this venv and of the images; `make lock` rewrites it from the venv.
# The package's C extensions are compiled by its install (setup.py): a changed source installs again.
$(STAMP): pyproject.toml setup.py constraints.txt $(wildcard bookfleet/*.c)
	@bash scripts/setup-system.sh
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]' -c constraints.txt
	@touch $(STAMP)

lock:
	$(PY) -m pip install -q -e '.[dev]' --upgrade
	{ echo "# Every Python package of the dev venv and the images, pinned (make lock writes it from the dev venv; a test checks)."; \
	  $(PY) -m pip freeze --exclude-editable; } > constraints.txt

# The bookie, operator and repair images from their Dockerfiles (buildah, local Debian base), once per content hash.
images: setup
	scripts/build-images.sh

$(CHECKOV_STAMP):
	python3 -m venv $(CHECKOV_HOME)
	$(CHECKOV_HOME)/bin/pip install -q checkov==$(CHECKOV_VERSION)
	@touch $(CHECKOV_STAMP)

run: setup
	$(VENV)/bin/bookfleet demo

# Three workers on two cores: most tests wait on processes, timeouts and disks, not the CPU; the cluster tier stays
# on one worker (conftest), and the other two share the rest.
TEST_WORKERS ?= 3

test: setup $(CHECKOV_STAMP) kube-binaries promtool bookkeeper-reference pulsar-broker
	$(VENV)/bin/ruff check bookfleet tests
	$(VENV)/bin/lint-imports
	BOOKFLEET_REQUIRE_SCAN=1 BOOKFLEET_CHECKOV=$(CHECKOV_HOME)/bin/checkov $(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=40

# The local Kubernetes cluster (tests/cluster): built once per pinned version into ~/.cache/bookfleet/kube-<v>/, with
# the kubelet and kube-proxy of its real node (containerd) and CoreDNS.
REAL_NODE_BINARIES := kubelet kube-proxy coredns
kube-binaries:
	@if command -v go >/dev/null; then scripts/build-kube.sh $(REAL_NODE_BINARIES) >/dev/null; \
	else echo "no Go toolchain: the cluster tier will be skipped"; fi

# Prometheus' promtool, for the chart's alert rule tests (tests/deploy/test_alerts.py): once per pinned version.
promtool:
	@if command -v go >/dev/null; then scripts/build-promtool.sh >/dev/null; \
	else echo "no Go toolchain: the alert rule tests will be skipped"; fi

# Apache BookKeeper's Java bookies and client, the reference of `bookfleet bench bookkeeper`: jars fetched with Maven
# once per pinned version into ~/.cache/bookfleet/bookkeeper-<v>/ (cold: about 2 min), the bench compiled beside them.
bookkeeper-reference:
	@bash scripts/build-bookkeeper.sh >/dev/null

# Apache Pulsar's broker (tests/pulsar: a real broker keeping its topics on a bookfleet fleet): its jars fetched with
# Maven once per pinned version into ~/.cache/bookfleet/pulsar-<v>/ (cold: a few minutes, about 250 MB).
pulsar-broker:
	@if command -v mvn >/dev/null && command -v java >/dev/null; then bash scripts/build-pulsar.sh >/dev/null; \
	else echo "no JDK (java, mvn): the Pulsar broker tests will be skipped"; fi

# A Pulsar broker on a 4-bookie standalone fleet: a partitioned topic produced while a bookie is killed -9 and
# auto-recovery repairs it, consumed back, each message found in the ledger entry bookfleet stores (JSON figures).
pulsar-demo: setup pulsar-broker
	$(PY) -m tests.pulsar

# The cluster tier with its long forms (BOOKFLEET_CLUSTER_LONG: scenarios of minutes each that `make test` skips,
# among them a bookie image on the real node). The zone loss, on a cluster of its own, is in `make chaos`.
test-cluster: setup kube-binaries
	BOOKFLEET_CLUSTER_LONG=1 $(VENV)/bin/pytest -q -p no:cacheprovider -m "cluster and not chaos"

cluster: setup
	$(PY) -m tests.cluster

# The lost-bookie walkthrough (docs/operating.md) on its own local cluster (the same steps as the cluster tier's repair test).
cluster-demo: setup kube-binaries
	$(PY) -m tests.cluster.walkthrough

# A bookie's node fails on its own local cluster: seconds to Lost, to the repair Job, to a healthy Ledger (JSON).
cluster-node-failure: setup kube-binaries
	$(VENV)/bin/bookfleet bench operator --node-failure --json

cluster-zone-loss: setup kube-binaries
	$(VENV)/bin/bookfleet bench operator --zone-loss --json

# The partition variant: the zone's pods run on, cut off from the rest and ZooKeeper, a writer inside it (JSON).
cluster-zone-partition: setup kube-binaries
	$(VENV)/bin/bookfleet bench operator --zone-loss --partition --json

# A Pulsar broker pod (the `pulsar` image, built here only) on the chart's BookieCluster: a bookie pod and its volumes
# deleted while Pulsar's Python client produces, the operator's Spark repair, every message consumed back (JSON).
cluster-pulsar: setup kube-binaries pulsar-broker
	$(PY) -m tests.cluster.pulsarpod

# The history run (tests/chaos/test_chaos_history.py) keeps its histories and porcupine drawings under build/chaos;
# the zone loss (tests/cluster/test_zone_loss.py) runs the cluster tier's long form on a local cluster of its own.
chaos: setup kube-binaries
	BOOKFLEET_CHAOS=long BOOKFLEET_CHAOS_DIR=build/chaos BOOKFLEET_CLUSTER_LONG=1 \
		$(VENV)/bin/pytest -q -s -p no:cacheprovider -m chaos --timeout 36000

floors: setup
	bash scripts/check-floors.sh

bench: setup
	$(VENV)/bin/bookfleet bench bookie --entry-size 1024 --seconds 10 --json
	$(VENV)/bin/bookfleet bench bookie --entry-size 65536 --seconds 10 --json

# Ours against Apache BookKeeper's Java bookies and client, same run, same disk: one JSON line per scenario. The
# bookie matrix (the same Java client on either bookie) at 5 s per phase keeps the whole under about 25 minutes.
bench-bookkeeper: setup bookkeeper-reference
	$(VENV)/bin/bookfleet bench bookkeeper --json
	$(VENV)/bin/bookfleet bench bookkeeper --matrix --seconds 5 --json
	$(VENV)/bin/bookfleet bench bookkeeper --recovery --json

lint: setup
	$(VENV)/bin/ruff check bookfleet tests
	$(VENV)/bin/lint-imports

crds: setup
	$(VENV)/bin/bookfleet crds --out crds --chart charts/bookfleet/crds

clean:
	rm -rf $(VENV) build *.egg-info
