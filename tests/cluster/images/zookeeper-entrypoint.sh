#!/bin/bash
# Stand-in for the official zookeeper image's /docker-entrypoint.sh with the same environment contract
# (ZOO_DATA_DIR, ZOO_DATA_LOG_DIR, ZOO_CONF_DIR, ZOO_MY_ID, ZOO_SERVERS, ZOO_4LW_COMMANDS_WHITELIST,
# ZOO_STANDALONE_ENABLED, ...) and the same behaviour: under `set -e`, it generates zoo.cfg when there is none and
# writes $ZOO_DATA_DIR/myid without creating $ZOO_DATA_DIR (the image makes only /data, /datalog and /conf).
# ZooKeeper itself is Debian's package (zookeeper-bin/zkServer.sh).
set -e
: "${ZOO_DATA_DIR:=/data}" "${ZOO_DATA_LOG_DIR:=/datalog}" "${ZOO_TICK_TIME:=2000}" "${ZOO_INIT_LIMIT:=5}"
: "${ZOO_SYNC_LIMIT:=2}" "${ZOO_MAX_CLIENT_CNXNS:=60}" "${ZOO_STANDALONE_ENABLED:=true}"
: "${ZOO_ADMINSERVER_ENABLED:=true}" "${ZOO_AUTOPURGE_PURGEINTERVAL:=0}" "${ZOO_AUTOPURGE_SNAPRETAINCOUNT:=3}"
# The image's ZOO_CONF_DIR is /conf; where the pod mounts nothing there, a private directory stands in for it.
if [[ -z "${ZOO_CONF_DIR:-}" ]]; then
    if [[ -d /conf ]]; then ZOO_CONF_DIR=/conf; else ZOO_CONF_DIR="$(mktemp -d -t zookeeper-conf.XXXXXX)"; fi
fi
export ZOO_CONF_DIR ZOO_DATA_DIR ZOO_DATA_LOG_DIR ZOOCFGDIR="$ZOO_CONF_DIR"
CONFIG="$ZOO_CONF_DIR/zoo.cfg"
if [[ ! -f "$CONFIG" ]]; then
    {
        echo "dataDir=$ZOO_DATA_DIR"
        echo "dataLogDir=$ZOO_DATA_LOG_DIR"
        echo "tickTime=$ZOO_TICK_TIME"
        echo "initLimit=$ZOO_INIT_LIMIT"
        echo "syncLimit=$ZOO_SYNC_LIMIT"
        echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
        echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
        echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
        echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
        echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
    } >> "$CONFIG"
    for server in ${ZOO_SERVERS:-server.1=localhost:2888:3888;2181}; do
        echo "$server" >> "$CONFIG"
    done
    if [[ -n $ZOO_4LW_COMMANDS_WHITELIST ]]; then
        echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST" >> "$CONFIG"
    fi
fi
if [[ ! -f "$ZOO_DATA_DIR/myid" ]]; then
    echo "${ZOO_MY_ID:-1}" > "$ZOO_DATA_DIR/myid"
fi
exec "$@"
