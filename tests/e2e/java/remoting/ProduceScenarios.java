package mqtest;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.CommandCustomHeader;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;

/** Remoting scenarios about producing and looking messages up: send modes, delay, query, unknown codes, admin. */
final class ProduceScenarios {
    private ProduceScenarios() {}

    /** Sync, async, oneway, batch and selector-ordered sends; then everything read back by a lite-pull consumer. */
    static void send(Kit kit) throws Exception {
        String topic = kit.name("send");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("send_pg", topic, 4);

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

            DefaultLitePullConsumer reader = clients.add(kit.litePullConsumer(kit.name("send_reader")));
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
        }
    }

    /** A delay-level-1 message sent before a plain one arrives after it. */
    static void delay(Kit kit) throws Exception {
        String topic = kit.name("delay");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("delay_pg", topic, 1);
            CountDownLatch both = new CountDownLatch(2);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("delay_cg"));
            consumer.subscribe(topic, "*");
            clients.start(consumer, Clients.receivingConcurrently(kit, m -> both.countDown()));
            Message delayed = Kit.message(topic, "TagD", "delayed", "delayed");
            delayed.setDelayTimeLevel(1);
            kit.emit("sent", "body", "delayed", "result", Kit.sendView(producer.send(delayed)));
            kit.emit("sent", "body", "now", "result",
                     Kit.sendView(producer.send(Kit.message(topic, "TagN", "now", "now"))));
            kit.await("both messages", () -> both.getCount() == 0);
        }
    }

    /** queryMessage by key and viewMessage by offset id and by unique id. */
    static void query(Kit kit) throws Exception {
        String topic = kit.name("query");
        String key = kit.name("qk");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("query_pg", topic, 2);
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
        }
    }

    /** Request codes no server knows, sent by the client's own remoting client to the broker and the name server. */
    static void unsupported(Kit kit) throws Exception {
        String topic = kit.name("unsup");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("unsup_pg", topic, 1);
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
        }
    }

    /** Messages and a consumer group for the mqadmin tests: 5 sent, 3 committed, all 5 pulled. */
    static void adminFixture(Kit kit) throws Exception {
        String topic = kit.name("admin");
        try (Clients clients = new Clients(kit)) {
            DefaultMQProducer producer = clients.producerWithTopic("admin_pg", topic, 1);
            for (int i = 0; i < 3; i++) {
                Message m = Kit.message(topic, "TagM", "admin-key-" + i, "admin-" + i);
                m.putUserProperty("n", String.valueOf(i));
                kit.emit("sent", "result", Kit.sendView(producer.send(m)));
            }
            DefaultLitePullConsumer consumer = clients.litePullSubscribed("admin_cg", topic);
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
        }
    }
}
