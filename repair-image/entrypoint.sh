#!/bin/sh
# Spark's Kubernetes scheduler starts executor (and, for SparkApplications, driver) pods from this image with a
# role word as their only argument and their settings in SPARK_* variables; anything else runs as given.
set -eu
case "${1:-}" in
  executor)
    # Every SPARK_JAVA_OPT_<n> variable Spark sets is one JVM option.
    set -- $(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    exec java $@ -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_HOME/conf:$SPARK_HOME/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  driver)
    shift
    exec spark-submit --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" --deploy-mode client "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
