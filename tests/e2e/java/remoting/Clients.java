package mqtest;

import java.util.ArrayList;
import java.util.List;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The clients one scenario started, shut down (quietly, in the order they were added) when it closes; and the
 * client set-ups the scenarios share. Use in try-with-resources so a failing scenario still stops its clients.
 */
final class Clients implements AutoCloseable {
    private final Kit kit;
    private final List<Object> started = new ArrayList<>();

    Clients(Kit kit) {
        this.kit = kit;
    }

    /** Remembers {@code client} for shutdown and returns it. */
    <T> T add(T client) {
        started.add(client);
        return client;
    }

    /** A started producer of group {@code <groupLabel>_<runId>} that created {@code topic} ({@code queues} queues). */
    DefaultMQProducer producerWithTopic(String groupLabel, String topic, int queues) throws Exception {
        DefaultMQProducer producer = add(kit.producer(kit.name(groupLabel)));
        kit.createTopic(producer, topic, queues);
        return producer;
    }

    /** A started lite-pull consumer of group {@code <groupLabel>_<runId>}: manual commits, all of {@code topic}. */
    DefaultLitePullConsumer litePullSubscribed(String groupLabel, String topic) throws Exception {
        DefaultLitePullConsumer consumer = kit.litePullConsumer(kit.name(groupLabel));
        consumer.setAutoCommit(false);
        consumer.subscribe(topic, "*");
        consumer.start();
        return add(consumer);
    }

    /** A started transactional producer of {@code group} with its own instance name ({@code instanceLabel}). */
    static TransactionMQProducer transactionProducer(Kit kit, String group, String instanceLabel,
                                                     TransactionListener listener) throws Exception {
        TransactionMQProducer producer = new TransactionMQProducer(group);
        producer.setNamesrvAddr(kit.namesrv);
        producer.setMqClientApiTimeout(Kit.API_TIMEOUT_MS);
        producer.setInstanceName(Kit.instance(instanceLabel));
        producer.setTransactionListener(listener);
        producer.start();
        return producer;
    }

    /** What a listener does with each message besides emitting "received". */
    interface OnMessage {
        void accept(MessageExt msg);
    }

    /** A concurrent listener that emits "received" {msg} for each message, hands it on, and succeeds. */
    static MessageListenerConcurrently receivingConcurrently(Kit kit, OnMessage then) {
        return (msgs, ctx) -> {
            received(kit, msgs, then);
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        };
    }

    /** The orderly counterpart of {@link #receivingConcurrently}. */
    static MessageListenerOrderly receivingOrderly(Kit kit, OnMessage then) {
        return (msgs, ctx) -> {
            received(kit, msgs, then);
            return ConsumeOrderlyStatus.SUCCESS;
        };
    }

    private static void received(Kit kit, List<MessageExt> msgs, OnMessage then) {
        for (MessageExt m : msgs) {
            kit.emit("received", "msg", Kit.view(m));
            then.accept(m);
        }
    }

    /** Registers {@code listener}, starts {@code consumer} (already subscribed) and remembers it. */
    DefaultMQPushConsumer start(DefaultMQPushConsumer consumer, MessageListenerConcurrently listener)
            throws Exception {
        consumer.registerMessageListener(listener);
        consumer.start();
        return add(consumer);
    }

    /** The same for an orderly listener. */
    DefaultMQPushConsumer start(DefaultMQPushConsumer consumer, MessageListenerOrderly listener) throws Exception {
        consumer.registerMessageListener(listener);
        consumer.start();
        return add(consumer);
    }

    @Override
    public void close() {
        Kit.shutdownQuietly(started);
    }
}
