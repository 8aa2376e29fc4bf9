// serve: an OpenAI-compatible HTTP server on one engine (`servelab serve`).
//
// libmicrohttpd runs one thread per connection; one engine thread steps the
// engine while any request is queued or running, so every client's
// sequences share each step (continuous batching). See serve.c for the
// locking invariant.
//
//   POST /v1/completions       prompt (text or token ids), sampling fields, stream
//   POST /v1/chat/completions  messages through the plain template (serve_api.h)
//   GET  /v1/models            the one model served
//   GET  /health               status and the KV pool (blocks free/used/cached)
//   GET  /metrics              Prometheus text, vLLM's metric names
#ifndef SERVELAB_SERVE_H
#define SERVELAB_SERVE_H

#include <stddef.h>

#include "engine/engine.h"
#include "base/error.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

typedef struct serve_config {
    const char* host;        // address to listen on (default 127.0.0.1)
    int port;                // 0 = any free port (server_port tells which)
    const char* model_name;  // the name clients give as `model`
    int max_queue;           // requests in flight (queued or running) at most; more get 429
    size_t max_body_bytes;   // request bodies at most this; more get 413
    int read_timeout_s;      // a connection silent this long is closed
    int max_connections;     // open connections at most
    int max_header_count;    // headers per request at most; more get 431
    size_t max_header_bytes; // bytes of header names and values at most; more get 431
    bool external_stepping;  // no engine thread: the caller steps with server_step (servelab lab --serve)
} serve_config;

// The defaults: 127.0.0.1:8000, 256 requests in flight, 1 MiB bodies,
// 10 s read timeout, 512 connections, 100 headers of 16 KiB together.
serve_config serve_config_default(void);

typedef struct server server;

// Starts the engine thread and the HTTP daemon. The model and tokenizer
// (NULL: token-id prompts only) must outlive the server.
int server_start(server** out, const model* m, const tokenizer* tok, const engine_config* engine_config,
                 const serve_config* config, error_info* err);

// The port listened on (the one chosen when config->port was 0).
int server_port(const server* s);

// Stops accepting, cancels what is in flight, joins the threads, frees.
void server_stop(server* s);

// ---- external stepping: the lab steps the server's engine ----
//
// With config->external_stepping no engine thread runs: requests wait in
// the queue until the caller steps. The caller's thread is then the engine
// thread of serve.c's invariant: only it calls server_step and reads
// server_engine(), and it may read that engine between its own steps
// without the lock (connections never touch the engine).

// Admits queued requests, cancels abandoned ones and, when there is work,
// runs one engine step and publishes its tokens (*stepped: a step ran).
// -1 when the server was not started for external stepping, has stopped,
// or the step failed (then every request in flight has failed too).
int server_step(server* s, bool* stepped, error_info* err);

// Whether a request waits for a step (queued, running, or not yet admitted).
bool server_has_work(server* s);

// The engine the server runs (read it only from the stepping thread).
const engine* server_engine(const server* s);

typedef struct server_activity {
    int connections; // open client connections
    int in_flight;   // requests queued or running
    int submitted;   // of those, not yet admitted into the engine (they wait for a step)
} server_activity;
server_activity server_activity_now(server* s);

// The address listened on, as given (numeric).
const char* server_host(const server* s);

#endif
