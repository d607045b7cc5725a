package mqtest;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/** Java 4.x remoting client scenarios (rocketmq-client 4.9.x); usage: Remoting4 SCENARIO NAMESRV TOPIC. */
public final class Remoting4 {
    public static void main(String[] args) throws Exception {
        String scenario = args[0], namesrv = args[1], topic = args[2];
        if (!scenario.equals("send-sync")) {
            Events.emit("done", "ok", false, "reason", "unknown scenario " + scenario);
            return;
        }
        DefaultMQProducer producer = new DefaultMQProducer("smoke_producer");
        producer.setNamesrvAddr(namesrv);
        producer.start();
        try {
            SendResult r = producer.send(new Message(topic, "TagA", "key1", "hello".getBytes("UTF-8")));
            Events.emit("sent", "status", r.getSendStatus().name(), "msgId", r.getMsgId(),
                        "queue", r.getMessageQueue().getQueueId(), "offset", r.getQueueOffset());
            Events.emit("done", "ok", true);
        } catch (Exception e) {
            Events.error("send", e);
            Events.emit("done", "ok", false);
        } finally {
            producer.shutdown();
        }
    }
}
