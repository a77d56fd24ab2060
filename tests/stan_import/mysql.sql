-- nats-streaming-server's SQL store, as its tables are laid out for MySQL (and MariaDB); made by the
-- operator before the server's first start. Written here from what each table holds (docs/import-stan.md).
CREATE TABLE ServerInfo (uniquerow INT DEFAULT 1 PRIMARY KEY, id VARCHAR(1024), proto BLOB, version INTEGER);
CREATE TABLE Clients (id VARCHAR(1024), hbinbox TEXT, proto BLOB, PRIMARY KEY (id(256)));
CREATE TABLE Channels (
    id INTEGER PRIMARY KEY, name VARCHAR(1024) NOT NULL, maxseq BIGINT UNSIGNED DEFAULT 0, maxmsgs INTEGER DEFAULT 0,
    maxbytes BIGINT DEFAULT 0, maxage BIGINT DEFAULT 0, deleted BOOL DEFAULT FALSE
);
CREATE TABLE Messages (id INTEGER, seq BIGINT UNSIGNED, timestamp BIGINT, size INTEGER, data BLOB, PRIMARY KEY (id, seq));
CREATE TABLE Subscriptions (
    id INTEGER, subid BIGINT UNSIGNED, lastsent BIGINT UNSIGNED DEFAULT 0, proto BLOB, deleted BOOL DEFAULT FALSE,
    PRIMARY KEY (id, subid)
);
CREATE TABLE SubsPending (
    subid BIGINT UNSIGNED, `row` BIGINT UNSIGNED, seq BIGINT UNSIGNED DEFAULT 0, lastsent BIGINT UNSIGNED DEFAULT 0,
    pending BLOB, acks BLOB, PRIMARY KEY (subid, `row`)
);
CREATE TABLE StoreLock (id VARCHAR(30), tick BIGINT UNSIGNED DEFAULT 0);
