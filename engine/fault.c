// fault: the named bugs, their one-line descriptions, and the set this
// process runs with (engine/fault.h).
#include "engine/fault.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

fault_set fault_enabled_set = 0;

typedef struct fault_entry {
    const char* name;
    const char* description;
} fault_entry;

// Indexed by fault_id; names are what --fault and breaks_with take.
static const fault_entry fault_table[FAULT_COUNT] = {
    [FAULT_PAGED_WRONG_SLOT] = {"paged-wrong-slot", "the newest token's K and V are stored one slot early in its tail block (slot mapping off by one), so attention reads a wrong slot"},
    [FAULT_SKIP_LAST_BLOCK] = {"skip-last-block", "paged attention never reads the last block of the context"},
    [FAULT_KV_COUNT_DROPPED] = {"kv-count-dropped", "KV bytes written are not counted"},
    [FAULT_KV_COUNT_DOUBLED] = {"kv-count-doubled", "KV bytes written and read are counted twice"},
    [FAULT_WEIGHT_COUNT_DOUBLED] = {"weight-count-doubled", "weight bytes read are counted twice"},
    [FAULT_FLOPS_ALLOCATED] = {"flops-allocated", "attention FLOPs are counted over the allocated slots, not the context"},
    [FAULT_NO_COW] = {"no-cow", "no copy-on-write: a fork writes into the block it shares with its parent"},
    [FAULT_PREFIX_NO_REFCOUNT] = {"prefix-no-refcount", "the prefix cache shares blocks without counting references"},
    [FAULT_STATIC_BATCHING] = {"static-batching", "\"continuous\" batching admits new requests only when the batch is empty"},
    [FAULT_RESERVE_REQUEST_LENGTH] = {"reserve-request-length",
                                      "a contiguous reservation covers the request's length, not the max context"},
    [FAULT_UNBATCHED_DECODE] = {"unbatched-decode", "a batched step runs its rows one by one, reading the weights each time"},
    [FAULT_ROUND_FLOOR] = {"round-floor", "quantization rounds down instead of to the nearest code"},
    [FAULT_ZERO_POINT_PLUS] = {"zero-point-plus", "the asymmetric zero-point uses +r_min/s instead of -r_min/s"},
    [FAULT_SYM_SCALE_FULL_RANGE] = {"sym-scale-full-range", "the symmetric scale uses r_max - r_min instead of max|r|"},
    [FAULT_WRAP_NOT_CLIP] = {"wrap-not-clip", "out-of-range codes wrap around instead of saturating at the edge code"},
    [FAULT_GROUP_TENSOR_MAX] = {"group-tensor-max", "every group's scale uses the whole tensor's range, not the group's"},
    [FAULT_AWQ_NO_SCALING] = {"awq-no-scaling", "AWQ searches its scales, then quantizes the unscaled weights"},
    [FAULT_GPTQ_NO_FEEDBACK] = {"gptq-no-feedback", "GPTQ rounds each column without feeding its error into the next"},
    [FAULT_TP_FULL_WEIGHTS] = {"tp-full-weights", "a tensor-parallel shard streams the whole feed-forward block (w1, w3, w2), not its slice"},
    [FAULT_QUANT_KEEPS_FP16] = {"quant-keeps-fp16", "a quantized model keeps a copy of its unquantized weights allocated beside the packed ones"},
    [FAULT_W8A8_FLOAT_ACTIVATIONS] = {"w8a8-float-activations", "W8A8 never quantizes its activations: it runs as W8A16"},
    [FAULT_PAGED_ALLOCATE_AHEAD] = {"paged-allocate-ahead",
                                    "paged admission takes blocks for the prompt + max_tokens at once, not as tokens come"},
    [FAULT_COW_SHORT_COPY] = {"cow-short-copy", "copy-on-write copies one slot fewer than the shared block holds"},
    [FAULT_KV_INT8_SCALES_UNCOUNTED] = {"kv-int8-scales-uncounted",
                                        "int8 KV's fp32 scales (one per token, layer, K/V and head) are not counted in the KV bytes"},
    [FAULT_EVICT_MOST_RECENT] = {"evict-most-recent",
                                 "a full pool evicts the most recently used cached prefix block instead of the least"},
    [FAULT_PREEMPT_OLDEST] = {"preempt-oldest", "preemption takes the running sequence admitted first, not the one admitted last"},
    [FAULT_RECOMPUTE_EXTRA_TOKEN] = {"recompute-extra-token",
                                          "a preempted sequence's last token is appended once more before it is recomputed"},
    [FAULT_CHUNK_IGNORES_BUDGET] = {"chunk-ignores-budget",
                                    "a prefill chunk is sized by the whole step budget, not by what the decodes left of it"},
    [FAULT_TP_ALLREDUCE_ONE_WAY] = {"tp-allreduce-one-way",
                                    "an all-reduce counts its reduce-scatter only: (N-1)/N of the message per shard, not 2(N-1)/N"},
    [FAULT_SPEC_NO_RESIDUAL] = {"spec-no-residual",
                                "speculative sampling replaces a refused guess with a draw from p instead of the residual max(0, p - q)"},
    [FAULT_SPEC_NO_ROLLBACK] = {"spec-no-rollback",
                                "speculative decoding keeps the KV blocks of refused guesses instead of giving them back"},
};

fault_set fault_install(fault_set set) {
    fault_set previous = fault_enabled_set;
    fault_enabled_set = set;
    return previous;
}

int fault_lookup(const char* name) {
    for (int i = 0; i < FAULT_COUNT; i++)
        if (strcmp(fault_table[i].name, name) == 0) return i;
    return -1;
}

const char* fault_name(fault_id id) { return id >= 0 && id < FAULT_COUNT ? fault_table[id].name : "?"; }

const char* fault_description(fault_id id) {
    return id >= 0 && id < FAULT_COUNT ? fault_table[id].description : "?";
}

int fault_set_parse(const char* text, fault_set* out, error_info* err) {
    fault_set set = 0;
    const char* p = text;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        const char* start = p;
        while (*p && *p != ',' && !isspace((unsigned char)*p)) p++;
        size_t length = (size_t)(p - start);
        while (isspace((unsigned char)*p)) p++;
        char name[64];
        if (length == 0 || length >= sizeof name || (*p && *p != ',')) {
            char known[1024];
            fault_set_describe(((fault_set)1 << FAULT_COUNT) - 1, known, sizeof known);
            return error_set(err, "--fault '%s': expected fault names separated by commas (known: %s)", text, known);
        }
        memcpy(name, start, length);
        name[length] = '\0';
        int id = fault_lookup(name);
        if (id < 0) {
            char known[1024];
            fault_set_describe(((fault_set)1 << FAULT_COUNT) - 1, known, sizeof known);
            return error_set(err, "--fault: unknown fault '%s' (known: %s; `servelab info --faults` says what each breaks)",
                             name, known);
        }
        set |= (fault_set)1 << id;
        if (*p == '\0') break;
        p++; // the comma
    }
    *out = set;
    return 0;
}

void fault_set_describe(fault_set set, char* out, size_t capacity) {
    size_t used = 0;
    if (capacity) out[0] = '\0';
    for (int i = 0; i < FAULT_COUNT; i++) {
        if (!((set >> i) & 1u)) continue;
        int n = snprintf(out + used, capacity > used ? capacity - used : 0, "%s%s", used ? "," : "", fault_table[i].name);
        if (n > 0) used += (size_t)n;
    }
}
