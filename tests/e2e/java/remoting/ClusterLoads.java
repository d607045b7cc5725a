package mqtest;

import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Long-running remoting clients for the cluster-mode tests: one client per JVM, pointed at any name server
 * list, running until the test says stop. Usage: {@code ClusterLoads COMMAND --key value ...}.
 *
 * <ul>
 * <li>{@code produce --namesrv N --topic T --group G [--count C] [--interval-ms I] [--keys K]}: sends C
 *   messages (C = 0: until stdin closes), body {@code <prefix>-<i>}; with K > 0 message i has key
 *   {@code i % K}, sequence {@code i / K} and goes to queue {@code key % queues} (MessageQueueSelector).
 *   Events "sent" {i, body, key, seq, result} or "send.failed" {i, body, error}; at the end "produced".</li>
 * <li>{@code consume --namesrv N --topic T --group G [--orderly true] [--work-ms W]}: a push consumer from the
 *   first offset until stdin closes. Events "allocated" {topic, cid, cids, queues, total} whenever its share
 *   changes, "received" {msg, start}; orderly also "batch" {queueId, start, end, bodies} per listener call
 *   (wall-clock millis, comparable across JVMs of one machine).</li>
 * <li>{@code tx-send ... --count C}: a transactional producer whose local transactions all end UNKNOW (its
 *   check-backs answer UNKNOW too); "tx.sent" per message; then it waits for stdin to close (or a kill).</li>
 * <li>{@code tx-check --namesrv N --topic T --group G}: a producer of that group that answers every
 *   check-back COMMIT ("tx.check" {transactionId, msg}) until stdin closes.</li>
 * </ul>
 * Common options: {@code --label L} (names the client instance and every event), {@code --poll-ms}
 * (route refresh, default 1000, so a changed route is seen within a second), {@code --timeout S} (a failure
 * deadline, default 120). Every command starts with "started" and ends with "done" {ok}.
 */
public final class ClusterLoads {
    private ClusterLoads() {}

    private static final Map<String, String> OPTS = new HashMap<>();
    private static final CountDownLatch STDIN_CLOSED = new CountDownLatch(1);
    private static String label;

