package mqtest;

import java.util.Collections;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/** Remoting scenarios about transactional messages: commit, rollback, check-back; a killed producer's half message. */
final class TransactionScenarios {
    private TransactionScenarios() {}

    /** Commit, rollback and unknown (resolved by the broker's check-back) in one producer group. */
    static void transaction(Kit kit) throws Exception {
        String topic = kit.name("tx");
        try (Clients clients = new Clients(kit)) {
            CountDownLatch checked = new CountDownLatch(1);
            TransactionListener listener = new TransactionListener() {
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
            };
            TransactionMQProducer producer =
                clients.add(Clients.transactionProducer(kit, kit.name("tx_pg"), "tx", listener));
            kit.createTopic(producer, topic, 1);
            Kit.heartbeatNow(producer, topic);
            CountDownLatch end = new CountDownLatch(1);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("tx_cg"));
            consumer.subscribe(topic, "*");
            clients.start(consumer, Clients.receivingConcurrently(kit, m -> {
                if (Kit.isEndMarker(m)) {
                    end.countDown();
                }
            }));
            for (String key : new String[] {"tx-commit", "tx-rollback", "tx-unknown"}) {
                TransactionSendResult r = producer.sendMessageInTransaction(Kit.message(topic, "TagT", key, key), null);
                kit.emit("tx.sent", "key", key, "local", r.getLocalTransactionState().name(),
                         "result", Kit.sendView(r));
            }
            kit.await("the check-back of tx-unknown", () -> checked.getCount() == 0);
            kit.sendEndMarkers(producer, topic, "TagE", Collections.emptyMap());
            kit.await("the end marker", () -> end.getCount() == 0);
        }
    }

    /** A transactional producer that stores a half message and is killed inside its local transaction. */
    static void txOrphan(Kit kit) throws Exception {
        String topic = kit.name("txkill");
        TransactionListener listener = new TransactionListener() {
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
        };
        TransactionMQProducer producer = Clients.transactionProducer(kit, kit.name("txkill_pg"), "txorphan", listener);
        kit.createTopic(producer, topic, 1);
        producer.sendMessageInTransaction(Kit.message(topic, "TagT", "tx-orphan", "tx-orphan"), null);
    }

    /** A new producer of the killed one's group answers the check-back; a consumer then gets the message once. */
    static void txAdopt(Kit kit) throws Exception {
        String topic = kit.name("txkill");
        List<String> received = new CopyOnWriteArrayList<>();
        TransactionListener listener = new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                kit.emit("tx.check", "msg", Kit.view(msg), "transactionId", msg.getTransactionId());
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        };
        try (Clients clients = new Clients(kit)) {
            TransactionMQProducer producer =
                clients.add(Clients.transactionProducer(kit, kit.name("txkill_pg"), "txadopt", listener));
            Kit.heartbeatNow(producer, topic);
            DefaultMQPushConsumer consumer = kit.pushConsumer(kit.name("txkill_cg"));
            consumer.subscribe(topic, "*");
            clients.start(consumer, Clients.receivingConcurrently(kit, m -> received.add(Kit.body(m))));
            kit.await("the orphan message", () -> received.contains("tx-orphan"));
            // the end marker is sent after the commit: everything the queue holds before it has been seen
            kit.sendEndMarkers(producer, topic, "TagE", Collections.emptyMap());
            kit.await("the end marker", () -> received.stream().anyMatch(b -> b.startsWith("end-")));
        }
    }
}
