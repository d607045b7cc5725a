"""Protocol-correct refusals for protocols whose service is not available on this build.

MQTT gets a CONNACK "server unavailable" (3.1/3.1.1 return code 3; 5.0 reason code 0x88) and gRPC an
HTTP/2 GOAWAY, then the connection closes. The connection ends with ``error="protocol_unavailable"``.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.exceptions
import trio

from mqproxy.context import ConnectionContext
from mqproxy.negotiation import Detected

#: CONNACK with return code 3 "Server unavailable" (MQTT 3.1 and 3.1.1).
CONNACK_UNAVAILABLE_V3 = b"\x20\x02\x00\x03"
#: CONNACK with reason code 0x88 "Server unavailable" and no properties (MQTT 5.0).
CONNACK_UNAVAILABLE_V5 = b"\x20\x03\x00\x88\x00"


async def refuse_mqtt(stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
    level = detected.info.get("mqtt_level", 4)
    await stream.send_all(CONNACK_UNAVAILABLE_V5 if level == 5 else CONNACK_UNAVAILABLE_V3)
    ctx.error = "protocol_unavailable"
    ctx.detail = "MQTT is not enabled on this server"


async def refuse_grpc(stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.initiate_connection()
    data = await stream.receive_some(65536)
    try:
        conn.receive_data(data)
    except h2.exceptions.ProtocolError:
        pass  # h2 already queued its own GOAWAY
    else:
        conn.close_connection(
            error_code=h2.errors.ErrorCodes.REFUSED_STREAM, additional_data=b"gRPC service not enabled"
        )
    await stream.send_all(conn.data_to_send())
    ctx.error = "protocol_unavailable"
    ctx.detail = "gRPC is not enabled on this server"