    public static void main(String[] args) throws Exception {
        String command = args[0];
        for (int i = 1; i + 1 < args.length; i += 2) {
            OPTS.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        label = opt("label", command);
        // rebalance every second (default 20 s): a consumer that joins or leaves is noticed at once
        System.setProperty("rocketmq.client.rebalance.waitInterval", opt("rebalance-ms", "1000"));
        watchStdin();
        boolean ok = false;
        try {
            switch (command) {
                case "produce": produce(); break;
                case "consume": consume(); break;
                case "tx-send": txSend(); break;
                case "tx-check": txCheck(); break;
                default: throw new IllegalArgumentException("unknown command " + command);
            }
            ok = true;
        } catch (Throwable t) {
            Events.error(label, t);
        }
        emit("done", "ok", ok);
        System.exit(0);
    }

    private static String opt(String key, String fallback) {
        return OPTS.getOrDefault(key, fallback);
    }

    private static int intOpt(String key, int fallback) {
        return Integer.parseInt(opt(key, String.valueOf(fallback)));
    }

    private static void emit(String event, Object... keyValues) {
        Object[] all = new Object[keyValues.length + 4];
        all[0] = "label";
        all[1] = label;
        all[2] = "at";
        all[3] = System.currentTimeMillis();
        System.arraycopy(keyValues, 0, all, 4, keyValues.length);
        Events.emit(event, all);
    }

    private static void watchStdin() {
        Thread t = new Thread(() -> {
            InputStream in = System.in;
            try {
                while (in.read() >= 0) {
                    // the test never writes; EOF (stdin closed) is the stop signal
                }
            } catch (IOException e) {
                // closed as well
            }
            STDIN_CLOSED.countDown();
        }, "stdin-watch");
        t.setDaemon(true);
        t.start();
    }

    /** Waits until the test closes stdin; fails at the deadline. */
    private static void awaitRelease() throws InterruptedException {
        if (!STDIN_CLOSED.await(intOpt("timeout", 120), TimeUnit.SECONDS)) {
            throw new IllegalStateException("not released within the deadline");
        }
    }

    private static <T extends ClientConfig> T configure(T client) {
        client.setNamesrvAddr(opt("namesrv", null));
        client.setInstanceName(Kit.instance(label));
        client.setPollNameServerInterval(intOpt("poll-ms", 1000));
        client.setHeartbeatBrokerInterval(intOpt("heartbeat-ms", 5000));
        client.setMqClientApiTimeout(Kit.API_TIMEOUT_MS);
        return client;
    }

    // ------------------------------------------------------------------------------------------- produce

    static void produce() throws Exception {
        String topic = opt("topic", null);
        int count = intOpt("count", 0), keys = intOpt("keys", 0), interval = intOpt("interval-ms", 0);
        String prefix = opt("prefix", label);
        DefaultMQProducer producer = configure(new DefaultMQProducer(opt("group", null)));
        producer.setSendMsgTimeout(intOpt("send-timeout-ms", 10_000));  // the first send includes class loading and a route look-up
        producer.start();
        int sent = 0, failed = 0;
        try {
            emit("started", "clientId", producer.buildMQClientId());
            for (int i = 0; count == 0 ? STDIN_CLOSED.getCount() > 0 : i < count; i++) {
                String body = prefix + "-" + i;
                int key = keys > 0 ? i % keys : -1, seq = keys > 0 ? i / keys : i;
                Message m = Kit.message(topic, "TagL", keys > 0 ? "key-" + key : body, body);
                try {
                    SendResult r = keys > 0
                        ? producer.send(m, (mqs, msg, arg) -> mqs.get((Integer) arg % mqs.size()), key)
                        : producer.send(m);
                    emit("sent", "i", i, "body", body, "key", key, "seq", seq, "result", Kit.sendView(r));
                    sent++;
                } catch (Exception e) {
                    emit("send.failed", "i", i, "body", body, "error", String.valueOf(e));
                    failed++;
                }
                if (interval > 0) {
                    STDIN_CLOSED.await(interval, TimeUnit.MILLISECONDS);  // a pace, cut short by the stop signal
                }
            }
        } finally {
            emit("produced", "sent", sent, "failed", failed);
            producer.shutdown();
        }
    }

    // ------------------------------------------------------------------------------------------- consume

    /** Averagely, as by default, reporting each change of this consumer's share of a topic. */
    static final class ObservedAllocation implements AllocateMessageQueueStrategy {
        private final AllocateMessageQueueAveragely inner = new AllocateMessageQueueAveragely();
        private final Map<String, String> last = new HashMap<>();

        @Override
        public synchronized List<MessageQueue> allocate(String group, String cid, List<MessageQueue> mqAll,
                                                        List<String> cidAll) {
            List<MessageQueue> mine = inner.allocate(group, cid, mqAll, cidAll);
            TreeSet<Integer> ids = new TreeSet<>();
            for (MessageQueue mq : mine) {
                ids.add(mq.getQueueId());
            }
            String topic = mqAll.isEmpty() ? "" : mqAll.get(0).getTopic();
            String now = cidAll + "/" + ids + "/" + mqAll.size();
            if (!now.equals(last.put(topic, now))) {
                emit("allocated", "topic", topic, "cid", cid, "cids", new ArrayList<>(cidAll),
                     "queues", new ArrayList<>(ids), "total", mqAll.size());
            }
            return mine;
        }

        @Override
        public String getName() {
            return "AVG";
        }
    }

    static void consume() throws Exception {
        boolean orderly = Boolean.parseBoolean(opt("orderly", "false"));
        int workMs = intOpt("work-ms", 0);
        DefaultMQPushConsumer consumer = configure(new DefaultMQPushConsumer(opt("group", null)));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAllocateMessageQueueStrategy(new ObservedAllocation());
        consumer.setPersistConsumerOffsetInterval(1000);
        consumer.subscribe(opt("topic", null), "*");
        if (orderly) {
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                long start = System.currentTimeMillis();
                List<String> bodies = new ArrayList<>();
                for (MessageExt m : msgs) {
                    emit("received", "start", start, "msg", Kit.view(m));
                    bodies.add(Kit.body(m));
                }
                work(workMs);
                emit("batch", "queueId", ctx.getMessageQueue().getQueueId(), "start", start,
                     "end", System.currentTimeMillis(), "bodies", bodies);
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                long start = System.currentTimeMillis();
                for (MessageExt m : msgs) {
                    emit("received", "start", start, "msg", Kit.view(m));
                }
                work(workMs);
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        consumer.start();
        try {
            emit("started", "clientId", consumer.buildMQClientId());
            awaitRelease();
        } finally {
            consumer.shutdown();
            emit("stopped");
        }
    }

    /** A listener's stand-in for work: the message is being processed for this long. */
    private static void work(int millis) {
        if (millis > 0) {
            try {
                Thread.sleep(millis);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    // ------------------------------------------------------------------------------------------- transactions

    /** A transaction producer of the {@code group} option whose local transactions and check-backs answer
     * {@code local} and {@code check}; every check-back is emitted as a {@code "tx.check"} event. */
    private static TransactionMQProducer txProducer(LocalTransactionState local, LocalTransactionState check) {
        TransactionMQProducer producer = configure(new TransactionMQProducer(opt("group", null)));
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return local;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                emit("tx.check", "transactionId", msg.getTransactionId(), "answer", check.name(), "msg", Kit.view(msg));
                return check;
            }
        });
        return producer;
    }

    static void txSend() throws Exception {
        String topic = opt("topic", null);
        TransactionMQProducer producer = txProducer(LocalTransactionState.UNKNOW, LocalTransactionState.UNKNOW);
        producer.start();
        emit("started", "clientId", producer.buildMQClientId());
        for (int i = 0; i < intOpt("count", 1); i++) {
            String body = opt("prefix", label) + "-" + i;
            TransactionSendResult r = producer.sendMessageInTransaction(Kit.message(topic, "TagT", body, body), null);
            emit("tx.sent", "body", body, "local", r.getLocalTransactionState().name(), "result", Kit.sendView(r));
        }
        try {
            awaitRelease();
        } finally {
            producer.shutdown();
        }
    }

    static void txCheck() throws Exception {
        String topic = opt("topic", null);
        TransactionMQProducer producer = txProducer(LocalTransactionState.COMMIT_MESSAGE,
                                                    LocalTransactionState.COMMIT_MESSAGE);
        producer.start();
        // brokers learn of a producer group from heartbeats to the brokers of the topics it knows
        Kit.heartbeatNow(producer, topic);
        emit("started", "clientId", producer.buildMQClientId());
        try {
            awaitRelease();
        } finally {
            producer.shutdown();
        }
    }
}
