package mqbench;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * Per-send latencies of one load thread (nanoseconds, growable), merged at the end into TPS and
 * percentiles. A send counts when it started inside the measured window [start, end); the window's
 * length is from its start to the completion of the last counted send.
 */
public final class Latencies {
    private long[] values = new long[1 << 14];
    private int size;
    long lastDoneNanos;
    long failed;
    long warmupFailed;

    public void add(long startNanos, long doneNanos) {
        if (size == values.length) {
            values = Arrays.copyOf(values, size * 2);
        }
        values[size++] = doneNanos - startNanos;
        lastDoneNanos = Math.max(lastDoneNanos, doneNanos);
    }

    public void fail(boolean measured) {
        if (measured) {
            failed++;
        } else {
            warmupFailed++;
        }
    }

    /** Merge the threads' samples: count, failures, TPS and latency percentiles in ms. */
    public static Map<String, Object> summary(Latencies[] all, long windowStartNanos) {
        int total = 0;
        long lastDone = windowStartNanos;
        long failed = 0;
        long warmupFailed = 0;
        for (Latencies l : all) {
            total += l.size;
            lastDone = Math.max(lastDone, l.lastDoneNanos);
            failed += l.failed;
            warmupFailed += l.warmupFailed;
        }
        long[] merged = new long[total];
        int at = 0;
        for (Latencies l : all) {
            System.arraycopy(l.values, 0, merged, at, l.size);
            at += l.size;
        }
        Arrays.sort(merged);
        double elapsed = (lastDone - windowStartNanos) / 1e9;
        double sum = 0;
        for (long v : merged) {
            sum += v;
        }
        Map<String, Object> out = new HashMap<>();
        out.put("sent", total);
        out.put("failed", failed);
        out.put("warmup_failed", warmupFailed);
        out.put("elapsed_s", elapsed);
        out.put("tps", elapsed > 0 ? total / elapsed : 0.0);
        out.put("mean_ms", total > 0 ? sum / total / 1e6 : Double.NaN);
        out.put("p50_ms", percentile(merged, 0.50));
        out.put("p99_ms", percentile(merged, 0.99));
        out.put("max_ms", total > 0 ? merged[total - 1] / 1e6 : Double.NaN);
        return out;
    }

    /** Nearest-rank percentile of sorted nanoseconds, in ms. */
    static double percentile(long[] sorted, double q) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        int rank = (int) Math.ceil(q * sorted.length);
        return sorted[Math.max(0, Math.min(sorted.length - 1, rank - 1))] / 1e6;
    }

    /** "--key value" pairs into a map (every option takes a value). */
    public static Map<String, String> options(String[] args) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --option, got " + args[i]);
            }
            out.put(args[i].substring(2), args[i + 1]);
        }
        return out;
    }

    /** A body of {@code size} random alphanumeric bytes, as the benchmark Producer builds it. */
    public static byte[] body(int size) {
        String chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        java.util.Random random = new java.util.Random();
        byte[] out = new byte[size];
        for (int i = 0; i < size; i++) {
            out[i] = (byte) chars.charAt(random.nextInt(chars.length()));
        }
        return out;
    }
}
