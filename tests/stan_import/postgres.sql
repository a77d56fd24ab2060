-- nats-streaming-server's SQL store, as its tables are laid out for PostgreSQL (the server does not
-- create them: its operator does, before the first start). Written here from what each table holds;
-- docs/import-stan.md describes them.
CREATE TABLE ServerInfo (uniquerow INTEGER DEFAULT 1 PRIMARY KEY, id VARCHAR(1024), proto BYTEA, version INTEGER);
CREATE TABLE Clients (id VARCHAR(1024) PRIMARY KEY, hbinbox TEXT, proto BYTEA);
CREATE TABLE Channels (
    id INTEGER PRIMARY KEY, name VARCHAR(1024) NOT NULL, maxseq BIGINT DEFAULT 0, maxmsgs INTEGER DEFAULT 0,
    maxbytes BIGINT DEFAULT 0, maxage BIGINT DEFAULT 0, deleted BOOL DEFAULT FALSE
);
CREATE TABLE Messages (id INTEGER, seq BIGINT, timestamp BIGINT, size INTEGER, data BYTEA, PRIMARY KEY (id, seq));
CREATE INDEX messages_by_time ON Messages (timestamp);
CREATE TABLE Subscriptions (
    id INTEGER, subid BIGINT, lastsent BIGINT DEFAULT 0, proto BYTEA, deleted BOOL DEFAULT FALSE, PRIMARY KEY (id, subid)
);
CREATE TABLE SubsPending (
    subid BIGINT, row BIGINT, seq BIGINT DEFAULT 0, lastsent BIGINT DEFAULT 0, pending BYTEA, acks BYTEA,
    PRIMARY KEY (subid, row)
);
CREATE INDEX pending_by_seq ON SubsPending (seq);
CREATE TABLE StoreLock (id VARCHAR(30), tick BIGINT DEFAULT 0);
