#!/usr/bin/env bash
# Spark's Kubernetes backend starts executor pods with the single argument "executor" and
# passes everything else in the environment. Anything else is run as given (e.g. the driver:
# `stator run module:function`). Arguments are passed as an array, never through a shell string.
# The main class is Spark 4's Kubernetes backend: CoarseGrainedExecutorBackend rejects --podName.
# The classpath is the one stator.cluster.cds makes the executors' class-data archive with (the
# driver passes -XX:SharedArchiveFile in SPARK_JAVA_OPT_n): a JVM with another ignores it.
set -euo pipefail

if [ "${1:-}" = "executor" ]; then
  : "${SPARK_DRIVER_URL:?executor mode needs SPARK_DRIVER_URL}"
  : "${SPARK_EXECUTOR_ID:?executor mode needs SPARK_EXECUTOR_ID}"
  mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
  exec "${JAVA_HOME}/bin/java" \
    "${java_opts[@]}" \
    -Xms"${SPARK_EXECUTOR_MEMORY:-1g}" -Xmx"${SPARK_EXECUTOR_MEMORY:-1g}" \
    -cp "${SPARK_HOME}/jars/*${SPARK_EXTRA_CLASSPATH:+:${SPARK_EXTRA_CLASSPATH}}" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL}" \
    --executor-id "${SPARK_EXECUTOR_ID}" \
    --cores "${SPARK_EXECUTOR_CORES:-1}" \
    --app-id "${SPARK_APPLICATION_ID}" \
    --hostname "${SPARK_EXECUTOR_POD_IP:-$(hostname -i)}" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME:-$(hostname)}"
fi

exec "$@"
