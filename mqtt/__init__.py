"""MQTT 3.1.1 / 5.0 gateway: sessions over light message queues."""
