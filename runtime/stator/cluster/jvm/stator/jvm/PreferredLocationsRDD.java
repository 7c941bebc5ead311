package stator.jvm;

import java.lang.ref.WeakReference;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.Partition;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.storage.BlockManagerId;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * Wraps an RDD one-to-one and gives each partition the preferred locations the Stator driver
 * chose (PySpark has no API for it). Locations are Spark location strings, comma-separated
 * per partition: "executor_HOST_ID" asks for one executor (and, through its host, for that
 * host when the executor is gone), "HOST" for any executor on a host, "" for anywhere.
 *
 * compute() also records, in the task's local properties, which executor and host run the
 * task: the Python worker reads them (TaskContext.getLocalProperty) and reports them, since a
 * Python worker has no other reliable way to learn its executor id. And whether the task is a
 * retry: a later attempt, or any attempt of a resubmitted stage (PySpark's TaskContext has no
 * stage attempt number). And, for a first attempt that runs away from the executor it was sent
 * to, whether that executor is gone (asked of the driver's block manager master): the executor
 * was lost after the driver planned the epoch, so the task is in effect a retry elsewhere.
 *
 * An executor that is gone by the time a stage is submitted (a stage retried after its
 * executor was lost mid-epoch) is no longer asked for: Spark would otherwise hold the task
 * back for the whole process-locality wait, waiting for an executor that cannot come back.
 * A live executor on the gone one's host is asked for instead: on Kubernetes that is its
 * replacement, restarted in the same pod (same IP) with the same state volume, so the task
 * still finds its state there.
 *
 * A keyed stage also says, per partition, which executors hold its state ("stateOn": the one it
 * is pinned to and any keeping a standby copy; "" where a retry elsewhere may restore from the
 * object store). Losing all of them mid-job makes every retry of that partition futile:
 * FutileRetryListener cancels the job at once instead of letting Spark retry it after the
 * locality wait.
 */
public class PreferredLocationsRDD<T> extends RDD<T> {
  public static final String EXECUTOR_ID = "stator.executor.id";
  public static final String EXECUTOR_HOST = "stator.executor.host";
  public static final String RETRY = "stator.task.retry";
  public static final String SENT_TO_GONE = "stator.task.sent_to_gone";
  private static final String EXECUTOR_PREFIX = "executor_";

  // Wrapped RDDs that hold state, by RDD id, while their jobs may run (FutileRetryListener).
  private static final Map<Integer, WeakReference<PreferredLocationsRDD<?>>> HOLDING_STATE =
      new ConcurrentHashMap<>();

  private final RDD<T> parent;
  private final String[] locations;
  private final String[] stateOn;

  public PreferredLocationsRDD(RDD<T> parent, String[] locations) {
    this(parent, locations, new String[0]);
  }

  @SuppressWarnings("unchecked")
  public PreferredLocationsRDD(RDD<T> parent, String[] locations, String[] stateOn) {
    super(parent, (ClassTag<T>) ClassTag$.MODULE$.apply(Object.class));
    this.parent = parent;
    this.locations = locations;
    this.stateOn = stateOn;
    for (String held : stateOn) {
      if (held != null && !held.isEmpty()) {
        HOLDING_STATE.put(id(), new WeakReference<>(this));
        break;
      }
    }
  }

  /** The wrapped RDD of this id that holds state, if any (and forgets it: asked once per job). */
  static PreferredLocationsRDD<?> holdingState(int rddId) {
    WeakReference<PreferredLocationsRDD<?>> ref = HOLDING_STATE.remove(rddId);
    return ref == null ? null : ref.get();
  }

  /**
   * The first partition whose state only executors gone from ``alive`` held, one of them
   * ``lost``: "partition I (state on executor_HOST_ID)"; null if every partition's state is
   * still held somewhere (or may be restored from the object store).
   */
  String stateLostWith(String lost, Set<String> alive) {
    for (int i = 0; i < stateOn.length; i++) {
      String held = stateOn[i];
      if (held == null || held.isEmpty()) {
        continue;
      }
      boolean hadLost = false;
      boolean kept = false;
      for (String location : held.split(",")) {
        String id = location.substring(location.lastIndexOf('_') + 1);
        hadLost |= id.equals(lost);
        kept |= alive.contains(id);
      }
      if (hadLost && !kept) {
        return "partition " + i + " (state on " + held + ")";
      }
    }
    return null;
  }

  @Override
  public Partition[] getPartitions() {
    return parent.partitions();
  }

  @Override
  public scala.collection.Iterator<T> compute(Partition split, TaskContext context) {
    SparkEnv env = SparkEnv.get();
    context.getLocalProperties().setProperty(EXECUTOR_ID, env.executorId());
    context
        .getLocalProperties()
        .setProperty(EXECUTOR_HOST, env.blockManager().blockManagerId().host());
    boolean retry = context.attemptNumber() > 0 || context.stageAttemptNumber() > 0;
    context.getLocalProperties().setProperty(RETRY, Boolean.toString(retry));
    boolean gone = !retry && sentToGone(split.index(), env);
    context.getLocalProperties().setProperty(SENT_TO_GONE, Boolean.toString(gone));
    return parent.iterator(split, context);
  }

  /**
   * Whether partition i was sent to executors ("executor_HOST_ID" locations) of which this is
   * none and none is registered any more. Asks the driver only when the task runs away.
   */
  private boolean sentToGone(int i, SparkEnv env) {
    if (i >= locations.length || locations[i] == null || locations[i].isEmpty()) {
      return false;
    }
    String self = location(env.blockManager().blockManagerId().host(), env.executorId());
    List<String> wanted = new ArrayList<>();
    for (String location : locations[i].split(",")) {
      if (location.equals(self)) {
        return false;
      }
      if (location.startsWith(EXECUTOR_PREFIX)) {
        wanted.add(location.substring(location.lastIndexOf('_') + 1));
      }
    }
    if (wanted.isEmpty()) {
      return false;
    }
    for (BlockManagerId bm : registered()) {
      if (wanted.contains(bm.executorId())) {
        return false;
      }
    }
    return true;
  }

  @Override
  public scala.collection.immutable.Seq<String> getPreferredLocations(Partition split) {
    List<String> out = new ArrayList<>();
    int i = split.index();
    if (i < locations.length && locations[i] != null && !locations[i].isEmpty()) {
      Set<String> alive = active(sparkContext());
      for (String location : locations[i].split(",")) {
        if (!location.startsWith(EXECUTOR_PREFIX)) {
          out.add(location);
          continue;
        }
        int cut = location.lastIndexOf('_');
        if (alive.contains(location.substring(cut + 1))) {
          out.add(location);
          continue;
        }
        String host = location.substring(EXECUTOR_PREFIX.length(), cut);
        for (String id : executorsOn(host, alive)) {
          out.add(location(host, id));
        }
      }
    }
    return scala.jdk.javaapi.CollectionConverters.asScala(out).toList();
  }

  /**
   * The executors the driver may still send tasks to: registered, and not being removed. An
   * executor whose heartbeats timed out is being killed and replaced, but on a lost node its
   * pod and its RPC connection linger until the node is declared gone, so it stays in
   * getExecutorIds() the while: asking for it would hold a retried stage's task back for the
   * whole process-locality wait.
   */
  static Set<String> active(org.apache.spark.SparkContext sc) {
    Set<String> ids = new HashSet<>(scala.jdk.javaapi.CollectionConverters.asJava(sc.getExecutorIds()));
    if (sc.schedulerBackend() instanceof org.apache.spark.ExecutorAllocationClient client) {
      ids.removeIf(id -> !client.isExecutorActive(id));
    }
    return ids;
  }

  /** Live executors whose block manager is on this host (the driver's own view). */
  private static List<String> executorsOn(String host, Set<String> alive) {
    List<String> ids = new ArrayList<>();
    for (BlockManagerId bm : registered()) {
      if (host.equals(bm.host()) && alive.contains(bm.executorId())) {
        ids.add(bm.executorId());
      }
    }
    return ids;
  }

  /** The block managers the driver's master lists (asked of the driver from an executor). */
  private static Iterable<BlockManagerId> registered() {
    scala.collection.Map<BlockManagerId, ?> status =
        SparkEnv.get().blockManager().master().getMemoryStatus();
    return scala.jdk.javaapi.CollectionConverters.asJava(status.keySet());
  }

  /** Spark's location string for one executor (jvm.executor_location on the Python side). */
  private static String location(String host, String executorId) {
    return EXECUTOR_PREFIX + host + "_" + executorId;
  }
}
