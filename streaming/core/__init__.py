"""The delivery core, shared by every front door: the sans-IO engine (`engine`), the commit pipeline
(`pipeline`), the publish group commit (`group_commit`), the Trio runtime (`runtime`), the port front
doors implement (`outbound`), client-facing error texts (`errors`), and all of it assembled (`service`)."""
