package mqtest;

import static mqtest.Grpc5Kit.*;

import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
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
import org.apache.rocketmq.client.java.route.Endpoints;

/**
 * The RocketMQ 5 Java gRPC client (rocketmq-client-java 5.2.0) against two mqproxy nodes of one cluster: every
 * producer is configured with node A's endpoint, every consumer with node B's (unless a scenario says otherwise).
 *
 * <p>Usage: {@code ClusterGrpc5 ENDPOINT_A ENDPOINT_B PREFIX SCENARIO...}. Scenario {@code s} uses topic
 * {@code PREFIX + S} (capitalised) and consumer group {@code PREFIX + S + "Group"}; the caller creates the typed
 * topics and the FIFO groups beforehand. Events as in {@link Grpc5}: each carries {@code "scenario"}, each
 * scenario ends with one {@code "scenario.done"} ({@code ok}: no exception), the program with one {@code "done"}.
 * Waits are bounded by {@link Grpc5Kit#DEADLINE_S}; nothing sleeps.
 *
 * <p>Scenarios:
 * <ul>
 *   <li>normal: 16 messages sent through A; a SimpleConsumer on B receives and acks them.</li>
 *   <li>crossack: 4 messages received through A with a short invisible time and not acked there; the first 3
 *       received are acked through B (the message views' endpoints are pointed at B: the client acks where it
 *       received), the last is left alone and received again through B once its invisible time is over.</li>
 *   <li>invisible: a message received through B with a 20 s invisible time, changed to 1 s through A, received
 *       again through B.</li>
 *   <li>push: a PushConsumer on B consumes 10 messages sent through A.</li>
 *   <li>fifo: 6 message groups x 5 messages (interleaved) to a FIFO topic; a SimpleConsumer of a FIFO group on B
 *       receives one, asks again before acking it (FIFO: nothing more from its queue), then acks as it receives.</li>
 *   <li>fifopush: the same messages for a PushConsumer of a FIFO group on B, whose listener notes overlaps.</li>
 *   <li>transaction: commit, rollback and one left open (the local transaction's answer is unknown) that the
 *       producer's checker commits when the server checks back; a SimpleConsumer on B.</li>
 *   <li>txother: a half message sent through A by a producer that then closes (its checker answers UNKNOWN);
 *       the check-back reaches the topic's other producer, on B, which commits it.</li>
 *   <li>delay: 4 messages with a delivery timestamp 3 s ahead; a SimpleConsumer on B.</li>
 * </ul>
 */
public final class ClusterGrpc5 {
    static final Duration AWAIT = Duration.ofSeconds(5);
    static final Duration INVISIBLE = Duration.ofSeconds(20);
    static final Duration SHORT_INVISIBLE = Duration.ofSeconds(8);
    static final long FIFO_WORK_MS = 20;

    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final ClientConfiguration configA;
    private final ClientConfiguration configB;
    private final String endpointA;
    private final String endpointB;
    private final String prefix;

