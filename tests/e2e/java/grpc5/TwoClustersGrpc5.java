package mqtest;

import static mqtest.Grpc5Kit.*;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * The RocketMQ 5 Java gRPC client (rocketmq-client-java 5.2.0) against one mqproxy node in front of several
 * clusters: one Producer sends to topics the node routes to different clusters, one SimpleConsumer of one group
 * subscribed to all of them receives and acks every message, and a send to a topic no rule covers is refused.
 * Each topic's first message is not acked at its first delivery: its invisible duration is changed to 1 s
 * ({@code "changed"}), and it is acked when it comes again.
 *
 * <p>Usage: {@code TwoClustersGrpc5 ENDPOINT GROUP COUNT UNROUTED TOPIC...}. Events (as in {@link Grpc5}):
 * {@code "sent"} (topic, id, seq) per message, {@code "received"} and {@code "acked"} per delivery,
 * {@code "refused"} (type, message) for the unrouted send (or {@code "sent"} with scenario "unrouted" if it was
 * taken), then {@code "scenario.done"} and {@code "done"}. Waits are bounded by {@link Grpc5Kit#DEADLINE_S}.
 */
public final class TwoClustersGrpc5 {
    static final Duration AWAIT = Duration.ofSeconds(5);
    static final Duration INVISIBLE = Duration.ofSeconds(20);
    static final Duration REDELIVER = Duration.ofSeconds(1);

    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final ClientConfiguration config;
    private final String group;
    private final int count;
    private final String unrouted;
    private final List<String> topics;

    private TwoClustersGrpc5(String endpoint, String group, int count, String unrouted, List<String> topics) {
        this.config = ClientConfiguration.newBuilder().setEndpoints(endpoint).enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(5)).build();
        this.group = group;
        this.count = count;
        this.unrouted = unrouted;
        this.topics = topics;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            Events.emit("done", "ok", false, "reason", "usage: TwoClustersGrpc5 ENDPOINT GROUP COUNT UNROUTED TOPIC...");
            return;
        }
        List<String> topics = Arrays.asList(args).subList(4, args.length);
        TwoClustersGrpc5 driver = new TwoClustersGrpc5(args[0], args[1], Integer.parseInt(args[2]), args[3], topics);
        Events.emit("hello", "endpoint", args[0], "topics", topics);
        runAll(Arrays.asList("routed", "unrouted"), name -> name.equals("routed") ? driver::routed : driver::unrouted);
    }

    /** Every topic's messages sent by one producer, received and acked by one consumer of one group. */
    private void routed() throws Exception {
        String scenario = "routed";
        Map<String, FilterExpression> subscriptions = new LinkedHashMap<>();
        for (String topic : topics) {
            subscriptions.put(topic, FilterExpression.SUB_ALL);
        }
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
                 .setConsumerGroup(group).setAwaitDuration(AWAIT).setSubscriptionExpressions(subscriptions).build();
             Producer producer = provider.newProducerBuilder().setClientConfiguration(config)
                 .setTopics(topics.toArray(new String[0])).build()) {
            Set<String> sent = new HashSet<>();
            for (int i = 0; i < count; i++) {
                for (String topic : topics) {
                    SendReceipt receipt = producer.send(provider.newMessageBuilder().setTopic(topic)
                        .setBody((topic + "-" + i).getBytes(StandardCharsets.UTF_8)).setTag("TagT").build());
                    sent.add(receipt.getMessageId().toString());
                    emitSent(scenario, receipt, "topic", topic, "seq", i);
                }
            }
            Set<String> acked = new HashSet<>();
            long deadline = deadline();
            while (!acked.containsAll(sent)) {
                checkDeadline(deadline, "the messages of every topic");
                for (MessageView view : consumer.receive(16, INVISIBLE)) {
                    Events.emit("received", describe(scenario, view));
                    String id = view.getMessageId().toString();
                    if (body(view).endsWith("-0") && view.getDeliveryAttempt() == 1) {
                        // each topic's first message comes again: its broker revives it, not acked
                        consumer.changeInvisibleDuration(view, REDELIVER);
                        Events.emit("changed", "scenario", scenario, "id", id, "topic", view.getTopic());
                        continue;
                    }
                    consumer.ack(view);
                    acked.add(id);
                    Events.emit("acked", "scenario", scenario, "id", id, "topic", view.getTopic());
                }
            }
        }
    }

    /** A send to a topic no routing rule covers: the client gets the server's error. */
    private void unrouted() throws Exception {
        String scenario = "unrouted";
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config).build()) {
            try {
                SendReceipt receipt = producer.send(provider.newMessageBuilder().setTopic(unrouted)
                    .setBody("nowhere".getBytes(StandardCharsets.UTF_8)).build());
                emitSent(scenario, receipt, "topic", unrouted);
            } catch (Exception e) {
                Throwable cause = e.getCause();
                Events.emit("refused", "scenario", scenario, "type", e.getClass().getName(),
                            "message", String.valueOf(e.getMessage()),
                            "cause", cause == null ? null : cause.getClass().getName() + ": " + cause.getMessage());
            }
        }
    }
}
