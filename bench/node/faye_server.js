// Faye, a Node Bayeux server, as bench/bayeux.py's peer: in memory, no acks. Usage: node faye_server.js <port>
'use strict';
const http = require('http');
const faye = require('faye');

const port = Number(process.argv[2]);
const bayeux = new faye.NodeAdapter({ mount: '/cometd', timeout: 30 });
const server = http.createServer();
bayeux.attach(server);
server.listen(port, '127.0.0.1', () => console.log('listening'));
