"""The STAN layer: NATS Streaming's protobuf requests (`requests`), publish group commit (`publisher`),
and the Trio server that answers clients on the embedded broker (`server`)."""
