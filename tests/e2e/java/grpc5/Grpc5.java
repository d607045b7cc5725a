package mqtest;

import static mqtest.Grpc5Kit.*;

import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.stream.Collectors;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
import org.apache.rocketmq.client.java.message.MessageViewImpl;

/**
 * Scenarios of the RocketMQ 5 Java gRPC client (rocketmq-client-java 5.2.0), run in parallel threads of one JVM.
 *
 * <p>Usage: {@code Grpc5 ENDPOINT h2c|tls PREFIX SCENARIO...}. Scenario {@code s} uses topic {@code PREFIX + S}
 * (capitalised: PREFIXNormal, PREFIXFifo, ...) and consumer group {@code PREFIX + S + "Group"}; the caller creates
 * typed topics (and the FIFO group) beforehand where the server needs them. Every event carries
 * {@code "scenario"}; each scenario ends with one {@code "scenario.done"} ({@code ok}: no exception), and the
 * program with one {@code "done"}. Waits are bounded by {@link Grpc5Kit#DEADLINE_S}; nothing sleeps.
 *
 * <p>Scenarios:
 * <ul>
 *   <li>normal: 3 messages (tag, two keys, a property) by a Producer; a SimpleConsumer receives and acks them.</li>
 *   <li>invisible: one message received with a 20 s invisible duration, changed to 1 s, received again.</li>
 *   <li>fifo: two message groups, 4 messages each, interleaved; a SimpleConsumer of a FIFO group receives one
 *       message, asks again before acking it (FIFO: nothing more from that queue), then acks as it receives.</li>
 *   <li>delay: one message with a delivery timestamp 3 s ahead; received with the server's delivery time.</li>
 *   <li>transaction: commit, rollback and one left open that the server's check-back resolves (COMMIT).</li>
 *   <li>push: a PushConsumer with the tag filter "TagA || TagC" while TagA, TagB and TagC messages are sent.</li>
 *   <li>mismatch: a FIFO message (it has a message group) sent to a NORMAL topic; expected to be refused.</li>
 * </ul>
 *
 * <p>The program starts with a {@code "hello"} event naming the host name the client puts in born_host.
 */
public final class Grpc5 {
    static final Duration AWAIT = Duration.ofSeconds(5);
    static final Duration INVISIBLE = Duration.ofSeconds(20);

    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final ClientConfiguration config;
    private final String prefix;

