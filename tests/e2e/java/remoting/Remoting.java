package mqtest;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.CommandCustomHeader;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;

/**
 * Java remoting client scenarios, the same source for rocketmq-client 4.9.x and 5.x.
 *
 * Usage: {@code Remoting NAMESRV RUN_ID TIMEOUT_S SCENARIO...}. The scenarios run concurrently, each with its
 * own clients (own instance names) and names ({@code <label>_<RUN_ID>}); every event carries "scenario".
 * Each scenario ends with "scenario.done" {ok}; the run ends with "done" {ok} and exits.
 */
public final class Remoting {
    private Remoting() {}

    interface Scenario {
        void run(Kit kit) throws Exception;
    }

    static final Map<String, Scenario> SCENARIOS = new LinkedHashMap<>();

    static {
        SCENARIOS.put("send", Remoting::send);
        SCENARIOS.put("tag-filter", Remoting::tagFilter);
        SCENARIOS.put("sql-filter", Remoting::sqlFilter);
        SCENARIOS.put("orderly", Remoting::orderly);
        SCENARIOS.put("orderly-sql", Remoting::orderlySql);
        SCENARIOS.put("broadcast", Remoting::broadcast);
        SCENARIOS.put("lite-subscribe", Remoting::liteSubscribe);
        SCENARIOS.put("lite-assign", Remoting::liteAssign);
        SCENARIOS.put("delay", Remoting::delay);
        SCENARIOS.put("retry-dlq", Remoting::retryDlq);
        SCENARIOS.put("transaction", Remoting::transaction);
        SCENARIOS.put("query", Remoting::query);
        SCENARIOS.put("unsupported", Remoting::unsupported);
        SCENARIOS.put("admin-fixture", Remoting::adminFixture);
        SCENARIOS.put("orderly-hold", Remoting::orderlyHold);
        SCENARIOS.put("orderly-resume", Remoting::orderlyResume);
        SCENARIOS.put("tx-orphan", Remoting::txOrphan);
        SCENARIOS.put("tx-adopt", Remoting::txAdopt);
    }

    public static void main(String[] args) throws Exception {
        String namesrv = args[0], runId = args[1];
        long timeoutMillis = Long.parseLong(args[2]) * 1000L;
        List<String> names = Arrays.asList(args).subList(3, args.length);
        ExecutorService pool = Executors.newCachedThreadPool();
        Map<String, Future<Boolean>> running = new LinkedHashMap<>();
        for (String name : names) {
            Scenario scenario = SCENARIOS.get(name);
            Kit kit = new Kit(namesrv, runId, name, timeoutMillis);
            running.put(name, pool.submit(() -> runOne(kit, scenario)));
        }
        boolean ok = true;
        for (Map.Entry<String, Future<Boolean>> e : running.entrySet()) {
            try {
                ok &= e.getValue().get(timeoutMillis + 30_000, TimeUnit.MILLISECONDS);
            } catch (Exception ex) {
                Events.error(e.getKey(), ex);
                ok = false;
            }
        }
        Events.emit("done", "ok", ok);
        System.exit(0);
    }

    private static boolean runOne(Kit kit, Scenario scenario) {
        if (scenario == null) {
            kit.emit("scenario.done", "ok", false, "reason", "unknown scenario");
            return false;
        }
        try {
            scenario.run(kit);
            kit.emit("scenario.done", "ok", true);
            return true;
        } catch (Throwable t) {
            Events.error(kit.scenario, t);
            kit.emit("scenario.done", "ok", false, "reason", String.valueOf(t));
            return false;
        }
    }

    // ------------------------------------------------------------------------------------------- produce

