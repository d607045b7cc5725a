package mqbench;

import java.util.Map;
import mqtest.Events;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * Per-send latencies over RocketMQ remoting: one DefaultMQProducer (the 4.x/5.x remoting client, as the
 * benchmark Producer uses it) shared by N threads, each sending one message at a time synchronously.
 *
 *   --namesrv HOST:PORT --topic T [--threads 16] [--size 128] [--warmup 5] [--seconds 20]
 *
 * Prints {"event":"done","sent":..,"failed":..,"tps":..,"p50_ms":..,"p99_ms":..,...}. A send whose status
 * is not SEND_OK counts as failed.
 */
public final class RemotingSend {
    public static void main(String[] args) throws Exception {
        Map<String, String> o = Latencies.options(args);
        String topic = o.get("topic");
        int threads = Integer.parseInt(o.getOrDefault("threads", "16"));
        byte[] body = Latencies.body(Integer.parseInt(o.getOrDefault("size", "128")));
        DefaultMQProducer producer = new DefaultMQProducer("mqbench_latency_producer");
        producer.setNamesrvAddr(o.get("namesrv"));
        producer.setInstanceName("mqbench-" + ProcessHandle.current().pid());
        producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        producer.start();
        Events.emit("started");
        Map<String, Object> out = Load.run(threads, Double.parseDouble(o.getOrDefault("warmup", "5")),
            Double.parseDouble(o.getOrDefault("seconds", "20")), () -> {
                SendResult result = producer.send(new Message(topic, body));
                if (result.getSendStatus() != SendStatus.SEND_OK) {
                    throw new IllegalStateException("send status " + result.getSendStatus());
                }
            });
        producer.shutdown();
        Events.emit("done", "summary", out);
        System.exit(0);
    }
}
