"""The server around the store: delivery engine, STAN protocol, Trio server and client, CLIs."""
