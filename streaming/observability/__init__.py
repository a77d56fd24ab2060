"""What the server tells about itself: Prometheus metrics, the monitoring pages, and the event log.

- `metrics`: counters and histograms (an engine and server observer) and what is read at scrape time;
- `monitor`: the monitoring HTTP app (`/metrics`, `/streaming/serverz`, ...);
- `event_log`: one JSON line per delivery-engine event, for the Spark storm analysis;
- `event_schema`: the event log's record schema, shared with `spark/`.
"""
