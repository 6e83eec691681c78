#!/bin/bash
# The zookeeper image's zkServer.sh for the two verbs the chart uses, on Debian's ZooKeeper jars:
# `start-foreground` runs the server from $ZOOCFGDIR/zoo.cfg (its heap ZK_SERVER_HEAP MiB, as zkEnv.sh reads it),
# `status` succeeds while it answers `srvr`.
set -e
CLASSPATH=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar:/usr/share/java/netty-codec.jar
CLASSPATH=$CLASSPATH:/usr/share/java/netty-resolver.jar
case "$1" in
  start-foreground)
    exec java "-Xmx${ZK_SERVER_HEAP:-256}m" -cp "$CLASSPATH" org.apache.zookeeper.server.quorum.QuorumPeerMain \
        "$ZOOCFGDIR/zoo.cfg" ;;
  status)
    exec python3 -c 'import socket,sys; s=socket.create_connection(("127.0.0.1",2181),3); s.sendall(b"srvr"); sys.exit(0 if b"Mode" in s.recv(4096) else 1)' ;;
  *)
    echo "zkServer.sh: only start-foreground and status are supported here" >&2; exit 2 ;;
esac
