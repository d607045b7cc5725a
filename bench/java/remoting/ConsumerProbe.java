package mqbench;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.concurrent.atomic.LongAdder;
import mqtest.Events;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.impl.consumer.MQConsumerInner;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;

/**
 * Runs Apache RocketMQ's benchmark Consumer ({@code org.apache.rocketmq.example.benchmark.Consumer}) unchanged
 * in this JVM and reads its own received-message counter (StatsBenchmarkConsumer, by reflection through
 * the client's registry) every 10 ms, because its printed TPS is a 10 s sliding window that a drain of a
 * few seconds never fills.
 *
 *   --group G --expect N [--timeout 120] [--report-ms 1000] [--trace-pulls FILE]
 *       -- <benchmark Consumer arguments, with -g G>
 *
 * With --trace-pulls, every PULL_MESSAGE after the Consumer's start is timed by {@link PullTrace} into FILE.
 *
 * Prints {"event":"progress","consumed":..,"failed":..,"at_ms":..} every report-ms while the count grows
 * (several probes in one group are stopped from outside once their counts add up), then
 * {"event":"done","consumed":..,"first_ms":..,"done_ms":..,"failed":..}: ms since the Consumer's start for
 * its first counted message and for the moment the count reached N (-1 if it never did).
 */
public final class ConsumerProbe {
    public static void main(String[] args) throws Exception {
        int split = java.util.Arrays.asList(args).indexOf("--");
        java.util.Map<String, String> o = Latencies.options(java.util.Arrays.copyOfRange(args, 0, split));
        String[] consumerArgs = java.util.Arrays.copyOfRange(args, split + 1, args.length);
        String group = o.get("group");
        long expect = Long.parseLong(o.get("expect"));
        double timeoutS = Double.parseDouble(o.getOrDefault("timeout", "120"));
        long reportNanos = Long.parseLong(o.getOrDefault("report-ms", "1000")) * 1_000_000L;

        long t0 = System.nanoTime();
        org.apache.rocketmq.example.benchmark.Consumer.main(consumerArgs);
        PullTrace trace = o.containsKey("trace-pulls") ? new PullTrace() : null;
        if (trace != null) {
            for (MQClientInstance instance : MQClientManager.getInstance().getFactoryTable().values()) {
                instance.getMQClientAPIImpl().getRemotingClient().registerRPCHook(trace);
            }
        }
        Object stats = stats(group);
        LongAdder received = (LongAdder) call(stats, "getReceiveMessageTotalCount");
        LongAdder failedCount = (LongAdder) call(stats, "getFailCount");
        Events.emit("started", "start_ms", (System.nanoTime() - t0) / 1e6);

        long deadline = t0 + (long) (timeoutS * 1e9);
        double firstMs = -1;
        double doneMs = -1;
        long lastReport = t0;
        long reported = -1;
        while (System.nanoTime() < deadline) {
            long count = received.sum();
            long now = System.nanoTime();
            if (count > 0 && firstMs < 0) {
                firstMs = (now - t0) / 1e6;
            }
            if (count >= expect) {
                doneMs = (now - t0) / 1e6;
                break;
            }
            if (now - lastReport >= reportNanos && count != reported) {
                Events.emit("progress", "consumed", count, "failed", failedCount.sum(), "at_ms", (now - t0) / 1e6);
                lastReport = now;
                reported = count;
            }
            Thread.sleep(10);
        }
        Events.emit("done", "consumed", received.sum(), "expect", expect, "first_ms", firstMs, "done_ms", doneMs,
            "failed", failedCount.sum());
        if (trace != null) {
            trace.write(java.nio.file.Path.of(o.get("trace-pulls")));
        }
        System.exit(0);
    }

    /** The benchmark Consumer's StatsBenchmarkConsumer: client registry -> push consumer -> its listener. */
    private static Object stats(String group) throws Exception {
        for (MQClientInstance instance : MQClientManager.getInstance().getFactoryTable().values()) {
            MQConsumerInner inner = instance.selectConsumer(group);
            if (inner instanceof DefaultMQPushConsumerImpl) {
                Object listener = ((DefaultMQPushConsumerImpl) inner).getMessageListenerInner();
                for (Field field : listener.getClass().getDeclaredFields()) {
                    if (field.getType().getSimpleName().equals("StatsBenchmarkConsumer")) {
                        field.setAccessible(true);
                        return field.get(listener);
                    }
                }
            }
        }
        throw new IllegalStateException("benchmark Consumer of group " + group + " not found");
    }

    private static Object call(Object target, String name) throws Exception {
        Method method = target.getClass().getDeclaredMethod(name);
        method.setAccessible(true);
        return method.invoke(target);
    }
}
