package mqtest;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * What every scenario of the Java remoting drivers needs: names unique to one run, clients pointed at the
 * name server under test, topics created and routed before consumers start, message views for events, and
 * deadlines (a scenario never waits longer than its deadline; waits end on conditions, not on sleeps).
 *
 * Compiles against rocketmq-client 4.9.x and 5.x alike (only APIs both have).
 */
public final class Kit {
    /** Tag and property of the per-queue end markers: a consumer that saw one marker per queue saw the queue. */
    public static final String END_PROP = "end";

    /** Admin and name-server calls (route look-ups, offsets): the 3 s default is short on a loaded machine. */
    static final int API_TIMEOUT_MS = 10_000;
    private static final AtomicInteger INSTANCES = new AtomicInteger();
    private static final long STARTED = java.lang.management.ManagementFactory.getRuntimeMXBean().getStartTime();

    public final String namesrv;
    public final String runId;
    public final String scenario;
    private final long deadline;

    public Kit(String namesrv, String runId, String scenario, long timeoutMillis) {
        this.namesrv = namesrv;
        this.runId = runId;
        this.scenario = scenario;
        this.deadline = System.currentTimeMillis() + timeoutMillis;
    }

    /** A topic or group name unique to this run: {@code <label>_<runId>}. */
    public String name(String label) {
        return label + "_" + runId;
    }

    /** Emit an event tagged with this scenario. */
    public void emit(String event, Object... keyValues) {
        Object[] all = new Object[keyValues.length + 4];
        all[0] = "scenario";
        all[1] = scenario;
        all[2] = "ms";  // since the JVM started: for reading logs, never asserted on
        all[3] = System.currentTimeMillis() - STARTED;
        System.arraycopy(keyValues, 0, all, 4, keyValues.length);
        Events.emit(event, all);
    }

    public long remainingMillis() {
        return deadline - System.currentTimeMillis();
    }

    /** Throws once the scenario's deadline has passed (so a waiting loop ends with an error event). */
    public void checkDeadline(String waitingFor) {
        if (remainingMillis() <= 0) {
            throw new IllegalStateException("deadline passed while waiting for " + waitingFor);
        }
    }

    /** Polls a condition every 100 ms until it holds; fails at the scenario deadline. */
    public void await(String what, Condition condition) throws Exception {
        while (!condition.holds()) {
            checkDeadline(what);
            Thread.sleep(100);
        }
    }

    public interface Condition {
        boolean holds() throws Exception;
    }

    public static String instance(String label) {
        return label + "-" + INSTANCES.incrementAndGet() + "-" + System.nanoTime();
    }

    public DefaultMQProducer producer(String group) throws MQClientException {
        DefaultMQProducer producer = new DefaultMQProducer(group);
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName(instance(scenario + "-p"));
        producer.setSendMsgTimeout(10_000);
        producer.setMqClientApiTimeout(API_TIMEOUT_MS);
        producer.start();
        return producer;
    }

