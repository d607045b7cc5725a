package mqtest;

import static mqtest.Grpc5Kit.*;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * The RocketMQ 5 Java gRPC client (rocketmq-client-java 5.2.0) against a server with an ACL 1.0 account file:
 * credentials through {@link StaticSessionCredentialsProvider}, which signs every call's {@code authorization}
 * header (MQv2-HMAC-SHA1, upper-case hex), over h2c.
 *
 * <p>Usage: {@code AclGrpc5 ENDPOINT AK SK TOPIC GROUP DENIED_TOPIC SCENARIO...}; scenarios run in parallel threads
 * and each ends with one {@code "scenario.done"} ({@code ok}: no exception where none was expected):
 * <ul>
 *   <li>right: a Producer with AK/SK sends one message to TOPIC; a SimpleConsumer of GROUP with AK/SK receives
 *       and acks it ({@code "sent"}, {@code "received"}).</li>
 *   <li>wrong: the same Producer with a wrong secret key; its start or send is expected to fail
 *       ({@code "refused"} with the exception's class and message, or {@code "accepted"}).</li>
 *   <li>anonymous: the same without credentials (expected to fail the same way).</li>
 *   <li>forbidden: a Producer with AK/SK (no topics declared up front) sends to DENIED_TOPIC, which the account
 *       may not publish to ({@code "refused"} or {@code "accepted"}).</li>
 * </ul>
 */
public final class AclGrpc5 {
    private final ClientServiceProvider provider = ClientServiceProvider.loadService();
    private final String endpoint;
    private final String accessKey;
    private final String secretKey;
    private final String topic;
    private final String group;
    private final String deniedTopic;

    private AclGrpc5(String[] args) {
        this.endpoint = args[0];
        this.accessKey = args[1];
        this.secretKey = args[2];
        this.topic = args[3];
        this.group = args[4];
        this.deniedTopic = args[5];
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 7) {
            Events.emit("done", "ok", false,
                        "reason", "usage: AclGrpc5 ENDPOINT AK SK TOPIC GROUP DENIED_TOPIC SCENARIO...");
            return;
        }
        AclGrpc5 driver = new AclGrpc5(args);
        runAll(Arrays.asList(args).subList(6, args.length), driver::scenario);
    }

    private Scenario scenario(String name) {
        switch (name) {
            case "right": return this::right;
            case "wrong": return () -> expectRefusal("wrong", config(accessKey, secretKey + "-wrong"), topic);
            case "anonymous": return () -> expectRefusal("anonymous", config(null, null), topic);
            case "forbidden": return () -> expectRefusal("forbidden", config(accessKey, secretKey), deniedTopic);
            default: throw new IllegalArgumentException("unknown scenario " + name);
        }
    }

    private ClientConfiguration config(String ak, String sk) {
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder().setEndpoints(endpoint)
            .enableSsl(false).setRequestTimeout(Duration.ofSeconds(5)).setMaxStartupAttempts(1);
        if (ak != null) {
            builder.setCredentialProvider(new StaticSessionCredentialsProvider(ak, sk));
        }
        return builder.build();
    }

    private void right() throws Exception {
        ClientConfiguration config = config(accessKey, secretKey);
        String id;
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config)
                .setTopics(topic).build()) {
            SendReceipt receipt = producer.send(provider.newMessageBuilder().setTopic(topic).setTag("TagA")
                .setBody("acl-right".getBytes(StandardCharsets.UTF_8)).build());
            id = receipt.getMessageId().toString();
            emitSent("right", receipt);
        }
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(config)
                .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(5))
                .setSubscriptionExpressions(Collections.singletonMap(topic,
                    new FilterExpression("*", FilterExpressionType.TAG)))
                .build()) {
            long deadline = deadline();
            boolean got = false;
            while (!got) {
                checkDeadline(deadline, "the message sent with the right keys");
                List<MessageView> views = consumer.receive(16, Duration.ofSeconds(20));
                for (MessageView view : views) {
                    consumer.ack(view);
                    Events.emit("received", describe("right", view));
                    got |= view.getMessageId().toString().equals(id);
                }
            }
        }
    }

    /** Start a producer with {@code config} and send to {@code target}; report whether either was refused. */
    private void expectRefusal(String scenario, ClientConfiguration config, String target) {
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(config)
                .setTopics(target.equals(deniedTopic) ? new String[0] : new String[] {target}).build()) {
            SendReceipt receipt = producer.send(provider.newMessageBuilder().setTopic(target)
                .setBody(scenario.getBytes(StandardCharsets.UTF_8)).build());
            Events.emit("accepted", "scenario", scenario, "id", receipt.getMessageId().toString());
        } catch (Throwable t) {
            Throwable root = t;
            while (root.getCause() != null && !(root instanceof org.apache.rocketmq.client.apis.ClientException
                    && root.getClass() != org.apache.rocketmq.client.apis.ClientException.class)) {
                root = root.getCause();
            }
            Events.emit("refused", "scenario", scenario, "type", t.getClass().getName(),
                        "message", String.valueOf(t.getMessage()), "root_type", root.getClass().getName(),
                        "root_message", String.valueOf(root.getMessage()));
        }
    }
}