    private ClusterGrpc5(String endpointA, String endpointB, String prefix) {
        this.configA = ClientConfiguration.newBuilder().setEndpoints(endpointA)
            .setRequestTimeout(Duration.ofSeconds(5)).enableSsl(false).build();
        this.configB = ClientConfiguration.newBuilder().setEndpoints(endpointB)
            .setRequestTimeout(Duration.ofSeconds(5)).enableSsl(false).build();
        this.endpointA = endpointA;
        this.endpointB = endpointB;
        this.prefix = prefix;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            Events.emit("done", "ok", false, "reason", "usage: ClusterGrpc5 ENDPOINT_A ENDPOINT_B PREFIX SCENARIO...");
            return;
        }
        ClusterGrpc5 driver = new ClusterGrpc5(args[0], args[1], args[2]);
        Events.emit("hello", "a", args[0], "b", args[1]);
        runAll(Arrays.asList(args).subList(3, args.length), driver::scenario);
    }

    private Scenario scenario(String name) {
        switch (name) {
            case "normal": return this::normal;
            case "crossack": return this::crossAck;
            case "invisible": return this::invisible;
            case "push": return this::push;
            case "fifo": return this::fifo;
            case "fifopush": return this::fifoPush;
            case "transaction": return this::transaction;
            case "txother": return this::txOther;
            case "delay": return this::delay;
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
        return provider.newProducerBuilder().setClientConfiguration(configA).setTopics(topic).build();
    }

    private SimpleConsumer simpleConsumer(String scenario, ClientConfiguration config) throws Exception {
        return provider.newSimpleConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group(scenario)).setAwaitDuration(AWAIT)
            .setSubscriptionExpressions(Collections.singletonMap(topic(scenario), FilterExpression.SUB_ALL))
            .build();
    }

    private MessageBuilder message(String topic, String body) {
        return provider.newMessageBuilder().setTopic(topic).setBody(body.getBytes(StandardCharsets.UTF_8));
    }

    /** Receive (acking each message if {@code ack}) until {@code done} holds for what was received so far. */
    private static List<MessageView> receiveUntil(String scenario, SimpleConsumer consumer, Duration invisible,
                                                  boolean ack, Predicate<List<MessageView>> done,
                                                  Object... extra) throws Exception {
        return receiveBatchesUntil(scenario, consumer, invisible, ack, done, 16, extra);
    }

    /** {@link #receiveUntil} asking for at most {@code batch} messages at a time. */
    private static List<MessageView> receiveBatchesUntil(String scenario, SimpleConsumer consumer, Duration invisible,
                                                  boolean ack, Predicate<List<MessageView>> done, int batch,
                                                  Object... extra) throws Exception {
        List<MessageView> got = new ArrayList<>();
        long deadline = deadline();
        while (!done.test(got)) {
            checkDeadline(deadline, "messages");
            List<MessageView> views = consumer.receive(batch, invisible);
            for (MessageView view : views) {
                Events.emit("received", describe(scenario, view, extra));
                got.add(view);
                if (ack) {
                    consumer.ack(view);
                    Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString());
                }
            }
        }
        return got;
    }

    /** A received message's view, changed to be acked through {@code endpoint} (the client acks a message
     * through the endpoints it was received from, and has no API to name others). */
    private static MessageView through(MessageView view, String endpoint) throws Exception {
        Field field = MessageViewImpl.class.getDeclaredField("endpoints");
        field.setAccessible(true);
        field.set(view, new Endpoints(endpoint));
        return view;
    }

    /** Wait until {@code consumed} holds {@code wanted}, woken by {@code changed}. */
    private static void awaitAll(Set<String> consumed, Set<String> wanted, Object changed, String what)
        throws InterruptedException {
        long deadline = deadline();
        synchronized (changed) {
            while (!consumed.containsAll(wanted)) {
                checkDeadline(deadline, what);
                changed.wait(1000);  // woken by the listener; the timeout only re-checks the deadline
            }
        }
    }

    // ------------------------------------------------------------------------------------------- scenarios

    private void normal() throws Exception {
        String scenario = "normal";
        String topic = topic(scenario);
        try (SimpleConsumer consumer = simpleConsumer(scenario, configB); Producer producer = producer(topic)) {
            Set<String> sent = new HashSet<>();
            for (int i = 0; i < 16; i++) {
                Message m = message(topic, "normal-" + i).setTag("TagA").setKeys("key-" + i)
                    .addProperty("seq", String.valueOf(i)).build();
                SendReceipt receipt = producer.send(m);
                sent.add(receipt.getMessageId().toString());
                emitSent(scenario, receipt, "seq", i);
            }
            receiveUntil(scenario, consumer, INVISIBLE, true, got -> ids(got).containsAll(sent));
        }
    }

    private void crossAck() throws Exception {
        String scenario = "crossack";
        String topic = topic(scenario);
        try (SimpleConsumer onA = simpleConsumer(scenario, configA);
             SimpleConsumer onB = simpleConsumer(scenario, configB);
             Producer producer = producer(topic)) {
            Set<String> sent = new HashSet<>();
            for (int i = 0; i < 4; i++) {
                SendReceipt receipt = producer.send(message(topic, "crossack-" + i).setTag("TagX").build());
                sent.add(receipt.getMessageId().toString());
                emitSent(scenario, receipt, "seq", i);
            }
            List<MessageView> got = receiveUntil(scenario, onA, SHORT_INVISIBLE, false,
                views -> ids(views).containsAll(sent), "phase", "first");
            MessageView control = got.get(got.size() - 1);  // popped last: its invisible time ends last
            for (MessageView view : got) {
                if (view != control) {
                    onB.ack(through(view, endpointB));
                    Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString(),
                                "via", ((MessageViewImpl) view).getEndpoints().toString());
                }
            }
            String controlId = control.getMessageId().toString();
            Events.emit("control", "scenario", scenario, "id", controlId);
            List<MessageView> again = receiveUntil(scenario, onB, INVISIBLE, false,
                views -> ids(views).contains(controlId), "phase", "again");
            for (MessageView view : again) {
                onB.ack(view);
                Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString(),
                            "via", ((MessageViewImpl) view).getEndpoints().toString());
            }
        }
    }

    private void invisible() throws Exception {
        String scenario = "invisible";
        String topic = topic(scenario);
        try (SimpleConsumer onB = simpleConsumer(scenario, configB);
             SimpleConsumer onA = simpleConsumer(scenario, configA);
             Producer producer = producer(topic)) {
            emitSent(scenario, producer.send(message(topic, "invisible-0").setTag("TagI").build()));
            MessageView first = receiveUntil(scenario, onB, INVISIBLE, false, got -> !got.isEmpty()).get(0);
            onA.changeInvisibleDuration(through(first, endpointA), Duration.ofSeconds(1));
            String id = first.getMessageId().toString();
            Events.emit("changed", "scenario", scenario, "id", id, "seconds", 1,
                        "via", ((MessageViewImpl) first).getEndpoints().toString());
            List<MessageView> again = receiveUntil(scenario, onB, INVISIBLE, false, got -> ids(got).contains(id));
            for (MessageView view : again) {
                onB.ack(view);
                Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString());
            }
        }
    }

    private PushConsumer pushConsumer(String scenario, Set<String> consumed, Object changed) throws Exception {
        return provider.newPushConsumerBuilder().setClientConfiguration(configB)
            .setConsumerGroup(group(scenario))
            .setSubscriptionExpressions(Collections.singletonMap(topic(scenario), FilterExpression.SUB_ALL))
            .setMessageListener(view -> {
                Events.emit("consumed", describe(scenario, view));
                consumed.add(view.getMessageId().toString());
                synchronized (changed) {
                    changed.notifyAll();
                }
                return ConsumeResult.SUCCESS;
            }).build();
    }

    private void push() throws Exception {
        String scenario = "push";
        String topic = topic(scenario);
        Set<String> consumed = ConcurrentHashMap.newKeySet();
        Object changed = new Object();
        try (PushConsumer consumer = pushConsumer(scenario, consumed, changed); Producer producer = producer(topic)) {
            Set<String> sent = new HashSet<>();
            for (int i = 0; i < 10; i++) {
                SendReceipt receipt = producer.send(message(topic, "push-" + i).setTag("TagP").build());
                sent.add(receipt.getMessageId().toString());
                emitSent(scenario, receipt, "seq", i);
            }
            awaitAll(consumed, sent, changed, "the pushed messages");
        }
    }

    private Set<String> sendGroups(String scenario, Producer producer, int groups, int each) throws Exception {
        String topic = topic(scenario);
        Set<String> sent = new HashSet<>();
        for (int i = 0; i < each; i++) {
            for (int g = 0; g < groups; g++) {
                String group = "g" + g;
                Message m = message(topic, group + "-" + i).setTag("TagF").setMessageGroup(group)
                    .addProperty("seq", String.valueOf(i)).build();
                SendReceipt receipt = producer.send(m);
                sent.add(receipt.getMessageId().toString());
                emitSent(scenario, receipt, "message_group", group, "seq", i);
            }
        }
        return sent;
    }

    private void fifo() throws Exception {
        String scenario = "fifo";
        try (SimpleConsumer consumer = simpleConsumer(scenario, configB);
             Producer producer = producer(topic(scenario))) {
            Set<String> sent = sendGroups(scenario, producer, 6, 5);
            // one message, not acked: nothing more of its queue (so of its group) comes until it is acked
            MessageView head = receiveBatchesUntil(scenario, consumer, INVISIBLE, false, got -> !got.isEmpty(), 1)
                .get(0);
            List<MessageView> meanwhile = consumer.receive(32, INVISIBLE);
            for (MessageView view : meanwhile) {
                Events.emit("received", describe(scenario, view, "meanwhile", true));
            }
            List<MessageView> got = new ArrayList<>(meanwhile);
            got.add(head);
            for (MessageView view : got) {
                consumer.ack(view);
                Events.emit("acked", "scenario", scenario, "id", view.getMessageId().toString());
            }
            Set<String> have = ids(got);
            receiveUntil(scenario, consumer, INVISIBLE, true, more -> {
                Set<String> all = new HashSet<>(have);
                all.addAll(ids(more));
                return all.containsAll(sent);
            });
        }
    }

    /** FIFO push: the listener notes whether another message of its group was being consumed meanwhile
     * ({@code "overlap"}), and works for {@link #FIFO_WORK_MS} so that a client consuming a group's messages
     * concurrently would show it; the messages are all sent before it starts, so it receives them in batches. */
    private void fifoPush() throws Exception {
        String scenario = "fifopush";
        Set<String> consumed = ConcurrentHashMap.newKeySet();
        Map<String, Integer> busy = new ConcurrentHashMap<>();
        Object changed = new Object();
        Set<String> sent;
        try (Producer producer = producer(topic(scenario))) {
            sent = sendGroups(scenario, producer, 6, 5);  // all waiting before the consumer starts
        }
        try (PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(configB)
                 .setConsumerGroup(group(scenario))
                 .setSubscriptionExpressions(Collections.singletonMap(topic(scenario), FilterExpression.SUB_ALL))
                 .setMessageListener(view -> {
                     String group = view.getMessageGroup().orElse("");
                     boolean overlap = busy.merge(group, 1, Integer::sum) > 1;
                     Events.emit("consumed", describe(scenario, view, "overlap", overlap));
                     try {
                         Thread.sleep(FIFO_WORK_MS);
                     } catch (InterruptedException e) {
                         Thread.currentThread().interrupt();
                     }
                     busy.merge(group, -1, Integer::sum);
                     consumed.add(view.getMessageId().toString());
                     synchronized (changed) {
                         changed.notifyAll();
                     }
                     return ConsumeResult.SUCCESS;
                 }).build()) {
            awaitAll(consumed, sent, changed, "the FIFO messages");
        }
    }

    private void transaction() throws Exception {
        String scenario = "transaction";
        String topic = topic(scenario);
        CountDownLatch checked = new CountDownLatch(1);
        try (SimpleConsumer consumer = simpleConsumer(scenario, configB);
             Producer producer = provider.newProducerBuilder().setClientConfiguration(configA).setTopics(topic)
                 .setTransactionChecker(view -> {
                     String tag = view.getTag().orElse("");
                     Events.emit("checked", describe(scenario, view));
                     if (tag.equals("TagUnknown")) {
                         checked.countDown();
                     }
                     return tag.equals("TagRollback") ? TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
                 }).build()) {
            Set<String> visible = new HashSet<>();
            for (String outcome : new String[] {"commit", "rollback", "unknown"}) {
                Transaction tx = producer.beginTransaction();
                String tag = "Tag" + Character.toUpperCase(outcome.charAt(0)) + outcome.substring(1);
                SendReceipt receipt = producer.send(message(topic, "tx-" + outcome).setTag(tag).build(), tx);
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
            receiveUntil(scenario, consumer, INVISIBLE, true, got -> ids(got).containsAll(visible));
            if (!checked.await(DEADLINE_S, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no check-back of the open transaction within " + DEADLINE_S + " s");
            }
        }
    }

    /** A producer on B with a checker that commits; a producer on A sends a half message, leaves it open (its
     * checker answers UNKNOWN) and closes: the brokers' check-backs must then reach the producer on B. */
    private void txOther() throws Exception {
        String scenario = "txother";
        String topic = topic(scenario);
        CountDownLatch checked = new CountDownLatch(1);
        try (SimpleConsumer consumer = simpleConsumer(scenario, configB);
             Producer onB = provider.newProducerBuilder().setClientConfiguration(configB).setTopics(topic)
                 .setTransactionChecker(view -> {
                     Events.emit("checked", describe(scenario, view, "by", "B"));
                     checked.countDown();
                     return TransactionResolution.COMMIT;
                 }).build()) {
            String id;
            try (Producer onA = provider.newProducerBuilder().setClientConfiguration(configA).setTopics(topic)
                     .setTransactionChecker(view -> {
                         Events.emit("checked", describe(scenario, view, "by", "A"));
                         return TransactionResolution.UNKNOWN;
                     }).build()) {
                Transaction tx = onA.beginTransaction();
                SendReceipt receipt = onA.send(message(topic, "txother-0").setTag("TagOther").build(), tx);
                id = receipt.getMessageId().toString();
                emitSent(scenario, receipt, "outcome", "unknown");
            }
            Events.emit("closed", "scenario", scenario, "producer", "A");
            receiveUntil(scenario, consumer, INVISIBLE, true, got -> ids(got).contains(id));
            if (!checked.await(DEADLINE_S, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no check-back reached the producer on B");
            }
        }
    }

    private void delay() throws Exception {
        String scenario = "delay";
        String topic = topic(scenario);
        try (SimpleConsumer consumer = simpleConsumer(scenario, configB); Producer producer = producer(topic)) {
            Set<String> sent = new HashSet<>();
            for (int i = 0; i < 4; i++) {
                long at = System.currentTimeMillis() + 3000;
                SendReceipt receipt = producer.send(message(topic, "delay-" + i).setTag("TagD")
                    .setDeliveryTimestamp(at).build());
                sent.add(receipt.getMessageId().toString());
                emitSent(scenario, receipt, "delivery_timestamp", at, "seq", i);
            }
            receiveUntil(scenario, consumer, INVISIBLE, true, got -> ids(got).containsAll(sent));
        }
    }
}
