#!/usr/bin/env node
// Starts stripe-stateful-mock (the npm package pinned in package.json) for
// sidefx's scenario tests, listening on HOST (default 127.0.0.1) and PORT
// (required). The package's own command listens on every interface; a test
// peer listens on loopback only.
//
//   PORT=12111 LOG_LEVEL=info ./serve.js
//
// LOG_LEVEL is loglevel's: silent, error, warn, info (default) or debug
// (debug logs every request's parameters).
"use strict";
const crypto = require("crypto");
const http = require("http");
const log = require("loglevel");
const { createExpressApp } = require("stripe-stateful-mock");

const host = process.env.HOST || "127.0.0.1";
const port = Number(process.env.PORT);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error(`serve.js: PORT=${JSON.stringify(process.env.PORT || "")}: want a TCP port number`);
  process.exit(2);
}
log.setDefaultLevel("info");
if (process.env.LOG_LEVEL) {
  log.setLevel(process.env.LOG_LEVEL);
}
// Stripe answers every API request with JSON and a Request-Id header. The
// package replays a stored answer with Express's res.send(string), which
// labels it text/html, and sets a Request-Id only on requests with an
// Idempotency-Key (not on a listing); sidefx takes both for Stripe's proof
// that an answer is Stripe's, its lookups and listings included. So every
// answer is labelled JSON (the app's own res.json keeps a type already
// set) and given a Request-Id before the app runs (the app's own, on a
// keyed request, replaces it).
const app = createExpressApp();
const server = http.createServer((req, res) => {
  res.setHeader("Content-Type", "application/json; charset=utf-8");
  res.setHeader("Request-Id", "req_" + crypto.randomBytes(7).toString("hex"));
  app(req, res);
}).listen(port, host, () => {
  log.info(`stripe-stateful-mock listening on ${host}:${port}`);
});
server.on("error", (err) => {
  console.error(`serve.js: ${err.message}`);
  process.exit(1);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => process.exit(0));
}
