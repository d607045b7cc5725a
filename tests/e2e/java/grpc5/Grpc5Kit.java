package mqtest;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.java.message.MessageViewImpl;

/**
 * What the RocketMQ 5 gRPC drivers ({@link Grpc5}, {@link ClusterGrpc5}) share: running named scenarios in
 * parallel threads with one {@code "scenario.done"} event each and one {@code "done"} at the end, the topic and
 * group names of a scenario, bounded waits, and the event fields of a received message or a send receipt.
 */
final class Grpc5Kit {
    /** Every wait of a scenario gives up after this many seconds. */
    static final long DEADLINE_S = 90;

    private Grpc5Kit() {}

    /** One scenario's body. */
    interface Scenario {
        void run() throws Exception;
    }

    /**
     * Run {@code names} each in its own thread ({@code lookup} gives the body of a name, or throws
     * {@link IllegalArgumentException} for an unknown one), emit {@code "done"} with whether all passed, and exit
     * the JVM (the client's non-daemon threads may linger after close()).
     */
    static void runAll(List<String> names, Function<String, Scenario> lookup) throws InterruptedException {
        List<Thread> threads = new ArrayList<>();
        boolean[] ok = {true};
        for (String scenario : names) {
            Thread t = new Thread(() -> {
                boolean passed = run(scenario, lookup);
                synchronized (ok) {
                    ok[0] &= passed;
                }
            }, "scenario-" + scenario);
            threads.add(t);
            t.start();
        }
        for (Thread t : threads) {
            t.join();
        }
        Events.emit("done", "ok", ok[0]);
        System.exit(0);
    }

    private static boolean run(String scenario, Function<String, Scenario> lookup) {
        long t0 = System.currentTimeMillis();
        try {
            lookup.apply(scenario).run();
            Events.emit("scenario.done", "scenario", scenario, "ok", true,
                        "elapsed_ms", System.currentTimeMillis() - t0);
            return true;
        } catch (Throwable t) {
            Throwable cause = t.getCause();
            Events.emit("scenario.done", "scenario", scenario, "ok", false, "type", t.getClass().getName(),
                        "message", String.valueOf(t.getMessage()),
                        "cause", cause == null ? null : cause.getClass().getName() + ": " + cause.getMessage());
            return false;
        }
    }

    /** Scenario {@code s}'s topic: {@code prefix + S} (capitalised). */
    static String topic(String prefix, String scenario) {
        return prefix + Character.toUpperCase(scenario.charAt(0)) + scenario.substring(1);
    }

    /** Scenario {@code s}'s consumer group: its topic + {@code "Group"}. */
    static String group(String prefix, String scenario) {
        return topic(prefix, scenario) + "Group";
    }

    static long deadline() {
        return System.nanoTime() + TimeUnit.SECONDS.toNanos(DEADLINE_S);
    }

    static void checkDeadline(long deadline, String what) {
        if (System.nanoTime() > deadline) {
            throw new IllegalStateException("gave up after " + DEADLINE_S + " s waiting for " + what);
        }
    }

    static String body(MessageView view) {
        ByteBuffer buffer = view.getBody();
        byte[] bytes = new byte[buffer.remaining()];
        buffer.get(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }

    static Set<String> ids(List<MessageView> views) {
        return views.stream().map(v -> v.getMessageId().toString()).collect(Collectors.toSet());
    }

    /** Everything the client exposes about a received message, as event fields, then {@code extra} pairs. */
    static Object[] describe(String scenario, MessageView view, Object... extra) {
        Map<String, Object> fields = new LinkedHashMap<>();
        fields.put("scenario", scenario);
        fields.put("id", view.getMessageId().toString());
        fields.put("topic", view.getTopic());
        fields.put("body", body(view));
        fields.put("tag", view.getTag().orElse(null));
        fields.put("keys", new ArrayList<>(view.getKeys()));
        fields.put("properties", view.getProperties());
        fields.put("message_group", view.getMessageGroup().orElse(null));
        fields.put("delivery_timestamp", view.getDeliveryTimestamp().orElse(null));
        fields.put("born_timestamp", view.getBornTimestamp());
        fields.put("born_host", view.getBornHost());
        fields.put("delivery_attempt", view.getDeliveryAttempt());
        if (view instanceof MessageViewImpl) {
            MessageViewImpl impl = (MessageViewImpl) view;
            fields.put("endpoints", impl.getEndpoints() == null ? null : impl.getEndpoints().toString());
            // the queue the receive request named (not where the message is stored)
            fields.put("receive_queue_id", impl.getMessageQueue() == null ? null
                : impl.getMessageQueue().getQueueId());
            fields.put("accept_types", impl.getMessageQueue() == null ? null
                : impl.getMessageQueue().getAcceptMessageTypes().toString());
            fields.put("offset", impl.getOffset());
            fields.put("corrupted", impl.isCorrupted());
            fields.put("transport_delivery_timestamp", impl.getTransportDeliveryTimestamp().orElse(null));
        }
        for (int i = 0; i + 1 < extra.length; i += 2) {
            fields.put(String.valueOf(extra[i]), extra[i + 1]);
        }
        Object[] out = new Object[fields.size() * 2];
        int i = 0;
        for (Map.Entry<String, Object> e : fields.entrySet()) {
            out[i++] = e.getKey();
            out[i++] = e.getValue();
        }
        return out;
    }

    /** A {@code "sent"} event for {@code receipt}, then {@code extra} pairs. */
    static void emitSent(String scenario, SendReceipt receipt, Object... extra) {
        Object[] fields = new Object[4 + extra.length];
        fields[0] = "scenario";
        fields[1] = scenario;
        fields[2] = "id";
        fields[3] = receipt.getMessageId().toString();
        System.arraycopy(extra, 0, fields, 4, extra.length);
        Events.emit("sent", fields);
    }
}
