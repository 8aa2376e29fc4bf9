#include "lab/ui_panes.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/devices.h"
#include "engine/tokenizer.h"

const int UI_SPEEDS[8] = {1, 2, 5, 10, 20, 50, 100, 0};

// The inside of a pane's frame.
static ui_rect inner(ui_rect r) { return (ui_rect){r.x + 1, r.y + 1, r.w - 2, r.h - 2}; }

static ui_color owner_color(int32_t id) { return (ui_color)(UI_OWNER0 + id % UI_OWNER_COLORS); }
static char owner_letter(int32_t id) { return (char)('a' + id % 26); }

static const char* state_name(sequence_state s) {
    static const char* const NAMES[] = {"waiting", "prefill", "decode", "preempted", "finished"};
    return NAMES[s];
}

static void human_bytes(char* out, size_t n, double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(out, n, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

// A horizontal bar: `fraction` of width filled.
static void bar(ui_screen* s, int x, int y, int width, double fraction, ui_color color, const char* glyph) {
    if (fraction < 0) fraction = 0;
    if (fraction > 1) fraction = 1;
    int filled = (int)lround(fraction * width);
    for (int i = 0; i < width; i++)
        ui_put(s, x + i, y, 1, i < filled ? color : UI_FREE, 0, i < filled ? glyph : s->glyphs->empty);
}

// ---- Requests -------------------------------------------------------------------------

static void draw_requests(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = dashboard_primary(d);
    const step_record* rec = dashboard_primary_record(d);
    ui_printf(s, r.x, r.y, r.w, UI_DEFAULT, UI_BOLD, "waiting %d  running %d  finished %d  (%s)", e->n_waiting,
              e->n_running, e->n_finished, e->config.layout == KV_LAYOUT_PAGED ? "paged" : "contiguous");
    const tokenizer* t = d->source.tokenizer;
    int y = r.y + 1;
    // Newest first would move rows under the cursor; ids are stable, so list by id.
    int first = 0;
    if (d->selected >= r.h - 1) first = d->selected - (r.h - 2);
    for (int id = first; id < e->n_sequences && y < r.y + r.h; id++, y++) {
        const sequence* q = &e->sequences[id];
        bool selected = id == d->selected;
        int x = r.x;
        x += ui_printf(s, x, y, r.w, owner_color(id), selected ? UI_REVERSE : UI_BOLD, "%c%c#%d", selected ? '>' : ' ',
                       owner_letter(id), id);
        x += ui_printf(s, x, y, r.x + r.w - x, UI_DEFAULT, 0, " %-9s ", state_name(q->state));
        bool ran = false;
        if (rec)
            for (int k = 0; k < rec->n_sequences; k++) ran |= rec->sequences[k].id == id;
        for (int i = 0; i < q->n_tokens && x < r.x + r.w; i++) {
            char piece[64];
            if (t) snprintf(piece, sizeof piece, "%s", tok_decode_piece(t, i ? q->tokens[i - 1] : TOK_BOS_ID, q->tokens[i]));
            else snprintf(piece, sizeof piece, i ? " %d" : "%d", q->tokens[i]);
            if (i == 0 && q->tokens[0] == TOK_BOS_ID && t) continue;
            bool newest = i == q->n_tokens - 1 && i >= q->n_prompt;
            int attr = i >= q->n_prompt ? UI_BOLD : 0;
            // The newest token is reverse video and bracketed (for monochrome).
            if (newest && ran) {
                x += ui_put(s, x, y, r.x + r.w - x, UI_GOOD, UI_REVERSE, "[");
                x += ui_put(s, x, y, r.x + r.w - x, UI_GOOD, UI_REVERSE | UI_BOLD, piece);
                x += ui_put(s, x, y, r.x + r.w - x, UI_GOOD, UI_REVERSE, "]");
            } else x += ui_put(s, x, y, r.x + r.w - x, i >= q->n_prompt ? owner_color(id) : UI_DEFAULT, attr, piece);
        }
    }
}

// ---- Block tables ----------------------------------------------------------------------

// How many block tables in the record hold `block` (its sharing, from the record).
static int table_references(const step_record* rec, int32_t block) {
    int n = 0;
    for (int k = 0; k < rec->n_sequences; k++) {
        const step_sequence* q = &rec->sequences[k];
        for (int i = 0; i < q->n_table; i++) n += rec->block_ids[q->table_offset + i] == block;
    }
    return n;
}

// The paged engine the panes draw, or NULL with a line saying why not.
static const engine* paged_view(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = dashboard_view_engine(d, KV_LAYOUT_PAGED);
    if (!e) ui_put(s, r.x, r.y, r.w, UI_DEFAULT, UI_DIM, "the lesson's engine is contiguous: it has no blocks");
    return e;
}

static void draw_block_tables(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = paged_view(s, r, d);
    if (!e) return;
    const step_record* rec = dashboard_view_record(d, KV_LAYOUT_PAGED);
    int block_size = e->pool.block_size;
    if (!rec) {
        ui_printf(s, r.x, r.y, r.w, UI_DEFAULT, 0, "paged, block size %d: no step yet (space steps)", block_size);
        return;
    }
    int x = r.x;
    x += ui_printf(s, x, r.y, r.w, UI_DEFAULT, UI_BOLD, "step %llu events:", (unsigned long long)rec->step);
    int shown = 0;
    for (int i = 0; i < rec->n_events; i++) {
        const block_event* ev = &rec->events[i];
        if (ev->kind == BLOCK_COPY)
            x += ui_printf(s, x, r.y, r.x + r.w - x, UI_BAD, UI_BOLD, " COW %d->%d(%c)", ev->block, ev->other_block,
                           ev->sequence >= 0 ? owner_letter(ev->sequence) : '-');
        else if (ev->kind == BLOCK_EVICT)
            x += ui_printf(s, x, r.y, r.x + r.w - x, UI_BAD, UI_BOLD, " EVICT %d", ev->block);
        else continue;
        shown++;
    }
    if (!shown) ui_put(s, x, r.y, r.x + r.w - x, UI_DEFAULT, 0, " none");
    int y = r.y + 1;
    for (int k = 0; k < rec->n_sequences && y < r.y + r.h; k++) {
        const step_sequence* q = &rec->sequences[k];
        ui_printf(s, r.x, y++, r.w, owner_color(q->id), UI_BOLD, "%c#%d %s ctx %d blocks %d tail %d/%d", owner_letter(q->id),
                  q->id, q->phase == PHASE_PREFILL ? "prefill" : "decode", q->context_length, q->n_table, q->tail_fill,
                  block_size);
        if (y >= r.y + r.h) break;
        x = r.x + 2;
        for (int i = 0; i < q->n_table; i++) {
            int32_t b = rec->block_ids[q->table_offset + i];
            int refs = table_references(rec, b);
            char cell[32];
            if (refs > 1) snprintf(cell, sizeof cell, "[%d x%d]", b, refs);
            else snprintf(cell, sizeof cell, "[%d]", b);
            if (x + (int)strlen(cell) > r.x + r.w) {
                if (++y >= r.y + r.h) break;
                x = r.x + 2;
            }
            x += ui_put(s, x, y, r.x + r.w - x, refs > 1 ? UI_SHARED : owner_color(q->id), refs > 1 ? UI_BOLD : 0, cell);
        }
        y++;
    }
}

// ---- Block pool ------------------------------------------------------------------------

static void draw_block_pool(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = paged_view(s, r, d);
    if (!e) return;
    const kv_pool* pool = &e->pool;
    const step_record* rec = dashboard_view_record(d, KV_LAYOUT_PAGED);
    int used = 0, shared = 0, cached = 0, free_blocks = 0;
    for (int b = 0; b < pool->n_blocks; b++) {
        const kv_block* k = &pool->blocks[b];
        int owners = k->ref_count - (k->cached ? 1 : 0);
        if (k->ref_count == 0) free_blocks++;
        else if (owners == 0) cached++;
        else if (owners > 1) shared++, used++;
        else used++;
    }
    ui_printf(s, r.x, r.y, r.w, UI_DEFAULT, UI_BOLD, "used %d shared %d cached %d free %d /%d", used, shared, cached,
              free_blocks, pool->n_blocks);
    int x = r.x;
    x += ui_put(s, x, r.y + 1, r.w, UI_DEFAULT, 0, "legend: ");
    x += ui_put(s, x, r.y + 1, r.x + r.w - x, UI_OWNER0, UI_BOLD, "a-z owner ");
    x += ui_put(s, x, r.y + 1, r.x + r.w - x, UI_SHARED, UI_BOLD, "S shared ");
    x += ui_put(s, x, r.y + 1, r.x + r.w - x, UI_CACHED, 0, "c cached ");
    ui_put(s, x, r.y + 1, r.x + r.w - x, UI_FREE, UI_DIM, ". free");
    // Owner of each block from the step record's tables (the first holder).
    int cells = (r.h - 2) * r.w;
    for (int b = 0; b < pool->n_blocks && b < cells; b++) {
        const kv_block* k = &pool->blocks[b];
        int owners = k->ref_count - (k->cached ? 1 : 0);
        int cx = r.x + b % r.w, cy = r.y + 2 + b / r.w;
        if (k->ref_count == 0) ui_put(s, cx, cy, 1, UI_FREE, UI_DIM, ".");
        else if (owners == 0) ui_put(s, cx, cy, 1, UI_CACHED, 0, "c");
        else if (owners > 1) ui_put(s, cx, cy, 1, UI_SHARED, UI_BOLD | UI_REVERSE, "S");
        else {
            int32_t owner = -1;
            if (rec)
                for (int q = 0; q < rec->n_sequences && owner < 0; q++)
                    for (int i = 0; i < rec->sequences[q].n_table; i++)
                        if (rec->block_ids[rec->sequences[q].table_offset + i] == b) owner = rec->sequences[q].id;
            char letter[2] = {owner >= 0 ? owner_letter(owner) : '?', 0};
            ui_put(s, cx, cy, 1, owner >= 0 ? owner_color(owner) : UI_DEFAULT, UI_REVERSE, letter);
        }
    }
    if (pool->n_blocks > cells)
        ui_printf(s, r.x + r.w - 12, r.y + r.h - 1, 12, UI_DEFAULT, 0, "+%d more", pool->n_blocks - cells);
}

// ---- Fragmentation ---------------------------------------------------------------------

static void fragmentation_rows(ui_screen* s, ui_rect r, int y, const char* label, const dashboard* d,
                               kv_layout layout) {
    const step_record* rec = dashboard_view_record(d, layout);
    ui_printf(s, r.x, y, r.w, UI_DEFAULT, UI_BOLD, "%s", label);
    if (!rec) {
        ui_put(s, r.x + 12, y, r.w - 12, UI_DEFAULT, 0,
               dashboard_view_engine(d, layout) ? "(idle)" : "(not in the lesson's engine)");
        return;
    }
    const char* names[4] = {"tokens", "tail waste", "reserved", "ext. frag"};
    int64_t values[4] = {rec->slots_used, rec->tail_waste_slots, rec->reserved_unused_slots,
                         rec->external_fragmentation_slots};
    ui_color colors[4] = {UI_GOOD, UI_BAD, UI_BAD, UI_CACHED};
    int width = r.w - 34 > 4 ? r.w - 34 : 4;
    for (int i = 0; i < 4; i++) {
        double pct = rec->slots_total ? 100.0 * (double)values[i] / (double)rec->slots_total : 0;
        int x = r.x + 1;
        x += ui_printf(s, x, y + 1 + i, r.w, UI_DEFAULT, 0, "%-10s ", names[i]);
        bar(s, x, y + 1 + i, width, pct / 100.0, colors[i], i == 0 ? s->glyphs->full : s->glyphs->shade);
        ui_printf(s, x + width + 1, y + 1 + i, r.x + r.w - x - width - 1, UI_DEFAULT, 0, "%7lld %5.1f%%",
                  (long long)values[i], pct);
    }
}

static void draw_fragmentation(ui_screen* s, ui_rect r, const dashboard* d) {
    fragmentation_rows(s, r, r.y, "paged", d, KV_LAYOUT_PAGED);
    if (r.h >= 10) fragmentation_rows(s, r, r.y + 5, "contiguous", d, KV_LAYOUT_CONTIGUOUS);
    const engine* paged = dashboard_view_engine(d, KV_LAYOUT_PAGED);
    const engine* contiguous = dashboard_view_engine(d, KV_LAYOUT_CONTIGUOUS);
    if (r.h >= 11 && paged && contiguous)
        ui_printf(s, r.x, r.y + 10, r.w, UI_DEFAULT, UI_DIM, "slots in pool: paged %lld, contiguous %lld (same bytes)",
                  (long long)engine_pool_slots(paged), (long long)engine_pool_slots(contiguous));
}

// ---- Memory traffic --------------------------------------------------------------------

static void draw_traffic(ui_screen* s, ui_rect r, const dashboard* d, const ui_view* v) {
    const step_record* rec = dashboard_primary_record(d);
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    const device_model* dev = &devices[v->device % n_devices];
    if (!rec) {
        ui_put(s, r.x, r.y, r.w, UI_DEFAULT, 0, "no step yet");
    } else {
        const kernel_traffic* t = &rec->traffic;
        uint64_t parts[4] = {t->weight_bytes_read, t->kv_bytes_read, t->kv_bytes_written, t->activation_bytes};
        const char* names[4] = {"W weights", "R KV read", "K KV written", "A activations"};
        const char* glyphs[4] = {s->glyphs->full, s->glyphs->shade, s->glyphs->light, s->glyphs->dots};
        ui_color colors[4] = {UI_OWNER0, UI_OWNER1, UI_OWNER2, UI_OWNER3};
        uint64_t total = parts[0] + parts[1] + parts[2] + parts[3];
        uint64_t flops = t->matmul_flops + t->attention_flops;
        int x = r.x;
        for (int i = 0; i < 4; i++) {
            int w = total ? (int)lround((double)parts[i] / (double)total * r.w) : 0;
            for (int k = 0; k < w && x < r.x + r.w; k++) ui_put(s, x++, r.y, 1, colors[i], 0, glyphs[i]);
        }
        for (int i = 0; i < 4; i++) {
            char b[32];
            human_bytes(b, sizeof b, (double)parts[i]);
            ui_printf(s, r.x + (i % 2) * (r.w / 2), r.y + 1 + i / 2, r.w / 2, colors[i], 0, "%s %s %-13s %s", glyphs[i],
                      "", names[i], b);
        }
        char b[32];
        human_bytes(b, sizeof b, (double)total);
        double seconds = (double)rec->wall_ns * 1e-9;
        double intensity = total ? (double)flops / (double)total : 0;
        ui_printf(s, r.x, r.y + 3, r.w, UI_DEFAULT, UI_BOLD, "step %llu: %s in %.3f ms = %.2f GB/s  (%d prefill + %d decode tok)",
                  (unsigned long long)rec->step, b, seconds * 1e3, seconds > 0 ? (double)total / seconds / 1e9 : 0.0,
                  rec->prefill_tokens, rec->decode_tokens);
        double machine_gb_s = 0, machine_gflop_s = 0;
        if (rec->device_ns > 0) { // --backend cuda: the forward pass timed on the GPU with CUDA events
            double device_seconds = (double)rec->device_ns * 1e-9;
            ui_printf(s, r.x, r.y + 4, r.w, UI_DEFAULT, 0, "GPU: forward %.3f ms (CUDA events) = %.3f TB/s",
                      device_seconds * 1e3, (double)total / device_seconds / 1e12);
        } else if (dashboard_machine_figures(d, &machine_gb_s, &machine_gflop_s)) {
            double machine_ridge = machine_gflop_s / machine_gb_s;
            ui_printf(s, r.x, r.y + 4, r.w, intensity < machine_ridge ? UI_BAD : UI_GOOD, 0,
                      "this CPU: %.0f%% of %.1f GB/s measured; ridge %.1f FLOP/B (%.0f GFLOP/s)",
                      seconds > 0 ? 100.0 * (double)total / seconds / 1e9 / machine_gb_s : 0.0, machine_gb_s,
                      machine_ridge, machine_gflop_s);
        } else
            ui_put(s, r.x, r.y + 4, r.w, UI_DEFAULT, UI_DIM,
                   d->machine ? "this CPU: measuring its bandwidth and peak FMA rate..."
                                             : "this CPU: not measured (--measure-machine in headless runs)");
        double ridge = device_ridge_point(dev, 0);
        ui_printf(s, r.x, r.y + 5, r.w, intensity < ridge ? UI_BAD : UI_GOOD, 0,
                  "intensity %.2f FLOP/B vs ridge %.0f on %s: %s-bound", intensity, ridge, dev->name,
                  intensity < ridge ? "memory" : "compute");
        double projected = device_step_seconds(dev, total, flops, 0);
        ui_printf(s, r.x, r.y + 6, r.w, UI_DEFAULT, 0, "on %s (d cycles): %.2f us  [%.0f GB/s, %.0f GB, %.0f TFLOPS fp16, %.0f TOPS int8]",
                  dev->name, projected * 1e6, dev->bandwidth_bytes_per_s / 1e9, dev->capacity_bytes / 1e9,
                  dev->peak_fp16_flops / 1e12, dev->peak_int8_ops / 1e12);
    }
    // History: bytes per step (P prefill, D decode) and tokens per step.
    const step_history* h = &d->history;
    int height = (r.h - 10) / 2;
    if (height < 2) return;
    int width = r.w - 2;
    int n = h->count < width ? h->count : width;
    uint64_t max_bytes = 1;
    int max_tokens = 1;
    for (int i = h->count - n; i < h->count; i++) {
        int k = (h->start + i) % HISTORY_STEPS;
        if (h->bytes[k] > max_bytes) max_bytes = h->bytes[k];
        if (h->tokens[k] > max_tokens) max_tokens = h->tokens[k];
    }
    char b[32];
    human_bytes(b, sizeof b, (double)max_bytes);
    ui_printf(s, r.x, r.y + 7, r.w, UI_DEFAULT, UI_BOLD, "bytes/step (max %s)  P=prefill D=decode", b);
    ui_printf(s, r.x, r.y + 8 + height, r.w, UI_DEFAULT, UI_BOLD, "tokens/step (max %d)", max_tokens);
    for (int i = 0; i < n; i++) {
        int k = (h->start + h->count - n + i) % HISTORY_STEPS;
        ui_color c = h->prefill[k] ? UI_OWNER1 : UI_OWNER0;
        for (int chart = 0; chart < 2; chart++) {
            double fraction = chart == 0 ? (double)h->bytes[k] / (double)max_bytes : (double)h->tokens[k] / max_tokens;
            int eighths = (int)lround(fraction * height * 8);
            int top = r.y + 8 + chart * (height + 1);
            for (int row = 0; row < height; row++) {
                int level = eighths - (height - 1 - row) * 8;
                if (level <= 0) continue;
                ui_put(s, r.x + i, top + row, 1, c, 0, s->glyphs->eighths[level > 8 ? 8 : level]);
            }
        }
        ui_put(s, r.x + i, r.y + 8 + 2 * height + 1, 1, c, 0, h->prefill[k] ? "P" : "D");
    }
}

// ---- Step size -------------------------------------------------------------------------

static void draw_step_size(ui_screen* s, ui_rect r, const dashboard* d) {
    const step_size_view* v = &d->step_size;
    static const char* const GRANULARITY[] = {"per-tensor", "per-channel", "per-group"};
    ui_printf(s, r.x, r.y, r.w, UI_DEFAULT, UI_BOLD, "%s (%d x %d)  b=%d %s %s%s", v->name, v->rows, v->cols,
              v->scheme.bits, v->scheme.symmetric ? "sym" : "asym", GRANULARITY[v->scheme.granularity],
              v->scheme.granularity == QUANT_PER_GROUP ? ":32" : "");
    if (v->error[0] || v->n_params == 0) {
        ui_put(s, r.x, r.y + 1, r.w, UI_BAD, 0, v->error[0] ? v->error : "no tensor");
        return;
    }
    const quant_params* p = &v->params[v->set_index];
    const quant_stats* st = &v->set_stats;
    ui_printf(s, r.x, r.y + 1, r.w, UI_DEFAULT, 0, "set %d/%d: s=%.6g z=%d range [%.4g, %.4g]", v->set_index,
              v->n_params, p->scale, p->zero_point, p->range_min, p->range_max);
    ui_printf(s, r.x, r.y + 2, r.w, st->within_half_step ? UI_GOOD : UI_BAD, 0,
              "max error %.4g vs s/2 %.4g (%s)  clipped %lld  mse %.3g", st->max_abs_error, p->scale / 2,
              st->within_half_step ? "within" : "OVER", (long long)st->n_clipped, st->mse);
    ui_printf(s, r.x, r.y + 3, r.w, UI_DEFAULT, UI_DIM, "whole tensor: mean s %.4g  max error %.4g  mse %.3g",
              v->matrix_stats.scale, v->matrix_stats.max_abs_error, v->matrix_stats.mse);
    // Histogram of the set's values; the quantization levels s (q - z) as
    // markers on the axis below.
    int height = r.h - 6, width = r.w;
    if (height < 2 || width < 8) return;
    enum { MAX_BINS = 512 };
    int counts[MAX_BINS] = {0}; // (width) values per bin
    if (width > MAX_BINS) width = MAX_BINS;
    int32_t qmin = quant_code_min(v->scheme.bits, v->scheme.symmetric);
    int32_t qmax = quant_code_max(v->scheme.bits, v->scheme.symmetric);
    float low = v->set_min, high = v->set_max;
    float level_low = quant_dequantize(qmin, p), level_high = quant_dequantize(qmax, p);
    if (level_low < low) low = level_low;
    if (level_high > high) high = level_high;
    if (high <= low) high = low + 1e-6f;
    int most = 1;
    for (int row = 0; row < v->rows; row++)
        for (int c = 0; c < v->cols; c++) {
            if (quant_param_index(row, c, v->rows, v->cols, &v->scheme) != v->set_index) continue;
            int bin = (int)((v->weights[(size_t)row * (size_t)v->cols + (size_t)c] - low) / (high - low) * (width - 1) + 0.5f);
            if (bin < 0) bin = 0;
            if (bin >= width) bin = width - 1;
            if (++counts[bin] > most) most = counts[bin];
        }
    int top = r.y + 4;
    for (int x = 0; x < width; x++) {
        // Square-root scale: the tails (where clipping and the extreme levels are) stay visible.
        int eighths = (int)lround(sqrt((double)counts[x] / most) * height * 8);
        for (int row = 0; row < height; row++) {
            int level = eighths - (height - 1 - row) * 8;
            if (level > 0) ui_put(s, r.x + x, top + row, 1, UI_OWNER0, 0, s->glyphs->eighths[level > 8 ? 8 : level]);
        }
    }
    int axis = top + height;
    for (int x = 0; x < width; x++) ui_put(s, r.x + x, axis, 1, UI_FREE, UI_DIM, s->glyphs->horizontal);
    for (int32_t q = qmin; q <= qmax; q++) {
        int x = (int)((quant_dequantize(q, p) - low) / (high - low) * (width - 1) + 0.5f);
        ui_put(s, r.x + x, axis, 1, q == p->zero_point ? UI_GOOD : UI_BAD, UI_BOLD, s->glyphs->marker);
    }
    ui_printf(s, r.x, axis + 1, r.w, UI_DEFAULT, UI_DIM, "%.4g", low);
    char right[32];
    snprintf(right, sizeof right, "%.4g", high);
    ui_put(s, r.x + r.w - (int)strlen(right), axis + 1, r.w, UI_DEFAULT, UI_DIM, right);
    ui_printf(s, r.x + r.w / 2 - 10, axis + 1, 24, UI_DEFAULT, UI_DIM, "%d levels", qmax - qmin + 1);
}

// ---- Lesson, header, key bar, help -----------------------------------------------------

// Rows a log line needs when wrapped at width w (UTF-8: continuation bytes take no column).
static int wrapped_rows(const char* text, int w) {
    int columns = 0;
    for (const unsigned char* c = (const unsigned char*)text; *c; c++) columns += (*c & 0xC0) != 0x80;
    return columns == 0 ? 1 : (columns + w - 1) / w;
}

// Draws text wrapped at w columns from row y, skipping the first `skip` rows.
static void put_wrapped(ui_screen* s, int x, int y, int w, int skip, int rows, ui_color c, int attr, const char* text) {
    const char* p = text;
    for (int row = 0; *p && row < skip + rows; row++) {
        const char* start = p;
        for (int col = 0; *p && col < w; col++) // one column per UTF-8 character
            for (p++; (*(const unsigned char*)p & 0xC0) == 0x80; p++) {
            }
        if (row < skip) continue;
        char piece[LESSON_LOG_WIDTH];
        snprintf(piece, sizeof piece, "%.*s", (int)(p - start), start);
        ui_put(s, x, y + row - skip, w, c, attr, piece);
    }
}

static void draw_lesson(ui_screen* s, ui_rect r, const dashboard* d) {
    const lesson_log* log = &d->lesson;
    if (!log->title[0]) {
        ui_put(s, r.x, r.y, r.w, UI_DEFAULT, UI_DIM, "No lesson is running.");
        if (r.h > 1) ui_put(s, r.x, r.y + 1, r.w, UI_DEFAULT, UI_DIM, "(servelab lab --lesson FILE runs one here)");
        return;
    }
    ui_printf(s, r.x, r.y, r.w, UI_TITLE, UI_BOLD, "%s", log->title);
    if (r.h > 1) ui_printf(s, r.x, r.y + 1, r.w, UI_DEFAULT, UI_REVERSE, "%s", log->state);
    // The newest entries that fit, oldest at the top, each wrapped.
    int top = r.y + 2, rows = r.h - 2, used = 0, first = log->count;
    while (first > 0) {
        int k = (log->start + first - 1) % LESSON_LOG_LINES;
        int need = wrapped_rows(log->lines[k], r.w);
        if (used + need > rows && used > 0) break;
        used += need;
        first--;
    }
    int y = top;
    for (int i = first; i < log->count && y < top + rows; i++) {
        int k = (log->start + i) % LESSON_LOG_LINES;
        static const ui_color COLORS[] = {UI_DEFAULT, UI_GOOD, UI_BAD, UI_BAD, UI_DEFAULT};
        static const int ATTRS[] = {0, UI_BOLD, UI_BOLD, UI_BOLD, UI_DIM};
        int need = wrapped_rows(log->lines[k], r.w);
        int skip = need > top + rows - y ? need - (top + rows - y) : 0; // a line taller than the pane: its end
        put_wrapped(s, r.x, y, r.w, skip, need - skip, COLORS[log->kinds[k]], ATTRS[log->kinds[k]], log->lines[k]);
        y += need - skip;
    }
}

static const char* const HELP[] = {
    "space/n  one engine step, or continue a lesson    r  run / pause",
    "+ / -    speed                    a  add a request (type, Enter)",
    "f        fork selected (shares)   x  cancel selected request",
    "p        add a request sharing the system prompt",
    "[ / ]    block size (confirm y)",
    "Tab      next pane / page         1-5  page (small terminals)",
    "up/down  select request (Requests) or layer (Step size)",
    "left/right  tensor (Step size)    b  bits   g  granularity",
    "m        sym / asym (Step size)   ,/.  parameter set",
    "z        quiz page (Esc returns)  d  cycle device model",
    "? / F1   this help                q  quit",
};

static void draw_help(ui_screen* s) {
    int n = (int)(sizeof HELP / sizeof HELP[0]);
    int w = 64 < s->cols - 2 ? 64 : s->cols - 2, h = n + 4;
    ui_rect r = {(s->cols - w) / 2, (s->rows - h) / 2, w, h};
    ui_fill(s, r, " ", UI_DEFAULT, 0);
    ui_box(s, r, "Help (any key closes)", true);
    for (int i = 0; i < n; i++) ui_put(s, r.x + 2, r.y + 2 + i, r.w - 4, UI_DEFAULT, 0, HELP[i]);
}

void ui_draw(ui_screen* s, const dashboard* d, const ui_view* v) {
    ui_screen_clear(s);
    ui_layout l = ui_layout_compute(s->cols, s->rows, v->page);
    if (l.mode == LAYOUT_TOO_SMALL) {
        ui_printf(s, 0, 0, s->cols, UI_BAD, UI_BOLD, "terminal too small: need at least %dx%d", UI_MIN_COLS, UI_MIN_ROWS);
        ui_printf(s, 0, 1, s->cols, UI_DEFAULT, 0, "(now %dx%d; q quits)", s->cols, s->rows);
        return;
    }
    const char* speed = UI_SPEEDS[v->speed_index] ? "" : "max";
    char speed_text[16];
    if (UI_SPEEDS[v->speed_index]) snprintf(speed_text, sizeof speed_text, "%d/s", UI_SPEEDS[v->speed_index]);
    else snprintf(speed_text, sizeof speed_text, "%s", speed);
    ui_printf(s, 0, 0, s->cols, UI_TITLE, UI_BOLD, "servelab lab  %s  step %llu  %s  speed %s  block size %d  %s%s",
              d->lesson_engine ? "(the lesson's engine)" : d->source.model_label,
              (unsigned long long)(d->lesson_engine ? d->lesson_engine->record.step : d->steps), v->running ? "RUNNING" : "paused", speed_text,
              dashboard_primary(d)->config.block_size, l.mode == LAYOUT_PAGES ? "page " : "",
              l.mode == LAYOUT_PAGES ? (char[2]){(char)('1' + l.page), 0} : "");
    for (int p = 0; p < PANE_COUNT; p++) {
        if (!l.visible[p]) continue;
        ui_box(s, l.panes[p], ui_pane_title((ui_pane)p), v->focus == (ui_pane)p);
        ui_rect in = inner(l.panes[p]);
        switch ((ui_pane)p) {
        case PANE_REQUESTS: draw_requests(s, in, d); break;
        case PANE_BLOCK_TABLES: draw_block_tables(s, in, d); break;
        case PANE_BLOCK_POOL: draw_block_pool(s, in, d); break;
        case PANE_FRAGMENTATION: draw_fragmentation(s, in, d); break;
        case PANE_TRAFFIC: draw_traffic(s, in, d, v); break;
        case PANE_STEP_SIZE: draw_step_size(s, in, d); break;
        case PANE_LESSON: draw_lesson(s, in, d); break;
        case PANE_COUNT: break;
        }
    }
    const char* bar_text = "spc step  r run  +/- speed  a add  p shared  f fork  x cancel  [/] block  z quiz  Tab focus  ? help  q quit";
    if (v->mode == UI_MODE_EDIT)
        ui_printf(s, 0, l.key_bar.y, s->cols, UI_TITLE, UI_REVERSE, "new prompt: %s_  (Enter adds, Esc cancels)", v->edit);
    else if (v->mode == UI_MODE_CONFIRM)
        ui_printf(s, 0, l.key_bar.y, s->cols, UI_BAD, UI_REVERSE, "restart both engines with block size %d? (y/n)",
                  v->pending_block_size);
    else if (v->message[0]) ui_printf(s, 0, l.key_bar.y, s->cols, UI_DEFAULT, UI_REVERSE, "%s", v->message);
    else ui_put(s, 0, l.key_bar.y, s->cols, UI_DEFAULT, UI_REVERSE, bar_text);
    if (v->help) draw_help(s);
}