    /** Sync, async, oneway, batch and selector-ordered sends; then everything read back by a lite-pull consumer. */
    static void send(Kit kit) throws Exception {
        String topic = kit.name("send");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("send_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 4);

            Message sync = Kit.message(topic, "TagA", "k-sync k-extra", "sync-0");
            sync.putUserProperty("p", "1");
            kit.emit("sent", "mode", "sync", "result", Kit.sendView(producer.send(sync)));

            CountDownLatch asyncDone = new CountDownLatch(1);
            producer.send(Kit.message(topic, "TagA", "k-async", "async-0"), new SendCallback() {
                @Override
                public void onSuccess(SendResult r) {
                    kit.emit("sent", "mode", "async", "result", Kit.sendView(r));
                    asyncDone.countDown();
                }

                @Override
                public void onException(Throwable e) {
                    Events.error("async send", e);
                    asyncDone.countDown();
                }
            });
            asyncDone.await(kit.remainingMillis(), TimeUnit.MILLISECONDS);

            producer.sendOneway(Kit.message(topic, "TagA", "k-oneway", "oneway-0"));
            kit.emit("sent", "mode", "oneway");

            List<Message> batch = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                batch.add(Kit.message(topic, "TagB", "k-batch-" + i, "batch-" + i));
            }
            kit.emit("sent", "mode", "batch", "result", Kit.sendView(producer.send(batch)));

            for (int step = 0; step < 3; step++) {
                for (int order = 0; order < 2; order++) {
                    Message m = Kit.message(topic, "TagC", "order-" + order, "order-" + order + "-" + step);
                    SendResult r = producer.send(m, (mqs, msg, arg) -> mqs.get((Integer) arg % mqs.size()), order);
                    kit.emit("sent", "mode", "ordered", "order", order, "step", step, "result", Kit.sendView(r));
                }
            }

            DefaultLitePullConsumer reader = kit.litePullConsumer(kit.name("send_reader"));
            clients.add(reader);
            reader.setAutoCommit(false);
            reader.start();
            List<MessageQueue> mqs = new ArrayList<>(reader.fetchMessageQueues(topic));
            reader.assign(mqs);
            for (MessageQueue mq : mqs) {
                reader.seek(mq, 0);
            }
            int expected = 12, read = 0;
            while (read < expected) {
                kit.checkDeadline("reading " + expected + " messages back");
                for (MessageExt m : reader.poll(1000)) {
                    kit.emit("read", "msg", Kit.view(m));
                    read++;
                }
            }
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- filters

    /** Push consumer (concurrently, one thread) with a tag filter; end markers close every queue. */
    static void tagFilter(Kit kit) throws Exception {
        String topic = kit.name("tagf");
        filtered(kit, topic, MessageSelector.byTag("TagA || TagC"), (producer, i) -> {
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
        filtered(kit, topic, MessageSelector.bySql("a >= 4 AND b = 'even'"), (producer, i) -> {
            Message m = Kit.message(topic, "TagS", "sql-" + i, "sql-" + i);
            m.putUserProperty("a", String.valueOf(i));
            m.putUserProperty("b", i % 2 == 0 ? "even" : "odd");
            return m;
        }, 10, "TagS", endProps);
    }

    interface MessageMaker {
        Message make(DefaultMQProducer producer, int i);
    }

    private static void filtered(Kit kit, String topic, MessageSelector selector, MessageMaker maker, int count,
                                 String endTag, Map<String, String> endProps) throws Exception {
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name(kit.scenario + "_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 4);
            Kit.EndMarkers ends = new Kit.EndMarkers(4);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name(kit.scenario + "_cg"));
            consumer.subscribe(topic, selector);
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m));
                    ends.record(m);
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            clients.add(consumer);
            List<MessageQueue> mqs = Kit.queues(producer, topic);
            for (int i = 0; i < count; i++) {
                producer.send(maker.make(producer, i), mqs.get(i % mqs.size()));
            }
            kit.sendEndMarkers(producer, topic, endTag, endProps);
            kit.await("an end marker from every queue", ends::complete);
        } finally {
            Kit.shutdownQuietly(clients);
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
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name(label + "_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 4);
            Kit.EndMarkers ends = new Kit.EndMarkers(4);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name(label + "_cg"));
            consumer.subscribe(topic, selector);
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m), "thread", Thread.currentThread().getName());
                    ends.record(m);
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
            consumer.start();
            clients.add(consumer);
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
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- broadcast

