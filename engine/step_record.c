#include "engine/step_record.h"

#include <inttypes.h>

const char* block_event_name(block_event_kind kind) {
    switch (kind) {
    case BLOCK_ALLOCATE: return "allocate";
    case BLOCK_FREE: return "free";
    case BLOCK_SHARE: return "share";
    case BLOCK_COPY: return "copy";
    case BLOCK_EVICT: return "evict";
    case BLOCK_CACHE: return "cache";
    }
    return "?";
}

// The kernel_traffic fields as JSON members (no braces).
static void write_traffic(const kernel_traffic* t, FILE* out) {
    fprintf(out,
            "\"weight_bytes\":%" PRIu64 ",\"kv_bytes_read\":%" PRIu64 ",\"kv_bytes_written\":%" PRIu64
            ",\"activation_bytes\":%" PRIu64 ",\"matmul_flops\":%" PRIu64 ",\"attention_flops\":%" PRIu64,
            t->weight_bytes_read, t->kv_bytes_read, t->kv_bytes_written, t->activation_bytes, t->matmul_flops,
            t->attention_flops);
}

void step_record_write_json(const step_record* r, FILE* out) {
    fprintf(out, "{\"step\":%" PRIu64 ",\"clock_s\":%.6f,\"wall_ns\":%" PRIu64 ",\"prefill_tokens\":%d,\"decode_tokens\":%d",
            r->step, r->clock_seconds, r->wall_ns, r->prefill_tokens, r->decode_tokens);
    if (r->device_ns) fprintf(out, ",\"device_ns\":%" PRIu64, r->device_ns); // --backend cuda only
    fputc(',', out);
    write_traffic(&r->traffic, out);
    fprintf(out,
            ",\"tp\":{\"shards\":%d,\"link\":\"%s\",\"allreduces\":%d,\"allreduce_bytes\":%" PRIu64
            ",\"allreduce_s\":%.9f,\"shard_traffic\":[",
            r->tp_shards, r->tp_link ? r->tp_link : "", r->n_allreduces, r->allreduce_bytes, r->allreduce_seconds);
    for (int k = 0; k < r->tp_shards && k < MAX_TP_SHARDS; k++) {
        fputs(k ? ",{" : "{", out);
        write_traffic(&r->shard_traffic[k], out);
        fputc('}', out);
    }
    fputs("]}", out);
    fprintf(out,
            ",\"pool\":{\"blocks_total\":%d,\"blocks_free\":%d,\"blocks_used\":%d,\"blocks_cached\":%d,"
            "\"slots_total\":%" PRId64 ",\"slots_used\":%" PRId64 ",\"slots_allocated\":%" PRId64
            ",\"tail_waste_slots\":%" PRId64 ",\"reserved_unused_slots\":%" PRId64
            ",\"external_fragmentation_slots\":%" PRId64 "}",
            r->blocks_total, r->blocks_free, r->blocks_used, r->blocks_cached, r->slots_total, r->slots_used,
            r->slots_allocated, r->tail_waste_slots, r->reserved_unused_slots, r->external_fragmentation_slots);
    fprintf(out,
            ",\"queues\":{\"waiting\":%d,\"running\":%d,\"finished\":%d},\"preempted\":%d,"
            "\"prefix_hit_tokens\":%d,\"copy_bytes\":%" PRIu64,
            r->n_waiting, r->n_running, r->n_finished, r->n_preempted, r->prefix_hit_tokens,
            r->copy_bytes);
    fputs(",\"sequences\":[", out);
    for (int i = 0; i < r->n_sequences; i++) {
        const step_sequence* s = &r->sequences[i];
        fprintf(out, "%s{\"id\":%d,\"request\":%d,\"phase\":\"%s\",\"tokens\":%d,\"context\":%d,\"tail_fill\":%d,\"blocks\":[",
                i ? "," : "", s->id, s->request_id, s->phase == PHASE_PREFILL ? "prefill" : "decode", s->n_tokens,
                s->context_length, s->tail_fill);
        for (int b = 0; b < s->n_table; b++) fprintf(out, "%s%d", b ? "," : "", r->block_ids[s->table_offset + b]);
        fputs("]}", out);
    }
    fputs("],\"events\":[", out);
    for (int i = 0; i < r->n_events; i++) {
        const block_event* e = &r->events[i];
        fprintf(out, "%s{\"kind\":\"%s\",\"block\":%d,\"sequence\":%d", i ? "," : "", block_event_name(e->kind),
                e->block, e->sequence);
        if (e->kind == BLOCK_COPY) fprintf(out, ",\"copy\":%d", e->other_block);
        fputc('}', out);
    }
    fputs("],\"finished\":[", out);
    for (int i = 0; i < r->n_finished_now; i++) fprintf(out, "%s%d", i ? "," : "", r->finished_ids[i]);
    fputs("]}\n", out);
}
