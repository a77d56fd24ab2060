"""Wire formats shared by the server and the client library, sans-IO: the NATS core protocol parser
(`nats`), subject matching (`subjects`), non-blocking socket writes (`sockets`) and the STAN
protobufs (`stan_pb`)."""
