"""The Bayeux (CometD) front door: long-polling sessions with the ack extension, on the durable engine."""
