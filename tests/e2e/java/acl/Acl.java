package mqtest;

import java.nio.charset.StandardCharsets;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * The 4.x Java client signing every request with ACL 1.0 (AclClientRPCHook from rocketmq-acl).
 *
 * <pre>
 * Acl NAMESRV ACCESS_KEY SECRET_KEY send TOPIC COUNT            -> "sent" per message or one "send.failed"
 * Acl NAMESRV ACCESS_KEY SECRET_KEY consume TOPIC GROUP COUNT MS -> "received" per message
 * </pre>
 * Ends with one "done" event ({"ok": bool}).
 */
public final class Acl {
    private Acl() {}

    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        RPCHook hook = new AclClientRPCHook(new SessionCredentials(args[1], args[2]));
        boolean ok;
        try {
            ok = "send".equals(args[3]) ? send(namesrv, hook, args[4], Integer.parseInt(args[5]))
                : consume(namesrv, hook, args[4], args[5], Integer.parseInt(args[6]), Long.parseLong(args[7]));
        } catch (Exception e) {
            Events.error(args[3], e);
            ok = false;
        }
        Events.emit("done", "ok", ok);
        System.exit(0);
    }

    private static boolean send(String namesrv, RPCHook hook, String topic, int count) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer("acl_pg_" + System.nanoTime(), hook);
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("acl-p-" + System.nanoTime());
        producer.setSendMsgTimeout(10_000);
        producer.setRetryTimesWhenSendFailed(0);
        producer.start();
        try {
            for (int i = 0; i < count; i++) {
                Message msg = new Message(topic, "TagA", ("acl-" + i).getBytes(StandardCharsets.UTF_8));
                try {
                    SendResult result = producer.send(msg);
                    Events.emit("sent", "topic", topic, "status", result.getSendStatus().name(),
                                "msg_id", result.getMsgId());
                } catch (MQClientException e) {
                    failed(topic, e.getResponseCode(), e);
                    return true;
                } catch (MQBrokerException e) {
                    failed(topic, e.getResponseCode(), e);
                    return true;
                }
            }
            return true;
        } finally {
            producer.shutdown();
        }
    }

    private static void failed(String topic, int code, Exception e) {
        StringBuilder text = new StringBuilder(String.valueOf(e.getMessage()));
        for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
            text.append(" | ").append(c.getMessage());
        }
        Events.emit("send.failed", "topic", topic, "code", code, "message", text.toString());
    }

    private static boolean consume(String namesrv, RPCHook hook, String topic, String group, int count,
                                   long timeoutMs) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group, hook, new AllocateMessageQueueAveragely());
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("acl-c-" + System.nanoTime());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        Set<String> seen = ConcurrentHashMap.newKeySet();
        CountDownLatch all = new CountDownLatch(count);
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            for (MessageExt m : msgs) {
                String body = new String(m.getBody(), StandardCharsets.UTF_8);
                if (seen.add(body)) {
                    Events.emit("received", "topic", m.getTopic(), "body", body);
                    all.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        try {
            return all.await(timeoutMs, TimeUnit.MILLISECONDS);
        } finally {
            consumer.shutdown();
        }
    }
}