    /**
     * A push consumer starting from the first offset, with one consume thread: messages of a queue are then
     * handed to the listener in queue order, so "everything before the end marker was seen" holds.
     */
    public DefaultMQPushConsumer pushConsumer(String group) {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(instance(scenario + "-c"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeThreadMin(1);
        consumer.setConsumeThreadMax(1);
        consumer.setMqClientApiTimeout(API_TIMEOUT_MS);
        return consumer;
    }

    public DefaultLitePullConsumer litePullConsumer(String group) {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(instance(scenario + "-l"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPollTimeoutMillis(1000);
        consumer.setMqClientApiTimeout(API_TIMEOUT_MS);
        return consumer;
    }

    /** Switch a push consumer to BROADCASTING (the MessageModel enum moved packages between 4.x and 5.x). */
    @SuppressWarnings({"unchecked", "rawtypes"})
    public static void broadcasting(DefaultMQPushConsumer consumer) throws Exception {
        for (java.lang.reflect.Method m : DefaultMQPushConsumer.class.getMethods()) {
            if (m.getName().equals("setMessageModel")) {
                Class<Enum> type = (Class<Enum>) m.getParameterTypes()[0];
                m.invoke(consumer, Enum.valueOf(type, "BROADCASTING"));
                return;
            }
        }
        throw new IllegalStateException("no setMessageModel");
    }

    /**
     * Learn {@code topic}'s route and heartbeat to its brokers now. Brokers learn a producer group (the target
     * of transaction check-backs) from heartbeats, which a client sends every 30 s; this saves the wait.
     */
    public static void heartbeatNow(org.apache.rocketmq.client.ClientConfig client, String topic) {
        MQClientInstance instance = MQClientManager.getInstance().getOrCreateMQClientInstance(client);
        instance.updateTopicRouteInfoFromNameServer(topic);
        instance.sendHeartbeatToAllBrokerWithLock();
    }

    /** Create {@code topic} with {@code queues} queues through the producer's admin path and wait for its route. */
    public void createTopic(DefaultMQProducer producer, String topic, int queues) throws Exception {
        // through MQAdminImpl: DefaultMQProducer.createTopic's signatures differ between 4.x and 5.x
        MQClientManager.getInstance().getOrCreateMQClientInstance(producer).getMQAdminImpl()
            .createTopic("TBW102", topic, queues);
        awaitRoute(producer, topic, queues);
    }

    /** Wait until the name server routes {@code topic} with {@code queues} write queues. */
    public void awaitRoute(DefaultMQProducer producer, String topic, int queues) throws Exception {
        await("route of " + topic, () -> {
            try {
                return producer.fetchPublishMessageQueues(topic).size() == queues;
            } catch (MQClientException e) {
                return false;
            }
        });
    }

    /** The topic's queues sorted by id (from the name server). */
    public static List<MessageQueue> queues(DefaultMQProducer producer, String topic) throws MQClientException {
        List<MessageQueue> queues = new ArrayList<>(producer.fetchPublishMessageQueues(topic));
        queues.sort((a, b) -> Integer.compare(a.getQueueId(), b.getQueueId()));
        return queues;
    }

    public static Message message(String topic, String tag, String keys, String body) {
        return new Message(topic, tag, keys, body.getBytes(StandardCharsets.UTF_8));
    }

    /** Send one end marker (tag {@code tag}, property end=true, {@code props} too) to every queue of the topic. */
    public void sendEndMarkers(DefaultMQProducer producer, String topic, String tag, Map<String, String> props)
            throws Exception {
        for (MessageQueue mq : queues(producer, topic)) {
            Message marker = message(topic, tag, "end", "end-" + mq.getQueueId());
            marker.putUserProperty(END_PROP, "true");
            for (Map.Entry<String, String> e : props.entrySet()) {
                marker.putUserProperty(e.getKey(), e.getValue());
            }
            producer.send(marker, mq);
        }
    }

    public static boolean isEndMarker(MessageExt msg) {
        return "true".equals(msg.getUserProperty(END_PROP));
    }

    public static String body(MessageExt msg) {
        return new String(msg.getBody(), StandardCharsets.UTF_8);
    }

    /** What a test asserts on about one message. */
    public static Map<String, Object> view(MessageExt msg) {
        Map<String, Object> v = new LinkedHashMap<>();
        v.put("topic", msg.getTopic());
        v.put("body", body(msg));
        v.put("tags", msg.getTags());
        v.put("keys", msg.getKeys());
        v.put("queueId", msg.getQueueId());
        v.put("queueOffset", msg.getQueueOffset());
        v.put("msgId", msg.getMsgId());
        v.put("reconsumeTimes", msg.getReconsumeTimes());
        v.put("commitLogOffset", msg.getCommitLogOffset());
        v.put("sysFlag", msg.getSysFlag());
        v.put("props", new TreeMap<>(msg.getProperties()));
        return v;
    }

    public static Map<String, Object> sendView(SendResult r) {
        Map<String, Object> v = new LinkedHashMap<>();
        v.put("status", r.getSendStatus().name());
        v.put("msgId", r.getMsgId());
        v.put("offsetMsgId", r.getOffsetMsgId());
        v.put("queueId", r.getMessageQueue().getQueueId());
        v.put("brokerName", r.getMessageQueue().getBrokerName());
        v.put("queueOffset", r.getQueueOffset());
        v.put("transactionId", r.getTransactionId());
        v.put("regionId", r.getRegionId());
        return v;
    }

    /** Counts end markers per queue id and says when every queue of a topic sent one. */
    public static final class EndMarkers {
        private final int queues;
        private final Set<Integer> seen = new HashSet<>();

        public EndMarkers(int queues) {
            this.queues = queues;
        }

        public synchronized boolean record(MessageExt msg) {
            if (isEndMarker(msg)) {
                seen.add(msg.getQueueId());
            }
            return seen.size() >= queues;
        }

        public synchronized boolean complete() {
            return seen.size() >= queues;
        }
    }

    public static void shutdownQuietly(Collection<?> clients) {
        for (Object c : clients) {
            try {
                if (c instanceof DefaultMQProducer) {
                    ((DefaultMQProducer) c).shutdown();
                } else if (c instanceof DefaultMQPushConsumer) {
                    ((DefaultMQPushConsumer) c).shutdown();
                } else if (c instanceof DefaultLitePullConsumer) {
                    ((DefaultLitePullConsumer) c).shutdown();
                }
            } catch (RuntimeException e) {
                Events.error("shutdown", e);
            }
        }
    }
}
