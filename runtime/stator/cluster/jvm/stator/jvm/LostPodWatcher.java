package stator.jvm;

import io.fabric8.kubernetes.api.model.Container;
import io.fabric8.kubernetes.api.model.ContainerStatus;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.informers.ResourceEventHandler;
import io.fabric8.kubernetes.client.informers.SharedIndexInformer;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.deploy.k8s.SparkKubernetesClientFactory;
import org.apache.spark.scheduler.ExecutorProcessLost;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerApplicationEnd;
import org.apache.spark.scheduler.cluster.k8s.KubernetesClusterSchedulerBackend;
import scala.Option;

/**
 * Tells Spark that an executor is lost as soon as its pod says so: the pod is deleted, or its
 * executor container stops or restarts in place.
 *
 * Spark's own pod watch takes a pod deleted while its phase is Running (a force deletion) for a
 * running pod, and a container that stops in a pod that restarts it (a StatefulSet's) leaves
 * the pod Running under the old executor's id. Spark removes such an executor only at its next
 * pod list that misses it (spark.kubernetes.executor.apiPollingInterval, then the lifecycle
 * manager's next batch), or once its heartbeats are overdue
 * (spark.storage.blockManagerHeartbeatTimeoutMs). Its connection closed long before that: Spark
 * stops offering it tasks, but the tasks it ran still count as running, and the stage waits for
 * them. That wait was most of the time from an executor's loss to its subtasks running elsewhere.
 *
 * An informer on the application's executor pods removes the executor through the backend's own
 * call (the one Spark's lifecycle manager makes) when the pod's deletion arrives, its executor
 * container leaves the running state or its restart count grows, or its spark-exec-id label
 * changes (the driver relabels a pod whose container registered again as a new executor). The
 * loss is not counted against the task (causedByApp false), as Spark does not count a deleted
 * pod. The executor's blocks are removed from the block manager master first, so that no
 * retried task reads a broadcast piece from it. Removing an executor whose process still runs
 * for a moment (a force deletion before the kubelet kills it) is what Spark does with a pod it
 * sees deleted; a second removal of the same executor is ignored by Spark.
 */
public final class LostPodWatcher implements ResourceEventHandler<Pod> {
  static final String EXEC_ID = "spark-exec-id";
  private static SparkContext installedOn;

  private final KubernetesClusterSchedulerBackend backend;
  private final String containerName;

  private LostPodWatcher(KubernetesClusterSchedulerBackend backend, String containerName) {
    this.backend = backend;
    this.containerName = containerName;
  }

  /**
   * Starts watching this SparkContext's executor pods, once; false when its executors are not
   * Kubernetes pods. The informer and its client close when the application ends.
   */
  public static synchronized boolean install(SparkContext sc) {
    if (installedOn == sc) {
      return false;
    }
    if (!(sc.schedulerBackend() instanceof KubernetesClusterSchedulerBackend)) {
      return false;
    }
    SparkConf conf = sc.conf();
    String namespace = conf.get("spark.kubernetes.namespace", "default");
    // The client Spark's backend makes in client mode: the same API server and credentials.
    KubernetesClient client =
        SparkKubernetesClientFactory.createKubernetesClient(
            sc.master().substring("k8s://".length()),
            Option.apply(namespace),
            "spark.kubernetes.authenticate",
            SparkKubernetesClientFactory.ClientType$.MODULE$.Driver(),
            conf,
            Option.empty());
    SharedIndexInformer<Pod> informer;
    try {
      informer =
          client
              .pods()
              .inNamespace(namespace)
              .withLabel("spark-app-selector", sc.applicationId())
              .withLabel("spark-role", "executor")
              .inform(
                  new LostPodWatcher(
                      (KubernetesClusterSchedulerBackend) sc.schedulerBackend(),
                      conf.get("spark.kubernetes.executor.podTemplateContainerName", null)));
    } catch (RuntimeException e) { // its first list refused (RBAC, API server): no client left
      client.close();
      throw e;
    }
    sc.addSparkListener(
        new SparkListener() {
          @Override
          public void onApplicationEnd(SparkListenerApplicationEnd end) {
            informer.close();
            client.close();
          }
        });
    installedOn = sc;
    return true;
  }

  @Override
  public void onAdd(Pod pod) {}

  @Override
  public void onUpdate(Pod before, Pod after) {
    String was = executorId(before);
    if (was == null) {
      return;
    }
    String is = executorId(after);
    if (is != null && !was.equals(is)) {
      lost(was, "its pod " + name(after) + " registered again as executor " + is);
    } else if (running(before) && !running(after)) {
      lost(was, "the executor container of its pod " + name(after) + " stopped");
    } else if (restarts(after) > restarts(before)) {
      lost(was, "the executor container of its pod " + name(after) + " restarted");
    }
  }

  @Override
  public void onDelete(Pod pod, boolean finalStateUnknown) {
    String id = executorId(pod);
    if (id != null) {
      lost(id, "its pod " + name(pod) + " was deleted");
    }
  }

  private void lost(String executorId, String why) {
    // Its blocks first: the task Spark retries at once on another executor reads the stage's
    // broadcast from wherever the block manager master says pieces are, and until the
    // scheduler's own removal reaches the master (an event later) that includes the lost
    // executor, whose fetch fails and is retried before going elsewhere (seconds, measured).
    // Spark's later removal of the same executor finds nothing left to remove.
    SparkEnv env = SparkEnv.get();
    if (env != null) {
      env.blockManager().master().removeExecutor(executorId);
    }
    backend.doRemoveExecutor(
        executorId, new ExecutorProcessLost("Stator: executor lost: " + why, Option.empty(), false));
  }

  /** The pod's executor id; null before its executor registered (a StatefulSet's pods are
   * labelled with a placeholder until then). */
  static String executorId(Pod pod) {
    Map<String, String> labels = pod.getMetadata().getLabels();
    String id = labels == null ? null : labels.get(EXEC_ID);
    return id != null && id.matches("[0-9]+") ? id : null;
  }

  /**
   * The executor container's status: the one spark.kubernetes.executor.podTemplateContainerName
   * names, else the pod's last (Spark adds its executor container after a template's others).
   */
  private ContainerStatus executorContainer(Pod pod) {
    if (pod.getSpec() == null || pod.getSpec().getContainers().isEmpty() || pod.getStatus() == null) {
      return null;
    }
    List<Container> containers = pod.getSpec().getContainers();
    String container =
        containerName != null ? containerName : containers.get(containers.size() - 1).getName();
    for (ContainerStatus status : pod.getStatus().getContainerStatuses()) {
      if (container.equals(status.getName())) {
        return status;
      }
    }
    return null;
  }

  boolean running(Pod pod) {
    ContainerStatus status = executorContainer(pod);
    return status != null && status.getState() != null && status.getState().getRunning() != null;
  }

  int restarts(Pod pod) {
    ContainerStatus status = executorContainer(pod);
    return status == null || status.getRestartCount() == null ? 0 : status.getRestartCount();
  }

  private static String name(Pod pod) {
    return pod.getMetadata().getName();
  }
}
