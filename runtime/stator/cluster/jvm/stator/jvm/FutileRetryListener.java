package stator.jvm;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.ExceptionFailure;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskEndReason;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerTaskEnd;

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
 */
public class FutileRetryListener extends SparkListener {
  public static final String MARKER = "StateMismatchError: ";
  private static SparkContext installedOn;

  private final SparkContext sc;
  private final Set<Integer> cancelled = ConcurrentHashMap.newKeySet();

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
