"""The STAN front door: NATS Streaming clients over the embedded NATS core broker (`broker`). The
door's requests are decoded in `requests`, answered in `server`, clients are tracked in `clients`,
and deliveries and PubAcks leave through its port (`outbound`)."""
