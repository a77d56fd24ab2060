"""The HTTP pull door: pull consumers with ETag-conditional acknowledgement, on the durable engine."""
