"""Who may connect and what they may do: users, tokens, nkeys and their permissions, TLS, and the same
credentials on the HTTP ports.

- `auth`: checking a NATS CONNECT's credentials (the embedded broker) and reading nkey/creds files;
- `permissions`: a user's publish and subscribe rules, compiled for the hot path;
- `tls`: the server's and the link's TLS contexts;
- `http_auth`: HTTP Basic/Bearer on the HTTP ports, mapped to the same users.
"""
