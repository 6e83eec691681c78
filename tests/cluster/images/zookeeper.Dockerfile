# The local cluster's stand-in for the official `zookeeper` image the chart names (zookeeper.image), which no
# registry serves here: Debian's ZooKeeper jars and a headless JRE behind the same contract - /docker-entrypoint.sh
# with its ZOO_* environment, `zkServer.sh start-foreground`, ZK_SERVER_HEAP, /data, /datalog, /conf and /logs.
# The process kubelet runs the same two scripts from this folder on the host's ZooKeeper; a real node runs this.
# Test tooling: built by `scripts/build-images.sh zookeeper` from the repository root, never shipped.
ARG BASE=docker.io/library/debian:bookworm-slim
FROM ${BASE}
# The JRE's post-install links its manual pages into /usr/share/man/man1, which the slim base leaves out.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless libzookeeper-java \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY tests/cluster/images/zookeeper-entrypoint.sh /docker-entrypoint.sh
COPY tests/cluster/images/zookeeper-bin/zkServer.sh /usr/local/bin/zkServer.sh
# The official image's user and folders (the chart runs it as uid 1000 with a read-only root).
RUN groupadd --gid 1000 zookeeper \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin zookeeper \
    && mkdir -p /data /datalog /conf /logs && chown zookeeper:zookeeper /data /datalog /conf /logs
USER 1000
WORKDIR /tmp
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["zkServer.sh", "start-foreground"]
