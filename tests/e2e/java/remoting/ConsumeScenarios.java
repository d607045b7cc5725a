package mqtest;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/** Remoting scenarios about consuming: filters, orderly, broadcast, lite pull, retry/DLQ, a killed consumer. */
final class ConsumeScenarios {
    private ConsumeScenarios() {}

    // ------------------------------------------------------------------------------------------- filters

    /** Push consumer (concurrently, one thread) with a tag filter; end markers close every queue. */
    static void tagFilter(Kit kit) throws Exception {
        String topic = kit.name("tagf");
        filtered(kit, topic, MessageSelector.byTag("TagA || TagC"), i -> {
            String tag = new String[] {"TagA", "TagB", "TagC"}[i % 3];
            return Kit.message(topic, tag, "tag-" + i, "tag-" + i);
        }, 9, "TagA", Collections.emptyMap());
    }

    /** Push consumer with an SQL92 filter on user properties. */
    static void sqlFilter(Kit kit) throws Exception {
        String topic = kit.name("sqlf");
        Map<String, String> endProps = new HashMap<>();
        endProps.put("a", "1000");
        endProps.put("b", "even");
        filtered(kit, topic, MessageSelector.bySql("a >= 4 AND b = 'even'"), i -> {
            Message m = Kit.message(topic, "TagS", "sql-" + i, "sql-" + i);
            m.putUserProperty("a", String.valueOf(i));
            m.putUserProperty("b", i % 2 == 0 ? "even" : "odd");
            return m;
        }, 10, "TagS", endProps);
    }

    /** The {@code i}-th message a filter scenario sends. */
    interface MessageMaker {
        Message make(int i);
    }

