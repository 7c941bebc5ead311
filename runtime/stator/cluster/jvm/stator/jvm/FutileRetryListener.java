package stator.jvm;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.ExceptionFailure;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskEndReason;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.SparkListenerJobEnd;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.StageInfo;
import org.apache.spark.storage.RDDInfo;

/**
 * Fails a Spark job at the first task that raised Stator's StateMismatchError, instead of after
 * Spark's spark.task.maxFailures attempts of it.
 *
 * The error means that the state the task needs cannot be produced where Spark runs it (the
 * executor that held it is lost and the checkpoint of the epoch it needs is not complete, or
 * the retry is refused so that the replacement executor restores locally): the job must rewind
 * to its latest completed checkpoint, and every further attempt fails the same way. Those
 * attempts cost seconds of a recovery (each is scheduled, starts a Python task, surveys the
 * state) for nothing. The stage is cancelled with a reason that carries the task's error line,
 * so the driver classifies the job's failure as it would the last attempt's.
 *
 * It also cancels a running job as soon as an executor is removed that alone held the state of
 * one of its keyed partitions (PreferredLocationsRDD's "stateOn"): every retry of that partition
 * would fail so, but Spark would first hold the retry back for the process-locality wait (its
 * stage still lists the other executors' tasks as pending there), and a resubmitted stage's
 * tasks for as long again, while the other tasks hang fetching the lost executor's shuffle
 * output (measured on a lost node: the job failed 50 s after the executor's removal, instead of
 * at once).
 */
public class FutileRetryListener extends SparkListener {
  public static final String MARKER = "StateMismatchError: ";
  private static SparkContext installedOn;

  private final SparkContext sc;
  private final Set<Integer> cancelled = ConcurrentHashMap.newKeySet();
  // Running jobs -> their keyed stages' wrapped RDDs that hold state.
  private final Map<Integer, List<PreferredLocationsRDD<?>>> holding = new ConcurrentHashMap<>();

  private FutileRetryListener(SparkContext sc) {
    this.sc = sc;
  }

  /** Adds the listener to this SparkContext once (every region's driver calls this). */
  public static synchronized boolean install(SparkContext sc) {
    if (installedOn == sc) {
      return false;
    }
    sc.addSparkListener(new FutileRetryListener(sc));
    installedOn = sc;
    return true;
  }

  @Override
  public void onTaskEnd(SparkListenerTaskEnd end) {
    TaskEndReason reason = end.reason();
    if (!(reason instanceof ExceptionFailure)) {
      return;
    }
    String line = errorLine(((ExceptionFailure) reason).description());
    if (line == null || !cancelled.add(end.stageId())) {
      return;
    }
    sc.cancelStage(
        end.stageId(),
        "a retry of task " + end.taskInfo().index() + " cannot succeed (" + line + ")");
  }

  @Override
  public void onJobStart(SparkListenerJobStart start) {
    List<PreferredLocationsRDD<?>> rdds = new ArrayList<>();
    for (StageInfo stage : scala.jdk.javaapi.CollectionConverters.asJava(start.stageInfos())) {
      for (RDDInfo info : scala.jdk.javaapi.CollectionConverters.asJava(stage.rddInfos())) {
        PreferredLocationsRDD<?> rdd = PreferredLocationsRDD.holdingState(info.id());
        if (rdd != null) {
          rdds.add(rdd);
        }
      }
    }
    if (!rdds.isEmpty()) {
      holding.put(start.jobId(), rdds);
    }
  }

  @Override
  public void onJobEnd(SparkListenerJobEnd end) {
    holding.remove(end.jobId());
  }

  @Override
  public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
    if (holding.isEmpty()) {
      return;
    }
    Set<String> alive = PreferredLocationsRDD.active(sc);
    for (Map.Entry<Integer, List<PreferredLocationsRDD<?>>> job : holding.entrySet()) {
      for (PreferredLocationsRDD<?> rdd : job.getValue()) {
        String lost = rdd.stateLostWith(removed.executorId(), alive);
        if (lost != null && holding.remove(job.getKey()) != null) {
          sc.cancelJob(
              job.getKey(),
              "because executor " + removed.executorId() + " was lost (" + removed.reason()
                  + ") with the state of keyed " + lost + ", which no other executor holds: no "
                  + "retry of it can succeed, the job rewinds to its latest checkpoint");
          break;
        }
      }
    }
  }

  /** The error's own line ("StateMismatchError: ..."), or null when the task failed otherwise. */
  static String errorLine(String description) {
    if (description == null) {
      return null;
    }
    int at = description.indexOf(MARKER);
    if (at < 0) {
      return null;
    }
    int end = description.indexOf('\n', at);
    return end < 0 ? description.substring(at) : description.substring(at, end);
  }
}
