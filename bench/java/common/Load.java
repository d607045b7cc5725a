package mqbench;

import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;
import mqtest.Events;

/**
 * N threads each sending one message at a time (synchronously) for warm-up + measured seconds; prints
 * one "done" event with {@link Latencies#summary}. The driver supplies the send.
 */
public final class Load {
    /** One synchronous send; returns normally when the message was stored, throws otherwise. */
    public interface Send {
        void send() throws Exception;
    }

    private Load() {}

    public static Map<String, Object> run(int threads, double warmupS, double seconds, Send send)
            throws InterruptedException {
        final long begin = System.nanoTime();
        final long windowStart = begin + (long) (warmupS * 1e9);
        final long end = windowStart + (long) (seconds * 1e9);
        final Latencies[] all = new Latencies[threads];
        final AtomicReference<Throwable> firstError = new AtomicReference<>();
        Thread[] workers = new Thread[threads];
        for (int i = 0; i < threads; i++) {
            final Latencies mine = all[i] = new Latencies();
            workers[i] = new Thread(() -> {
                while (true) {
                    long t0 = System.nanoTime();
                    if (t0 >= end) {
                        return;
                    }
                    boolean measured = t0 >= windowStart;
                    try {
                        send.send();
                    } catch (Throwable e) {
                        mine.fail(measured);
                        firstError.compareAndSet(null, e);
                        try {
                            Thread.sleep(100); // a failing target must not be hammered in a tight loop
                        } catch (InterruptedException ignored) {
                            return;
                        }
                        continue;
                    }
                    if (measured) {
                        mine.add(t0, System.nanoTime());
                    }
                }
            }, "load-" + i);
            workers[i].start();
        }
        for (Thread t : workers) {
            t.join();
        }
        Map<String, Object> out = Latencies.summary(all, windowStart);
        Throwable e = firstError.get();
        out.put("threads", threads);
        out.put("first_error", e == null ? null : e.getClass().getSimpleName() + ": " + e.getMessage());
        if (e != null) {
            Events.error("send", e);
        }
        return out;
    }
}