    private Grpc5(String endpoint, boolean tls, String prefix) {
        this.config = ClientConfiguration.newBuilder().setEndpoints(endpoint).enableSsl(tls)
            .setRequestTimeout(Duration.ofSeconds(5)).build();
        this.prefix = prefix;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4 || !(args[1].equals("h2c") || args[1].equals("tls"))) {
            Events.emit("done", "ok", false, "reason", "usage: Grpc5 ENDPOINT h2c|tls PREFIX SCENARIO...");
            return;
        }
        Grpc5 driver = new Grpc5(args[0], args[1].equals("tls"), args[2]);
        Events.emit("hello", "host", InetAddress.getLocalHost().getHostName(), "transport", args[1]);
        runAll(Arrays.asList(args).subList(3, args.length), driver::scenario);
    }

    private Scenario scenario(String name) {
        switch (name) {
            case "normal": return this::normal;
            case "invisible": return this::invisible;
            case "fifo": return this::fifo;
            case "delay": return this::delay;
            case "transaction": return this::transaction;
            case "push": return this::push;
            case "mismatch": return this::mismatch;
            default: throw new IllegalArgumentException("unknown scenario " + name);
        }
    }

    // ------------------------------------------------------------------------------------------- helpers

    private String topic(String scenario) {
        return Grpc5Kit.topic(prefix, scenario);
    }

    private String group(String scenario) {
        return Grpc5Kit.group(prefix, scenario);
    }

    private Producer producer(String topic) throws Exception {
        return provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build();
    }

    private SimpleConsumer simpleConsumer(String scenario, String expression) throws Exception {
        return provider.newSimpleConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group(scenario)).setAwaitDuration(AWAIT)
            .setSubscriptionExpressions(Collections.singletonMap(topic(scenario),
                new FilterExpression(expression, FilterExpressionType.TAG)))
            .build();
    }

    private MessageBuilder message(String topic, String body) {
        return provider.newMessageBuilder().setTopic(topic).setBody(body.getBytes(StandardCharsets.UTF_8));
    }

    /** Receive (acking each message if {@code ack}) until {@code done} holds for what was received so far. */
    private static List<MessageView> receiveUntil(String scenario, SimpleConsumer consumer, int batch, boolean ack,
                                                  Predicate<List<MessageView>> done) throws Exception {
        List<MessageView> got = new ArrayList<>();
        long deadline = deadline();
        while (!done.test(got)) {
            checkDeadline(deadline, "messages");
            List<MessageView> views = consumer.receive(batch, INVISIBLE);
            Events.emit("receive", "scenario", scenario, "count", views.size());
            for (MessageView view : views) {
                Events.emit("received", describe(scenario, view));
                got.add(view);
                if (ack) {
                    consumer.ack(view);
                    Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString());
                }
            }
        }
        return got;
    }

    // ------------------------------------------------------------------------------------------- scenarios

    private void normal() throws Exception {
        String scenario = "normal";
        String topic = topic(scenario);
        try (SimpleConsumer consumer = simpleConsumer(scenario, "*"); Producer producer = producer(topic)) {
            for (int i = 0; i < 3; i++) {
                Message m = message(topic, "normal-" + i).setTag("TagA").setKeys("key-" + i, "common")
                    .addProperty("seq", String.valueOf(i)).addProperty("origin", "java-grpc5").build();
                emitSent(scenario, producer.send(m), "seq", i);
            }
            receiveUntil(scenario, consumer, 16, true, got -> got.size() >= 3);
        }
    }

    private void invisible() throws Exception {
        String scenario = "invisible";
        String topic = topic(scenario);
        try (SimpleConsumer consumer = simpleConsumer(scenario, "*"); Producer producer = producer(topic)) {
            emitSent(scenario, producer.send(message(topic, "invisible-0").setTag("TagA").build()));
            MessageView first = receiveUntil(scenario, consumer, 1, false, got -> !got.isEmpty()).get(0);
            consumer.changeInvisibleDuration(first, Duration.ofSeconds(1));
            Events.emit("changed", "scenario", scenario, "id", first.getMessageId().toString(), "seconds", 1);
            String id = first.getMessageId().toString();
            List<MessageView> again = receiveUntil(scenario, consumer, 1, false,
                got -> got.stream().anyMatch(v -> v.getMessageId().toString().equals(id)));
            for (MessageView view : again) {
                consumer.ack(view);
                Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString());
            }
        }
    }

    private void fifo() throws Exception {
        String scenario = "fifo";
        String topic = topic(scenario);
        try (SimpleConsumer consumer = simpleConsumer(scenario, "*"); Producer producer = producer(topic)) {
            for (int i = 0; i < 4; i++) {
                for (String group : new String[] {"g1", "g2"}) {
                    Message m = message(topic, group + "-" + i).setTag("TagF").setMessageGroup(group)
                        .addProperty("seq", String.valueOf(i)).build();
                    emitSent(scenario, producer.send(m), "message_group", group, "seq", i);
                }
            }
            // one message, not acked: a FIFO group gets nothing more from its queue until it is acked
            MessageView head = receiveUntil(scenario, consumer, 1, false, got -> !got.isEmpty()).get(0);
            List<MessageView> meanwhile = consumer.receive(32, INVISIBLE);
            Events.emit("meanwhile", "scenario", scenario, "head_queue",
                        ((MessageViewImpl) head).getMessageQueue().getQueueId(), "count", meanwhile.size());
            for (MessageView view : meanwhile) {
                Events.emit("received", describe(scenario, view, "meanwhile", true));
            }
            consumer.ack(head);
            Events.emit("acked", "scenario", scenario, "id", head.getMessageId().toString());
            for (MessageView view : meanwhile) {
                consumer.ack(view);
                Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString());
            }
            int have = 1 + meanwhile.size();
            receiveUntil(scenario, consumer, 32, true, got -> have + got.size() >= 8);
        }
    }

    private void delay() throws Exception {
        String scenario = "delay";
        String topic = topic(scenario);
        try (SimpleConsumer consumer = simpleConsumer(scenario, "*"); Producer producer = producer(topic)) {
            long at = System.currentTimeMillis() + 3000;
            emitSent(scenario, producer.send(message(topic, "delay-0").setTag("TagD").setKeys("delayed")
                .setDeliveryTimestamp(at).build()), "delivery_timestamp", at);
            receiveUntil(scenario, consumer, 16, true, got -> !got.isEmpty());
        }
    }

    private void transaction() throws Exception {
        String scenario = "transaction";
        String topic = topic(scenario);
        CountDownLatch checked = new CountDownLatch(1);
        try (SimpleConsumer consumer = simpleConsumer(scenario, "*");
             Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic)
                 .setTransactionChecker(view -> {
                     String tag = view.getTag().orElse("");
                     Events.emit("checked", describe(scenario, view));
                     if (tag.equals("TagUnknown")) {
                         checked.countDown();
                     }
                     // consistent with what the producer decided, should a resolved one be checked too
                     return tag.equals("TagRollback") ? TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
                 }).build()) {
            Set<String> visible = new HashSet<>();  // what must become visible: commit and unknown
            for (String outcome : new String[] {"commit", "rollback", "unknown"}) {
                Transaction tx = producer.beginTransaction();
                String tag = "Tag" + Character.toUpperCase(outcome.charAt(0)) + outcome.substring(1);
                SendReceipt receipt = producer.send(message(topic, "tx-" + outcome).setTag(tag)
                    .setKeys("tx-" + outcome).build(), tx);
                emitSent(scenario, receipt, "outcome", outcome);
                if (!outcome.equals("rollback")) {
                    visible.add(receipt.getMessageId().toString());
                }
                if (outcome.equals("commit")) {
                    tx.commit();
                } else if (outcome.equals("rollback")) {
                    tx.rollback();
                }
                Events.emit("resolved", "scenario", scenario, "outcome", outcome);
            }
            receiveUntil(scenario, consumer, 16, true, got -> got.stream()
                .map(v -> v.getMessageId().toString()).collect(Collectors.toSet()).containsAll(visible));
            if (!checked.await(DEADLINE_S, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no check-back of the open transaction within " + DEADLINE_S + " s");
            }
        }
    }

    private void push() throws Exception {
        String scenario = "push";
        String topic = topic(scenario);
        Set<String> consumed = ConcurrentHashMap.newKeySet();
        Object changed = new Object();
        try (PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(config)
                 .setConsumerGroup(group(scenario))
                 .setSubscriptionExpressions(Collections.singletonMap(topic,
                     new FilterExpression("TagA || TagC", FilterExpressionType.TAG)))
                 .setMessageListener(view -> {
                     Events.emit("consumed", describe(scenario, view));
                     consumed.add(view.getMessageId().toString());
                     synchronized (changed) {
                         changed.notifyAll();
                     }
                     return ConsumeResult.SUCCESS;
                 }).build();
             Producer producer = producer(topic)) {
            String[] tags = {"TagA", "TagB", "TagC", "TagA", "TagB", "TagC"};
            Set<String> wanted = new HashSet<>();
            for (int i = 0; i < tags.length; i++) {
                SendReceipt receipt = producer.send(message(topic, "push-" + i).setTag(tags[i]).build());
                emitSent(scenario, receipt, "tag", tags[i], "seq", i);
                if (!tags[i].equals("TagB")) {
                    wanted.add(receipt.getMessageId().toString());
                }
            }
            long deadline = deadline();
            synchronized (changed) {
                while (!consumed.containsAll(wanted)) {
                    checkDeadline(deadline, "the TagA and TagC messages");
                    changed.wait(1000);  // woken by the listener; the timeout only re-checks the deadline
                }
            }
        }
    }

    private void mismatch() throws Exception {
        String scenario = "mismatch";
        String topic = topic(scenario);
        try (Producer producer = producer(topic)) {
            try {
                SendReceipt receipt = producer.send(message(topic, "mismatch-0").setTag("TagM")
                    .setMessageGroup("g1").build());
                emitSent(scenario, receipt);
            } catch (Exception e) {
                Throwable cause = e.getCause();
                Events.emit("refused", "scenario", scenario, "type", e.getClass().getName(),
                            "message", String.valueOf(e.getMessage()),
                            "cause", cause == null ? null : cause.getClass().getName() + ": " + cause.getMessage());
            }
        }
    }
}
