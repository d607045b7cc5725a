package mqbench;

import java.time.Duration;
import java.util.Map;
import mqtest.Events;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * Per-send latencies over gRPC (apache.rocketmq.v2.MessagingService) with the 5.x Java client
 * (rocketmq-client-java): one Producer shared by N threads, each sending one message at a time with the
 * synchronous send().
 *
 *   --endpoints HOST:PORT --topic T [--threads 16] [--size 128] [--warmup 5] [--seconds 20]
 */
public final class GrpcSend {
    public static void main(String[] args) throws Exception {
        Map<String, String> o = Latencies.options(args);
        String topic = o.get("topic");
        int threads = Integer.parseInt(o.getOrDefault("threads", "16"));
        byte[] body = Latencies.body(Integer.parseInt(o.getOrDefault("size", "128")));
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = ClientConfiguration.newBuilder()
            .setEndpoints(o.get("endpoints"))
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(10))
            .build();
        Producer producer = provider.newProducerBuilder()
            .setClientConfiguration(config)
            .setTopics(topic)
            .build();
        Events.emit("started");
        Map<String, Object> out = Load.run(threads, Double.parseDouble(o.getOrDefault("warmup", "5")),
            Double.parseDouble(o.getOrDefault("seconds", "20")), () -> {
                Message message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
                producer.send(message);
            });
        producer.close();
        Events.emit("done", "summary", out);
        System.exit(0);
    }
}