    private static void filtered(Kit kit, String topic, MessageSelector selector, MessageMaker maker, int count,
                                 String endTag, Map<String, String> endProps) throws Exception {
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic(kit.scenario + "_pg", topic, 4);
            Kit.EndMarkers ends = new Kit.EndMarkers(4);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name(kit.scenario + "_cg"));
            consumer.subscribe(topic, selector);
            clients.start(consumer, Clients.receivingConcurrently(kit, ends::record));
            List<MessageQueue> mqs = Kit.queues(producer, topic);
            for (int i = 0; i < count; i++) {
                producer.send(maker.make(i), mqs.get(i % mqs.size()));
            }
            kit.sendEndMarkers(producer, topic, endTag, endProps);
            kit.await("an end marker from every queue", ends::complete);
        }
    }

    // ------------------------------------------------------------------------------------------- orderly

    /** Orderly push consumer with a tag filter: per order key the matching steps arrive in order. */
    static void orderly(Kit kit) throws Exception {
        orderlyFiltered(kit, "ordered", MessageSelector.byTag("TagA"));
    }

    /** The same with an SQL92 filter on a property that says the same as the tag. */
    static void orderlySql(Kit kit) throws Exception {
        orderlyFiltered(kit, "ordsql", MessageSelector.bySql("parity = 'even' AND step >= 0"));
    }

    private static void orderlyFiltered(Kit kit, String label, MessageSelector selector) throws Exception {
        String topic = kit.name(label);
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic(label + "_pg", topic, 4);
            Kit.EndMarkers ends = new Kit.EndMarkers(4);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name(label + "_cg"));
            consumer.subscribe(topic, selector);
            clients.start(consumer, (MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m), "thread", Thread.currentThread().getName());
                    ends.record(m);
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
            for (int step = 0; step < 5; step++) {
                for (int order = 0; order < 3; order++) {
                    String tag = step % 2 == 0 ? "TagA" : "TagB";
                    Message m = Kit.message(topic, tag, "order-" + order, "ord-" + order + "-" + step);
                    m.putUserProperty("parity", step % 2 == 0 ? "even" : "odd");
                    m.putUserProperty("step", String.valueOf(step));
                    producer.send(m, (mqs, msg, arg) -> mqs.get((Integer) arg % mqs.size()), order);
                }
            }
            Map<String, String> endProps = new HashMap<>();
            endProps.put("parity", "even");
            endProps.put("step", "99");
            kit.sendEndMarkers(producer, topic, "TagA", endProps);
            kit.await("an end marker from every queue", ends::complete);
        }
    }

    // ------------------------------------------------------------------------------------------- broadcast

    /** Two broadcasting consumers of one group each receive every message. */
    static void broadcast(Kit kit) throws Exception {
        String topic = kit.name("bcast");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("bcast_pg", topic, 4);
            List<Kit.EndMarkers> ends = new ArrayList<>();
            for (int c = 0; c < 2; c++) {
                Kit.EndMarkers mine = new Kit.EndMarkers(4);
                ends.add(mine);
                String consumerName = "c" + c;
                DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("bcast_cg"));
                Kit.broadcasting(consumer);
                consumer.subscribe(topic, "*");
                clients.start(consumer, (MessageListenerConcurrently) (msgs, ctx) -> {
                    for (MessageExt m : msgs) {
                        kit.emit("received", "consumer", consumerName, "msg", Kit.view(m));
                        mine.record(m);
                    }
                    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                });
            }
            for (int i = 0; i < 6; i++) {
                producer.send(Kit.message(topic, "TagA", "bc-" + i, "bc-" + i));
            }
            kit.sendEndMarkers(producer, topic, "TagA", Collections.emptyMap());
            kit.await("end markers at both consumers", () -> ends.get(0).complete() && ends.get(1).complete());
        }
    }

    // ------------------------------------------------------------------------------------------- lite pull

    /** DefaultLitePullConsumer.subscribe: every message polled once, then offsets committed. */
    static void liteSubscribe(Kit kit) throws Exception {
        String topic = kit.name("lites");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("lites_pg", topic, 4);
            for (int i = 0; i < 8; i++) {
                producer.send(Kit.message(topic, "TagA", "ls-" + i, "ls-" + i));
            }
            DefaultLitePullConsumer consumer = clients.litePullSubscribed("lites_cg", topic);
            int read = 0;
            while (read < 8) {
                kit.checkDeadline("8 polled messages");
                for (MessageExt m : consumer.poll(1000)) {
                    kit.emit("read", "msg", Kit.view(m));
                    read++;
                }
            }
            consumer.commitSync();
            long committed = 0;
            for (MessageQueue mq : consumer.fetchMessageQueues(topic)) {
                Long offset = consumer.committed(mq);
                committed += offset == null ? 0 : Math.max(0, offset);
            }
            kit.emit("committed", "total", committed);
        }
    }

    /** DefaultLitePullConsumer.assign + seek: reads from the offsets it is told. */
    static void liteAssign(Kit kit) throws Exception {
        String topic = kit.name("litea");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("litea_pg", topic, 2);
            MessageQueue first = Kit.queues(producer, topic).get(0);
            for (int i = 0; i < 6; i++) {
                producer.send(Kit.message(topic, "TagA", "la-" + i, "la-" + i), first);
            }
            DefaultLitePullConsumer consumer = kit.litePullConsumer(kit.name("litea_cg"));
            consumer.setAutoCommit(false);
            consumer.start();
            clients.add(consumer);
            MessageQueue mq = null;
            for (MessageQueue candidate : consumer.fetchMessageQueues(topic)) {
                if (candidate.getQueueId() == first.getQueueId()) {
                    mq = candidate;
                }
            }
            consumer.assign(Collections.singletonList(mq));
            // first everything from where a new group starts (0); then the pull task is parked at the end
            // of the queue, so a seek cannot race with a pull still bringing older messages in
            for (long[] phase : new long[][] {{-1, 6}, {3, 3}, {1, 5}}) {
                if (phase[0] >= 0) {
                    consumer.seek(mq, phase[0]);
                }
                int read = 0;
                while (read < phase[1]) {
                    kit.checkDeadline("messages after seek to " + phase[0]);
                    for (MessageExt m : consumer.poll(1000)) {
                        kit.emit("read", "seek", phase[0], "msg", Kit.view(m));
                        read++;
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------------------------------------- retry

    /** A consumer that always fails: deliveries from the retry topic, then the message lands in the DLQ. */
    static void retryDlq(Kit kit) throws Exception {
        String topic = kit.name("retry");
        String group = kit.name("retry_cg");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("retry_pg", topic, 1);
            // the broker creates the retry topic at the consumer's first heartbeat, after the consumer looked
            // for its route; created first, the consumer need not wait for its next route refresh (30 s)
            kit.createTopic(producer, "%RETRY%" + group, 1);
            AtomicInteger deliveries = new AtomicInteger();
            DefaultMQPushConsumer consumer = kit.pushConsumer(group);
            consumer.setMaxReconsumeTimes(2);
            consumer.subscribe(topic, "*");
            clients.start(consumer, (MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("delivery", "queueTopic", ctx.getMessageQueue().getTopic(), "msg", Kit.view(m));
                    deliveries.incrementAndGet();
                }
                ctx.setDelayLevelWhenNextConsume(1);
                return ConsumeConcurrentlyStatus.RECONSUME_LATER;
            });
            kit.emit("sent", "result", Kit.sendView(producer.send(Kit.message(topic, "TagR", "fail-key", "fail-me"))));
            kit.await("three deliveries", () -> deliveries.get() >= 3);

            String dlq = "%DLQ%" + group;
            DefaultLitePullConsumer reader = kit.litePullConsumer(kit.name("retry_dlq_reader"));
            reader.setAutoCommit(false);
            reader.start();
            clients.add(reader);
            List<MessageQueue> dlqQueues = new ArrayList<>();
            kit.await("a route for " + dlq, () -> {
                try {
                    dlqQueues.addAll(reader.fetchMessageQueues(dlq));
                    return !dlqQueues.isEmpty();
                } catch (Exception e) {
                    return false;
                }
            });
            kit.emit("dlq.route", "queues", dlqQueues.size());
            reader.assign(dlqQueues);
            for (MessageQueue mq : dlqQueues) {
                reader.seek(mq, 0);
            }
            boolean found = false;
            while (!found) {
                kit.checkDeadline("the message in " + dlq);
                for (MessageExt m : reader.poll(1000)) {
                    kit.emit("dlq", "msg", Kit.view(m));
                    found = true;
                }
            }
        }
    }

    // ------------------------------------------------------------------------------------------- killed consumer

    /** An orderly consumer that holds every message it gets (and so its queue locks) until it is killed. */
    static void orderlyHold(Kit kit) throws Exception {
        String topic = kit.name("okill");
        DefaultMQProducer producer = kit.producer(kit.name("okill_pg"));
        kit.createTopic(producer, topic, 2);
        for (MessageQueue mq : Kit.queues(producer, topic)) {
            for (int i = 0; i < 2; i++) {
                producer.send(Kit.message(topic, "TagK", "ok", "ok-" + mq.getQueueId() + "-" + i), mq);
            }
        }
        kit.emit("produced", "count", 4, "brokerName", Kit.queues(producer, topic).get(0).getBrokerName());
        DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("okill_cg"));
        consumer.setConsumeThreadMax(2);  // one thread per queue, each held forever
        consumer.setConsumeThreadMin(2);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                kit.emit("holding", "msg", Kit.view(m));
            }
            try {
                Thread.sleep(Long.MAX_VALUE);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
        });
        consumer.start();
        kit.await("being killed", () -> false);
    }

    /** A second orderly consumer of the killed one's group: gets every message the first one held. */
    static void orderlyResume(Kit kit) throws Exception {
        String topic = kit.name("okill");
        Set<String> bodies = Collections.synchronizedSet(new TreeSet<>());
        DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("okill_cg"));
        try {
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener(Clients.receivingOrderly(kit, m -> bodies.add(Kit.body(m))));
            consumer.start();
            kit.await("all 4 messages", () -> bodies.size() >= 4);
        } finally {
            consumer.shutdown();
        }
    }
}
