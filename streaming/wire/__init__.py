"""Wire formats shared by the server and the client library, sans-IO: the NATS core protocol parser
(`nats`), subject matching (`subjects`), server URLs (`urls`), non-blocking socket writes (`sockets`),
the STAN protobufs (`stan_pb`) and start positions (`positions`, which the store persists too)."""
