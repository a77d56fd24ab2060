"""The NATS transport: the bus the STAN door runs on.

- `bus`: what the STAN door needs of the NATS side (`Bus`), and how both buses turn a read into input
  spans of the core;
- `broker`: the embedded NATS core broker (the default: clients connect to this process);
- `link`: a link to an external NATS server or cluster (`nats_server`), the server one more client;
- `memory`: giving freed buffers back to the system after a connection goes.
"""
