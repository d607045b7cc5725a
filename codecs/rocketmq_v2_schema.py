"""
mqproxy.codecs.rocketmq_v2_schema
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The messages and RPCs of ``apache.rocketmq.v2`` as data, in the line format :mod:`.rocketmq_v2` builds
its descriptors from (see there); enums are declared in :mod:`.rocketmq_v2` itself.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MESSAGES", "RPCS"]

#: Message name -> field lines. Order is declaration order (nested map entries are generated).
MESSAGES: Mapping[str, str] = {
    # definition.proto
    "FilterExpression": "FilterType type = 1; string expression = 2",
    "RetryPolicy": """int32 max_attempts = 1; oneof strategy ExponentialBackoff exponential_backoff = 2;
        oneof strategy CustomizedBackoff customized_backoff = 3""",
    "ExponentialBackoff": "Duration initial = 1; Duration max = 2; float multiplier = 3",
    "CustomizedBackoff": "repeated Duration next = 1",
    "Resource": "string resource_namespace = 1; string name = 2",
    "SubscriptionEntry": "Resource topic = 1; FilterExpression expression = 2",
    "Address": "string host = 1; int32 port = 2",
    "Endpoints": "AddressScheme scheme = 1; repeated Address addresses = 2",
    "Broker": "string name = 1; int32 id = 2; Endpoints endpoints = 3",
    "MessageQueue": """Resource topic = 1; int32 id = 2; Permission permission = 3; Broker broker = 4;
        repeated MessageType accept_message_types = 5""",
    "Digest": "DigestType type = 1; string checksum = 2",
    "SystemProperties": """optional string tag = 1; repeated string keys = 2; string message_id = 3;
        Digest body_digest = 4; Encoding body_encoding = 5; MessageType message_type = 6;
        Timestamp born_timestamp = 7; string born_host = 8; optional Timestamp store_timestamp = 9;
        string store_host = 10; optional Timestamp delivery_timestamp = 11;
        optional string receipt_handle = 12; int32 queue_id = 13; optional int64 queue_offset = 14;
        optional Duration invisible_duration = 15;
        optional int32 delivery_attempt = 16; optional string message_group = 17;
        optional string trace_context = 18; optional Duration orphaned_transaction_recovery_duration = 19;
        optional DeadLetterQueue dead_letter_queue = 20; optional string lite_topic = 21;
        optional int32 priority = 22""",
    "DeadLetterQueue": "string topic = 1; string message_id = 2",
    "Message": """Resource topic = 1; map<string,string> user_properties = 2;
        SystemProperties system_properties = 3; bytes body = 4""",
    "Assignment": "MessageQueue message_queue = 1",
    "Status": "Code code = 1; string message = 2",
    "UA": "Language language = 1; string version = 2; string platform = 3; string hostname = 4",
    "Settings": """optional ClientType client_type = 1; optional Endpoints access_point = 2;
        optional RetryPolicy backoff_policy = 3; optional Duration request_timeout = 4;
        oneof pub_sub Publishing publishing = 5; oneof pub_sub Subscription subscription = 6;
        UA user_agent = 7; Metric metric = 8; map<string,string> client_properties = 9""",
    "Publishing": "repeated Resource topics = 1; int32 max_body_size = 2; bool validate_message_type = 3",
    "Subscription": """optional Resource group = 1; repeated SubscriptionEntry subscriptions = 2;
        optional bool fifo = 3; optional int32 receive_batch_size = 4;
        optional Duration long_polling_timeout = 5;
        optional int32 lite_subscription_quota = 6; optional int32 max_lite_topic_size = 7""",
    "Metric": "bool on = 1; optional Endpoints endpoints = 2",
    "OffsetOption": """oneof offset_type OffsetOption.Policy policy = 1; oneof offset_type int64 offset = 2;
        oneof offset_type int64 tail_n = 3; oneof offset_type int64 timestamp = 4""",
    # service.proto
    "QueryRouteRequest": "Resource topic = 1; Endpoints endpoints = 2",
    "QueryRouteResponse": "Status status = 1; repeated MessageQueue message_queues = 2",
    "SendMessageRequest": "repeated Message messages = 1",
    "SendResultEntry": """Status status = 1; string message_id = 2; string transaction_id = 3;
        int64 offset = 4; string recall_handle = 5""",
    "SendMessageResponse": "Status status = 1; repeated SendResultEntry entries = 2",
    "QueryAssignmentRequest": "Resource topic = 1; Resource group = 2; Endpoints endpoints = 3",
    "QueryAssignmentResponse": "Status status = 1; repeated Assignment assignments = 2",
    "ReceiveMessageRequest": """Resource group = 1; MessageQueue message_queue = 2;
        FilterExpression filter_expression = 3; int32 batch_size = 4;
        optional Duration invisible_duration = 5;
        bool auto_renew = 6; optional Duration long_polling_timeout = 7; optional string attempt_id = 8""",
    "ReceiveMessageResponse": """oneof content Status status = 1; oneof content Message message = 2;
        oneof content Timestamp delivery_timestamp = 3""",
    "AckMessageEntry": "string message_id = 1; string receipt_handle = 2; optional string lite_topic = 3",
    "AckMessageRequest": "Resource group = 1; Resource topic = 2; repeated AckMessageEntry entries = 3",
    "AckMessageResultEntry": "string message_id = 1; string receipt_handle = 2; Status status = 3",
    "AckMessageResponse": "Status status = 1; repeated AckMessageResultEntry entries = 2",
    "ForwardMessageToDeadLetterQueueRequest": """Resource group = 1; Resource topic = 2;
        string receipt_handle = 3; string message_id = 4; int32 delivery_attempt = 5;
        int32 max_delivery_attempts = 6; optional string lite_topic = 7""",
    "ForwardMessageToDeadLetterQueueResponse": "Status status = 1",
    "HeartbeatRequest": "optional Resource group = 1; ClientType client_type = 2",
    "HeartbeatResponse": "Status status = 1",
    "EndTransactionRequest": """Resource topic = 1; string message_id = 2; string transaction_id = 3;
        TransactionResolution resolution = 4; TransactionSource source = 5; string trace_context = 6""",
    "EndTransactionResponse": "Status status = 1",
    "PrintThreadStackTraceCommand": "string nonce = 1",
    "ReconnectEndpointsCommand": "string nonce = 1",
    "ThreadStackTrace": "string nonce = 1; optional string thread_stack_trace = 2",
    "VerifyMessageCommand": "string nonce = 1; Message message = 2",
    "VerifyMessageResult": "string nonce = 1",
    "RecoverOrphanedTransactionCommand": "Message message = 1; string transaction_id = 2",
    "NotifyUnsubscribeLiteCommand": "string lite_topic = 1",
    "TelemetryCommand": """optional Status status = 1; oneof command Settings settings = 2;
        oneof command ThreadStackTrace thread_stack_trace = 3;
        oneof command VerifyMessageResult verify_message_result = 4;
        oneof command RecoverOrphanedTransactionCommand recover_orphaned_transaction_command = 5;
        oneof command PrintThreadStackTraceCommand print_thread_stack_trace_command = 6;
        oneof command VerifyMessageCommand verify_message_command = 7;
        oneof command ReconnectEndpointsCommand reconnect_endpoints_command = 8;
        oneof command NotifyUnsubscribeLiteCommand notify_unsubscribe_lite_command = 9""",
    "NotifyClientTerminationRequest": "optional Resource group = 1",
    "NotifyClientTerminationResponse": "Status status = 1",
    "ChangeInvisibleDurationRequest": """Resource group = 1; Resource topic = 2; string receipt_handle = 3;
        Duration invisible_duration = 4; string message_id = 5; optional string lite_topic = 6;
        optional bool suspend = 7""",
    "ChangeInvisibleDurationResponse": "Status status = 1; string receipt_handle = 2",
    "PullMessageRequest": """Resource group = 1; MessageQueue message_queue = 2; int64 offset = 3;
        int32 batch_size = 4; FilterExpression filter_expression = 5; Duration long_polling_timeout = 6""",
    "PullMessageResponse": """oneof content Status status = 1; oneof content Message message = 2;
        oneof content int64 next_offset = 3""",
    "UpdateOffsetRequest": "Resource group = 1; MessageQueue message_queue = 2; int64 offset = 3",
    "UpdateOffsetResponse": "Status status = 1",
    "GetOffsetRequest": "Resource group = 1; MessageQueue message_queue = 2",
    "GetOffsetResponse": "Status status = 1; int64 offset = 2",
    "QueryOffsetRequest": """MessageQueue message_queue = 1; QueryOffsetPolicy query_offset_policy = 2;
        optional Timestamp timestamp = 3""",
    "QueryOffsetResponse": "Status status = 1; int64 offset = 2",
    "RecallMessageRequest": "Resource topic = 1; string recall_handle = 2",
    "RecallMessageResponse": "Status status = 1; string message_id = 2",
    "SyncLiteSubscriptionRequest": """LiteSubscriptionAction action = 1; Resource topic = 2;
        Resource group = 3; repeated string lite_topic_set = 4; optional int64 version = 5;
        optional OffsetOption offset_option = 6""",
    "SyncLiteSubscriptionResponse": "Status status = 1",
}


#: RPC name -> (client streaming, server streaming); request/response types are ``<Name>Request/Response``
#: except Telemetry (TelemetryCommand both ways).
RPCS: Mapping[str, tuple[bool, bool]] = {
    "QueryRoute": (False, False),
    "Heartbeat": (False, False),
    "SendMessage": (False, False),
    "QueryAssignment": (False, False),
    "ReceiveMessage": (False, True),
    "AckMessage": (False, False),
    "ForwardMessageToDeadLetterQueue": (False, False),
    "PullMessage": (False, True),
    "UpdateOffset": (False, False),
    "GetOffset": (False, False),
    "QueryOffset": (False, False),
    "EndTransaction": (False, False),
    "Telemetry": (True, True),
    "NotifyClientTermination": (False, False),
    "ChangeInvisibleDuration": (False, False),
    "RecallMessage": (False, False),
    "SyncLiteSubscription": (False, False),
}
