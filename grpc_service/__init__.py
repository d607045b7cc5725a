"""RocketMQ 5 apache.rocketmq.v2.MessagingService over h2, on the shared port."""
