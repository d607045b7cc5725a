package mqtest;

import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Pop consumption through the 5.x remoting client (rocketmq-client 5.x only): a push consumer with
 * clientRebalance=false asks the broker for its queues (QUERY_ASSIGNMENT) and, for a group that
 * {@code mqadmin setConsumeMode ... -m POP} switched, pops instead of pulling (POP_MESSAGE, ACK_MESSAGE; a failed
 * message comes back through CHANGE_MESSAGE_INVISIBLETIME with a higher reconsume count).
 *
 * Usage: {@code Remoting5Pop NAMESRV RUN_ID TIMEOUT_S TOPIC GROUP}; the topic exists and the mode is set.
 * Events: "sent", "received" {msg, popCk, queueTopic}, "scenario.done", "done".
 */
public final class Remoting5Pop {
    private Remoting5Pop() {}

    public static void main(String[] args) throws Exception {
        Kit kit = new Kit(args[0], args[1], "pop", Long.parseLong(args[2]) * 1000L);
        String topic = args[3], group = args[4];
        boolean ok = false;
        List<Object> clients = new ArrayList<>();
        try {
            DefaultMQProducer producer = kit.producer(kit.name("pop_pg"));
            clients.add(producer);
            kit.awaitRoute(producer, topic, 4);
            Set<String> done = ConcurrentHashMap.newKeySet();
            DefaultMQPushConsumer consumer = kit.pushConsumer(group);
            consumer.setClientRebalance(false);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    kit.emit("received", "msg", Kit.view(m), "queueTopic", ctx.getMessageQueue().getTopic(),
                             "queueId", ctx.getMessageQueue().getQueueId(),
                             "popCk", m.getProperty(MessageConst.PROPERTY_POP_CK));
                    if ("pop-fail".equals(Kit.body(m)) && m.getReconsumeTimes() == 0) {
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                }
                for (MessageExt m : msgs) {
                    done.add(Kit.body(m));
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            clients.add(consumer);
            List<String> bodies = new ArrayList<>();
            for (int i = 0; i < 5; i++) {
                bodies.add("pop-" + i);
            }
            bodies.add("pop-fail");
            for (String body : bodies) {
                kit.emit("sent", "body", body, "result",
                         Kit.sendView(producer.send(Kit.message(topic, "TagP", body, body))));
            }
            kit.await("every message consumed", () -> done.containsAll(bodies));
            ok = true;
        } catch (Throwable t) {
            Events.error("pop", t);
        } finally {
            Kit.shutdownQuietly(clients);
        }
        kit.emit("scenario.done", "ok", ok);
        Events.emit("done", "ok", ok);
        System.exit(0);
    }
}
