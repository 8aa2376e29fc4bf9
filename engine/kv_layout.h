// kv_layout: how a KV budget is handed to sequences.
//
// Paged (vLLM): a pool of fixed-size blocks, given out one block at a time
// as a sequence grows, shared between sequences with equal prefixes.
// Contiguous (before vLLM): one run of slots per request, reserved whole at
// admission for everything it may ever hold.
#ifndef SERVELAB_KV_LAYOUT_H
#define SERVELAB_KV_LAYOUT_H

typedef enum kv_layout { KV_LAYOUT_PAGED = 0, KV_LAYOUT_CONTIGUOUS = 1 } kv_layout;

#endif