    /** Two broadcasting consumers of one group each receive every message. */
    static void broadcast(Kit kit) throws Exception {
        String topic = kit.name("bcast");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("bcast_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 4);
            List<Kit.EndMarkers> ends = new ArrayList<>();
            for (int c = 0; c < 2; c++) {
                Kit.EndMarkers mine = new Kit.EndMarkers(4);
                ends.add(mine);
                String consumerName = "c" + c;
                DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("bcast_cg"));
                Kit.broadcasting(consumer);
                consumer.subscribe(topic, "*");
                consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                    for (MessageExt m : msgs) {
                        kit.emit("received", "consumer", consumerName, "msg", Kit.view(m));
                        mine.record(m);
                    }
                    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                });
                consumer.start();
                clients.add(consumer);
            }
            for (int i = 0; i < 6; i++) {
                producer.send(Kit.message(topic, "TagA", "bc-" + i, "bc-" + i));
            }
            kit.sendEndMarkers(producer, topic, "TagA", Collections.emptyMap());
            kit.await("end markers at both consumers", () -> ends.get(0).complete() && ends.get(1).complete());
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- lite pull

    /** DefaultLitePullConsumer.subscribe: every message polled once, then offsets committed. */
    static void liteSubscribe(Kit kit) throws Exception {
        String topic = kit.name("lites");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("lites_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 4);
            for (int i = 0; i < 8; i++) {
                producer.send(Kit.message(topic, "TagA", "ls-" + i, "ls-" + i));
            }
            DefaultLitePullConsumer consumer = kit.litePullConsumer(kit.name("lites_cg"));
            consumer.setAutoCommit(false);
            consumer.subscribe(topic, "*");
            consumer.start();
            clients.add(consumer);
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
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    /** DefaultLitePullConsumer.assign + seek: reads from the offsets it is told. */
    static void liteAssign(Kit kit) throws Exception {
        String topic = kit.name("litea");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("litea_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 2);
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
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- delay

    /** A delay-level-1 message sent before a plain one arrives after it. */
    static void delay(Kit kit) throws Exception {
        String topic = kit.name("delay");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("delay_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 1);
            CountDownLatch both = new CountDownLatch(2);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("delay_cg"));
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m));
                    both.countDown();
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            clients.add(consumer);
            Message delayed = Kit.message(topic, "TagD", "delayed", "delayed");
            delayed.setDelayTimeLevel(1);
            kit.emit("sent", "body", "delayed", "result", Kit.sendView(producer.send(delayed)));
            kit.emit("sent", "body", "now", "result",
                     Kit.sendView(producer.send(Kit.message(topic, "TagN", "now", "now"))));
            kit.await("both messages", () -> both.getCount() == 0);
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- retry

    /** A consumer that always fails: deliveries from the retry topic, then the message lands in the DLQ. */
    static void retryDlq(Kit kit) throws Exception {
        String topic = kit.name("retry");
        String group = kit.name("retry_cg");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("retry_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 1);
            // the broker creates the retry topic at the consumer's first heartbeat, after the consumer looked
            // for its route; created first, the consumer need not wait for its next route refresh (30 s)
            kit.createTopic(producer, "%RETRY%" + group, 1);
            AtomicInteger deliveries = new AtomicInteger();
            DefaultMQPushConsumer consumer = kit.pushConsumer(group);
            consumer.setMaxReconsumeTimes(2);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("delivery", "queueTopic", ctx.getMessageQueue().getTopic(), "msg", Kit.view(m));
                    deliveries.incrementAndGet();
                }
                ctx.setDelayLevelWhenNextConsume(1);
                return ConsumeConcurrentlyStatus.RECONSUME_LATER;
            });
            consumer.start();
            clients.add(consumer);
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
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- transactions

    /** Commit, rollback and unknown (resolved by the broker's check-back) in one producer group. */
    static void transaction(Kit kit) throws Exception {
        String topic = kit.name("tx");
        List<Object> clients = new ArrayList<>();
        try {
            CountDownLatch checked = new CountDownLatch(1);
            TransactionMQProducer producer = new TransactionMQProducer(kit.name("tx_pg"));
            producer.setNamesrvAddr(kit.namesrv);
            producer.setMqClientApiTimeout(Kit.API_TIMEOUT_MS);
            producer.setInstanceName(Kit.instance("tx"));
            producer.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    switch (msg.getKeys()) {
                        case "tx-commit": return LocalTransactionState.COMMIT_MESSAGE;
                        case "tx-rollback": return LocalTransactionState.ROLLBACK_MESSAGE;
                        default: return LocalTransactionState.UNKNOW;
                    }
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    kit.emit("tx.check", "msg", Kit.view(msg), "transactionId", msg.getTransactionId());
                    if ("tx-unknown".equals(msg.getKeys())) {  // its local transaction committed meanwhile
                        checked.countDown();
                        return LocalTransactionState.COMMIT_MESSAGE;
                    }
                    // a check of an already ended transaction (a stock broker race, see the test): answering
                    // COMMIT again would make that broker store the message twice; UNKNOW changes nothing
                    return LocalTransactionState.UNKNOW;
                }
            });
            producer.start();
            clients.add(producer);
            kit.createTopic(producer, topic, 1);
            Kit.heartbeatNow(producer, topic);
            CountDownLatch end = new CountDownLatch(1);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("tx_cg"));
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m));
                    if (Kit.isEndMarker(m)) {
                        end.countDown();
                    }
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            clients.add(consumer);
            for (String key : new String[] {"tx-commit", "tx-rollback", "tx-unknown"}) {
                TransactionSendResult r = producer.sendMessageInTransaction(Kit.message(topic, "TagT", key, key), null);
                kit.emit("tx.sent", "key", key, "local", r.getLocalTransactionState().name(),
                         "result", Kit.sendView(r));
            }
            kit.await("the check-back of tx-unknown", () -> checked.getCount() == 0);
            kit.sendEndMarkers(producer, topic, "TagE", Collections.emptyMap());
            kit.await("the end marker", () -> end.getCount() == 0);
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- query

    /** queryMessage by key and viewMessage by offset id and by unique id. */
    static void query(Kit kit) throws Exception {
        String topic = kit.name("query");
        String key = kit.name("qk");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("query_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 2);
            long begin = System.currentTimeMillis() - 60_000;
            List<SendResult> sent = new ArrayList<>();
            for (int i = 0; i < 2; i++) {
                sent.add(producer.send(Kit.message(topic, "TagQ", key + " other-" + i, "q-" + i)));
            }
            producer.send(Kit.message(topic, "TagQ", "unrelated", "q-unrelated"));
            for (SendResult r : sent) {
                kit.emit("sent", "result", Kit.sendView(r));
            }
            List<MessageExt> found = new ArrayList<>();
            kit.await("two messages by key", () -> {
                found.clear();
                try {  // the stock broker indexes keys asynchronously: "no message" until it did
                    found.addAll(producer.queryMessage(topic, key, 32, begin, System.currentTimeMillis() + 60_000)
                                     .getMessageList());
                } catch (MQClientException e) {
                    kit.emit("query.retry", "code", e.getResponseCode(), "message", e.getErrorMessage());
                }
                return found.size() >= 2;
            });
            for (MessageExt m : found) {
                kit.emit("queried", "msg", Kit.view(m));
            }
            try {
                QueryResult none = producer.queryMessage(topic, kit.name("absent"), 32, begin,
                                                         System.currentTimeMillis() + 60_000);
                kit.emit("queried.absent", "count", none.getMessageList().size());
            } catch (MQClientException e) {
                kit.emit("queried.absent", "code", e.getResponseCode(), "message", e.getErrorMessage());
            }
            kit.emit("viewed", "by", "offsetMsgId", "msg",
                     Kit.view(producer.viewMessage(topic, sent.get(0).getOffsetMsgId())));
            kit.emit("viewed", "by", "msgId", "msg", Kit.view(producer.viewMessage(topic, sent.get(1).getMsgId())));
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- bad input

    /** Request codes no server knows, sent by the client's own remoting client to the broker and the name server. */
    static void unsupported(Kit kit) throws Exception {
        String topic = kit.name("unsup");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("unsup_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 1);
            producer.send(Kit.message(topic, "TagU", "u", "u"));
            MQClientInstance instance = MQClientManager.getInstance().getOrCreateMQClientInstance(producer);
            String brokerName = Kit.queues(producer, topic).get(0).getBrokerName();
            instance.updateTopicRouteInfoFromNameServer(topic);
            String broker = instance.findBrokerAddressInPublish(brokerName);
            Map<String, String> targets = new LinkedHashMap<>();
            targets.put("broker", broker);
            targets.put("namesrv", kit.namesrv);
            for (Map.Entry<String, String> t : targets.entrySet()) {
                for (int code : new int[] {9999, 5}) {
                    RemotingCommand response = null;
                    for (int attempt = 1; response == null; attempt++) {  // a loaded machine may time out
                        RemotingCommand request = RemotingCommand.createRequestCommand(code, (CommandCustomHeader) null);
                        try {
                            response = instance.getMQClientAPIImpl().getRemotingClient()
                                .invokeSync(t.getValue(), request, 10_000);
                        } catch (Exception e) {
                            Events.error("unsupported " + code + " to " + t.getKey() + " at " + t.getValue(), e);
                            if (attempt == 3) {
                                throw e;
                            }
                        }
                    }
                    kit.emit("raw", "to", t.getKey(), "request", code, "code", response.getCode(),
                             "remark", response.getRemark());
                }
            }
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- admin fixture

    /** Messages and a consumer group for the mqadmin tests: 5 sent, 3 committed, all 5 pulled. */
    static void adminFixture(Kit kit) throws Exception {
        String topic = kit.name("admin");
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("admin_pg"));
            clients.add(producer);
            kit.createTopic(producer, topic, 1);
            for (int i = 0; i < 3; i++) {
                Message m = Kit.message(topic, "TagM", "admin-key-" + i, "admin-" + i);
                m.putUserProperty("n", String.valueOf(i));
                kit.emit("sent", "result", Kit.sendView(producer.send(m)));
            }
            DefaultLitePullConsumer consumer = kit.litePullConsumer(kit.name("admin_cg"));
            consumer.setAutoCommit(false);
            consumer.subscribe(topic, "*");
            consumer.start();
            clients.add(consumer);
            int read = 0;
            while (read < 3) {
                kit.checkDeadline("3 messages");
                read += consumer.poll(1000).size();
            }
            consumer.commitSync();
            for (int i = 3; i < 5; i++) {
                kit.emit("sent", "result", Kit.sendView(producer.send(Kit.message(topic, "TagM", "admin-key-" + i, "admin-" + i))));
            }
            while (read < 5) {  // pulled, never committed: "in flight" for mqadmin consumerProgress
                kit.checkDeadline("2 more messages");
                read += consumer.poll(1000).size();
            }
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    // ------------------------------------------------------------------------------------------- killed clients

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
        Set<String> bodies = Collections.synchronizedSet(new java.util.TreeSet<>());
        DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("okill_cg"));
        try {
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m));
                    bodies.add(Kit.body(m));
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
            consumer.start();
            kit.await("all 4 messages", () -> bodies.size() >= 4);
        } finally {
            consumer.shutdown();
        }
    }

    /** A transactional producer that stores a half message and is killed inside its local transaction. */
    static void txOrphan(Kit kit) throws Exception {
        String topic = kit.name("txkill");
        TransactionMQProducer producer = new TransactionMQProducer(kit.name("txkill_pg"));
        producer.setNamesrvAddr(kit.namesrv);
        producer.setMqClientApiTimeout(Kit.API_TIMEOUT_MS);
        producer.setInstanceName(Kit.instance("txorphan"));
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                kit.emit("tx.local", "transactionId", msg.getTransactionId());
                try {
                    Thread.sleep(Long.MAX_VALUE);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                kit.emit("tx.check", "msg", Kit.view(msg));
                return LocalTransactionState.UNKNOW;
            }
        });
        producer.start();
        kit.createTopic(producer, topic, 1);
        producer.sendMessageInTransaction(Kit.message(topic, "TagT", "tx-orphan", "tx-orphan"), null);
    }

    /** A new producer of the killed one's group answers the check-back; a consumer then gets the message once. */
    static void txAdopt(Kit kit) throws Exception {
        String topic = kit.name("txkill");
        List<Object> clients = new ArrayList<>();
        List<String> received = new CopyOnWriteArrayList<>();
        try {
            TransactionMQProducer producer = new TransactionMQProducer(kit.name("txkill_pg"));
            producer.setNamesrvAddr(kit.namesrv);
            producer.setMqClientApiTimeout(Kit.API_TIMEOUT_MS);
            producer.setInstanceName(Kit.instance("txadopt"));
            producer.setTransactionListener(new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    kit.emit("tx.check", "msg", Kit.view(msg), "transactionId", msg.getTransactionId());
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
            });
            producer.start();
            clients.add(producer);
            Kit.heartbeatNow(producer, topic);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("txkill_cg"));
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m));
                    received.add(Kit.body(m));
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            clients.add(consumer);
            kit.await("the orphan message", () -> received.contains("tx-orphan"));
            // the end marker is sent after the commit: everything the queue holds before it has been seen
            kit.sendEndMarkers(producer, topic, "TagE", Collections.emptyMap());
            kit.await("the end marker", () -> received.stream().anyMatch(b -> b.startsWith("end-")));
        } finally {
            Kit.shutdownQuietly(clients);
        }
    }

    static String utf8(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }
}
