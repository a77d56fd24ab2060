"""The embedded NATS core broker: sans-IO protocol (`protocol`), subject matching (`subjects`), and the
Trio server that moves the bytes (`broker`)."""
