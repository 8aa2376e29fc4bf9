#include "lab/ui/panes.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/devices.h"
#include "engine/fault.h"
#include "engine/tokenizer.h"

const int UI_SPEEDS[8] = {1, 2, 5, 10, 20, 50, 100, 0};

// The inside of a pane's frame.
static ui_rect inner(ui_rect r) { return (ui_rect){r.x + 1, r.y + 1, r.w - 2, r.h - 2}; }

// The columns text may take in a pane: all but the last, so that text never
// touches the frame on the right. A figure that ended at the border could
// not be told from a cut one, by a reader or by the test that looks
// (tests/lab/ui/test_dashboard_fit.c); bars and charts still take every column.
static int text_w(ui_rect r) { return r.w - 1; }

static ui_color owner_color(int32_t id) { return (ui_color)(UI_OWNER0 + id % UI_OWNER_COLORS); }
static char owner_letter(int32_t id) { return (char)('a' + id % 26); }

static const char* state_name(const step_sequence_status* q) {
    static const char* const NAMES[] = {"waiting", "prefill", "decode", "preempted", "finished"};
    // A cancelled sequence is finished to the engine, but the student cancelled it.
    if (q->state == SEQ_FINISHED && q->stop == STOP_CANCELLED) return "cancelled";
    return NAMES[q->state];
}

// The phase both the Requests and the Block tables panes print for sequence
// `id`: its state in the engine now. The step record's phase says what the
// last step computed, which after a prefill step (or a fork right after
// one) read "prefill" beside a Requests row already saying "decode".
static const char* sequence_phase(const engine* e, int32_t id) {
    step_sequence_status now;
    return engine_sequence_status(e, id, &now) ? state_name(&now) : "released";
}

// Writes text only when all of it fits before column `right`: -1 when it
// does not (nothing written), else the columns written.
static int put_whole(ui_screen* s, int x, int y, int right, ui_color color, int attr, const char* text) {
    int columns = ui_text_columns(text);
    if (x + columns > right) return -1;
    return ui_put(s, x, y, columns, color, attr, text);
}

// A bytes field: one decimal where it fits, else none, else dropped when droppable.
static void line_bytes(ui_line* l, int priority, bool droppable, const char* before, double bytes, const char* after) {
    char precise[48], rough[48], form[2][UI_LINE_FORM_BYTES];
    int columns = ui_format_bytes(precise, sizeof precise, bytes, 47);
    if (ui_format_bytes(rough, sizeof rough, bytes, columns - 1) < 0) snprintf(rough, sizeof rough, "%s", precise);
    snprintf(form[0], sizeof form[0], "%s%s%s", before, precise, after);
    snprintf(form[1], sizeof form[1], "%s%s%s", before, rough, after);
    ui_line_text(l, priority, form[0], form[1], droppable ? "" : NULL, NULL);
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

// Token i of q as text (the tokenizer's piece, else its id); false for a
// leading BOS, which shows nothing.
static bool token_piece(const tokenizer* t, const step_sequence_status* q, int i, char* piece, size_t size) {
    if (i == 0 && q->tokens[0] == TOK_BOS_ID && t) return false;
    if (t)
        snprintf(piece, size, "%s", tok_decode_piece(t, i ? q->tokens[i - 1] : TOK_BOS_ID, q->tokens[i]));
    else
        snprintf(piece, size, i ? " %d" : "%d", q->tokens[i]);
    return true;
}

// Columns token i takes in a row (the newest one, just computed, is bracketed).
static int token_columns(const tokenizer* t, const step_sequence_status* q, int i, bool ran) {
    char piece[64];
    if (!token_piece(t, q, i, piece, sizeof piece)) return 0;
    return ui_text_columns(piece) + (i == q->n_tokens - 1 && i >= q->n_prompt && ran ? 2 : 0);
}

// The header: how many requests wait, run, finished and were cancelled.
static void draw_requests_head(ui_screen* s, ui_rect r, const step_record* now) {
    // Counted by the engine: a released sequence no longer says it was cancelled.
    int cancelled = now->n_cancelled;
    ui_line head;
    ui_line_init(&head);
    ui_line_number(&head, 9, false, "waiting ", now->n_waiting, 1, "");
    ui_line_number(&head, 9, false, "  running ", now->n_running, 1, "");
    ui_line_number(&head, 8, true, "  finished ", now->n_finished - cancelled, 1, "");
    if (cancelled) ui_line_number(&head, 7, true, "  cancelled ", cancelled, 1, "");
    ui_line_text(&head, 1, now->layout == KV_LAYOUT_PAGED ? "  (paged)" : "  (contiguous)", "", NULL);
    ui_line_put(s, r.x, r.y, text_w(r), UI_DEFAULT, UI_BOLD, &head);
}

// Index in now->live_sequences of the first row shown: the selected id
// stays within the `rows` rows below the header.
static int first_request_row(const step_record* now, int32_t selected, int rows) {
    int32_t first_id = selected >= rows ? selected - (rows - 1) : 0;
    if (first_id > 0 && now->n_live_sequences < now->n_sequence_ids) { // released ids take no row
        first_id = 0;
        for (int i = now->n_live_sequences - 1, shown = 0; i >= 0; i--)
            if (now->live_sequences[i].id <= selected && ++shown > rows) {
                first_id = now->live_sequences[i].id + 1;
                break;
            }
    }
    int first = 0;
    while (first < now->n_live_sequences && now->live_sequences[first].id < first_id)
        first++;
    return first;
}

// The row's tokens from column x: the newest ones are what moves, so when
// the text does not fit, its start gives way to a mark (one column).
static void draw_request_tokens(ui_screen* s, int x, int y, int right, const step_sequence_status* q,
                                const tokenizer* t, bool ran) {
    int from = 0, room = right - x, total = 0;
    for (int i = 0; i < q->n_tokens; i++)
        total += token_columns(t, q, i, ran);
    if (total > room)
        for (int i = q->n_tokens - 1, used = 0; i >= 0; i--) {
            int need = token_columns(t, q, i, ran);
            if (used + need > room - 1) {
                from = i + 1;
                break;
            }
            used += need;
        }
    if (from > 0) x += ui_put(s, x, y, 1, UI_DEFAULT, UI_DIM, s->utf8 ? "\u2026" : "~");
    for (int i = from; i < q->n_tokens && x < right; i++) {
        char piece[64];
        if (!token_piece(t, q, i, piece, sizeof piece)) continue;
        bool newest = i == q->n_tokens - 1 && i >= q->n_prompt;
        int attr = i >= q->n_prompt ? UI_BOLD : 0, w;
        // The newest token is reverse video and bracketed (for monochrome).
        // Tokens are shown whole or not at all: a cut id would be another id.
        if (newest && ran) {
            if (x + 2 + ui_text_columns(piece) > right) break;
            x += ui_put(s, x, y, 1, UI_GOOD, UI_REVERSE, "[");
            x += ui_put(s, x, y, right - x, UI_GOOD, UI_REVERSE | UI_BOLD, piece);
            x += ui_put(s, x, y, 1, UI_GOOD, UI_REVERSE, "]");
        } else if ((w = put_whole(s, x, y, right, i >= q->n_prompt ? owner_color(q->id) : UI_DEFAULT, attr, piece)) < 0)
            break;
        else
            x += w;
    }
}

// One request's row: its letter and id, its state, then its tokens.
static void draw_request_row(ui_screen* s, ui_rect r, int y, const engine* e, const step_sequence_status* q,
                             const tokenizer* t, bool selected, bool ran) {
    int x = r.x, right = r.x + text_w(r);
    char label[32], state[32];
    snprintf(label, sizeof label, "%c%c#%d", selected ? '>' : ' ', owner_letter(q->id), q->id);
    snprintf(state, sizeof state, " %-9s ", sequence_phase(e, q->id));
    int w = put_whole(s, x, y, right, owner_color(q->id), selected ? UI_REVERSE : UI_BOLD, label);
    if (w < 0) return;
    x += w;
    if ((w = put_whole(s, x, y, right, UI_DEFAULT, 0, state)) < 0) return;
    draw_request_tokens(s, x + w, y, right, q, t, ran);
}

static void draw_requests(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = dashboard_primary(d);
    const step_record* rec = dashboard_primary_record(d); // the last step: which sequences ran
    // The rows follow the engine between steps too: a request just added
    // or cancelled shows at once.
    step_record now = {0};
    if (engine_snapshot(e, &now)) { // out of memory: the pane stays empty this frame
        step_record_free(&now);
        return;
    }
    draw_requests_head(s, r, &now);
    // The lab's tokenizer reads only its own model's ids: a lesson's engine
    // on another model shows ids (its vocabulary is not the lab's).
    const tokenizer* t = e->model == &d->source.model ? d->source.tokenizer : NULL;
    // Newest first would move rows under the cursor; ids are stable, so list by id.
    int first = first_request_row(&now, d->selected, r.h - 1);
    for (int i = first, y = r.y + 1; i < now.n_live_sequences && y < r.y + r.h; i++, y++) {
        const step_sequence_status* q = &now.live_sequences[i];
        bool ran = false;
        if (rec)
            for (int k = 0; k < rec->n_sequences; k++)
                ran |= rec->sequences[k].id == q->id;
        draw_request_row(s, r, y, e, q, t, q->id == d->selected, ran);
    }
    step_record_free(&now);
}

// ---- Block tables ----------------------------------------------------------------------

// How many block tables in the record hold `block` (its sharing, from the record).
static int table_references(const step_record* rec, int32_t block) {
    int n = 0;
    for (int k = 0; k < rec->n_sequences; k++) {
        const step_sequence* q = &rec->sequences[k];
        for (int i = 0; i < q->n_table; i++)
            n += rec->block_ids[q->table_offset + i] == block;
    }
    return n;
}

// The paged engine the panes draw, or NULL with a line saying why not.
static const engine* paged_view(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = dashboard_view_engine(d, KV_LAYOUT_PAGED);
    if (!e) {
        ui_line why;
        ui_line_init(&why);
        ui_line_text(&why, 9, "the lesson's engine is contiguous: it has no blocks", "contiguous engine: no blocks",
                     NULL);
        ui_line_put(s, r.x, r.y, text_w(r), UI_DEFAULT, UI_DIM, &why);
    }
    return e;
}

// Speculative decoding in a table, after its blocks, each a cell that wraps
// whole: " d4 a3 r1 b0 75%", this step's guesses drafted, accepted,
// rejected and bonus, and the sequence's acceptance so far; " ~N@P", the N
// KV slots from position P that the verify pass wrote for refused guesses
// and that were rolled back; " ~[b]" for each block the rollback gave back
// to the pool (the step's last spec_rollback_blocks BLOCK_FREE events of the
// sequence). Returns the cells written (bad[i]: a rollback cell).
enum { SPEC_MAX_CELLS = 2 + SPEC_MAX_K };

static const step_sequence_status* recorded_status(const step_record* rec, int32_t id);

static int spec_cells(const step_record* rec, const step_sequence* q, char cells[][48], bool* bad, int max) {
    int n = 0;
    if (q->spec_drafted > 0 && n < max) {
        const step_sequence_status* status = recorded_status(rec, q->id);
        char rate[16] = "";
        if (status && status->spec_total_drafted > 0)
            snprintf(rate, sizeof rate, " %.0f%%",
                     100.0 * (double)status->spec_total_accepted / (double)status->spec_total_drafted);
        bad[n] = false;
        snprintf(cells[n++], 48, " d%d a%d r%d b%d%s", q->spec_drafted, q->spec_accepted, q->spec_rejected,
                 q->spec_bonus, rate);
    }
    if (q->spec_rollback_slots <= 0 || n >= max) return n;
    bad[n] = true;
    snprintf(cells[n++], 48, " ~%d@%d", q->spec_rollback_slots, q->spec_rollback_first_position);
    for (int i = rec->n_events - 1, found = 0; i >= 0 && found < q->spec_rollback_blocks && n < max; i--) {
        const block_event* ev = &rec->events[i]; // the rollback frees last in the step
        if (ev->kind != BLOCK_FREE || ev->sequence != q->id) continue;
        found++;
        bad[n] = true;
        snprintf(cells[n++], 48, " ~[%d]", ev->block);
    }
    return n;
}

// Rows a table takes in the pane: its line, then its cells wrapped at w
// (two columns in, one kept from the frame), as draw_block_tables lays them out.
static int table_rows(const step_record* rec, const step_sequence* q, int w) {
    int rows = 2, x = 2;
    char rolled[SPEC_MAX_CELLS][48];
    bool bad[SPEC_MAX_CELLS];
    int n_rolled = spec_cells(rec, q, rolled, bad, SPEC_MAX_CELLS);
    for (int i = 0; i < q->n_table + n_rolled; i++) {
        char cell[32];
        int n = 0;
        if (i < q->n_table) {
            int32_t b = rec->block_ids[q->table_offset + i];
            int refs = table_references(rec, b);
            n = refs > 1 ? snprintf(cell, sizeof cell, "[%d x%d]", b, refs) : snprintf(cell, sizeof cell, "[%d]", b);
        } else
            n = (int)strlen(rolled[i - q->n_table]);
        if (x + n > w - 1) {
            rows++;
            x = 2;
        }
        x += n;
    }
    return rows;
}

// The record's status of sequence `id`, or NULL.
static const step_sequence_status* recorded_status(const step_record* rec, int32_t id) {
    for (int i = 0; i < rec->n_live_sequences; i++)
        if (rec->live_sequences[i].id == id) return &rec->live_sequences[i];
    return NULL;
}

// The sequence `id` was forked from, as the record lists it (-1: none).
static int32_t recorded_fork_parent(const step_record* rec, int32_t id) {
    for (int i = 0; i < rec->n_live_sequences; i++)
        if (rec->live_sequences[i].id == id) return rec->live_sequences[i].fork_parent;
    return -1;
}

// Row 0: the step's block events, COW copies and evictions, whole, with
// "+N" for those that did not fit.
static void draw_block_events(ui_screen* s, ui_rect r, const step_record* rec) {
    int x = r.x, right = r.x + text_w(r);
    char text[96];
    snprintf(text, sizeof text, "step %llu events:", (unsigned long long)rec->step);
    x += put_whole(s, x, r.y, right, UI_DEFAULT, UI_BOLD, text) > 0 ? ui_text_columns(text) : 0;
    int shown = 0, hidden = 0;
    for (int i = 0; i < rec->n_events; i++) {
        const block_event* ev = &rec->events[i];
        if (ev->kind == BLOCK_COPY)
            snprintf(text, sizeof text, " COW %d->%d(%c)", ev->block, ev->other_block,
                     ev->sequence >= 0 ? owner_letter(ev->sequence) : '-');
        else if (ev->kind == BLOCK_EVICT)
            snprintf(text, sizeof text, " EVICT %d", ev->block);
        else
            continue;
        // Whole events only, and room kept for "+N" saying how many did not fit (7 columns).
        int w = hidden ? -1 : put_whole(s, x, r.y, right - 7, UI_BAD, UI_BOLD, text);
        if (w < 0)
            hidden++;
        else
            x += w, shown++;
    }
    if (hidden) {
        snprintf(text, sizeof text, " +%d", hidden);
        put_whole(s, x, r.y, right, UI_BAD, UI_BOLD, text);
    } else if (!shown)
        put_whole(s, x, r.y, right, UI_DEFAULT, 0, " none");
}

// The first table shown: the selected request's table is always shown,
// with as many tables before it as fit below the events row (so up/down
// reach every table).
static int first_table_shown(const step_record* rec, int selected_id, ui_rect r) {
    int first = 0, selected = -1;
    for (int k = 0; k < rec->n_sequences; k++)
        if (rec->sequences[k].id == selected_id) selected = k;
    for (int k = selected, rows = 0; k >= 0; k--) {
        rows += table_rows(rec, &rec->sequences[k], r.w);
        if (rows > r.h - 1) {
            first = k < selected ? k + 1 : selected;
            break;
        }
    }
    return first;
}

// A table's line: its request, phase, context, blocks, tail fill and the
// request it was forked from.
static void draw_table_line(ui_screen* s, ui_rect r, int y, const engine* e, const step_record* rec,
                            const step_sequence* q) {
    int block_size = e->config.block_size;
    ui_line row;
    ui_line_init(&row);
    char label[16], text[96];
    snprintf(label, sizeof label, "%c#%d", owner_letter(q->id), q->id);
    ui_line_text(&row, 9, label, NULL);
    char phase[32];
    snprintf(phase, sizeof phase, " %s", sequence_phase(e, q->id));
    ui_line_text(&row, 6, phase, "", NULL);
    ui_line_number(&row, 8, false, " ctx ", q->context_length, 1, "");
    ui_line_number(&row, 7, true, " blocks ", q->n_table, 1, "");
    snprintf(text, sizeof text, " tail %d/%d", q->tail_fill, block_size);
    ui_line_text(&row, 7, text, "", NULL);
    int32_t parent = recorded_fork_parent(rec, q->id);
    if (parent >= 0) {
        char fork[32];
        snprintf(fork, sizeof fork, "  fork of %c#%d", owner_letter(parent), parent);
        char fork_short[32];
        snprintf(fork_short, sizeof fork_short, " <%c#%d", owner_letter(parent), parent);
        ui_line_text(&row, 5, fork, fork_short, "", NULL);
    }
    ui_line_put(s, r.x, y, text_w(r), owner_color(q->id), UI_BOLD, &row);
}

// A table's cells from row y, two columns in, wrapped inside the pane
// (a shared block bold, with how many tables hold it); returns the row
// after them.
static int draw_table_cells(ui_screen* s, ui_rect r, int y, const step_record* rec, const step_sequence* q) {
    int x = r.x + 2;
    for (int i = 0; i < q->n_table; i++) {
        int32_t b = rec->block_ids[q->table_offset + i];
        int refs = table_references(rec, b);
        char cell[32];
        if (refs > 1)
            snprintf(cell, sizeof cell, "[%d x%d]", b, refs);
        else
            snprintf(cell, sizeof cell, "[%d]", b);
        if (x + (int)strlen(cell) > r.x + text_w(r)) {
            if (++y >= r.y + r.h) break;
            x = r.x + 2;
        }
        x += ui_put(s, x, y, r.x + r.w - x, refs > 1 ? UI_SHARED : owner_color(q->id), refs > 1 ? UI_BOLD : 0, cell);
    }
    char cells[SPEC_MAX_CELLS][48];
    bool bad[SPEC_MAX_CELLS];
    int n_cells = spec_cells(rec, q, cells, bad, SPEC_MAX_CELLS);
    for (int i = 0; i < n_cells && y < r.y + r.h; i++) {
        if (x + (int)strlen(cells[i]) > r.x + text_w(r)) {
            if (++y >= r.y + r.h) break;
            x = r.x + 2;
        }
        x += ui_put(s, x, y, r.x + r.w - x, bad[i] ? UI_BAD : owner_color(q->id), bad[i] ? UI_BOLD : UI_DIM, cells[i]);
    }
    return y + 1;
}

static void draw_block_tables(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = paged_view(s, r, d);
    if (!e) return;
    const step_record* rec = dashboard_view_record(d, KV_LAYOUT_PAGED);
    int block_size = e->config.block_size;
    if (!rec) {
        ui_line idle;
        ui_line_init(&idle);
        ui_line_number(&idle, 9, false, "paged, block size ", block_size, 1, "");
        ui_line_text(&idle, 5, ": no step yet (space steps)", ": no step yet", "", NULL);
        ui_line_put(s, r.x, r.y, text_w(r), UI_DEFAULT, 0, &idle);
        return;
    }
    draw_block_events(s, r, rec);
    int y = r.y + 1;
    for (int k = first_table_shown(rec, d->selected, r); k < rec->n_sequences && y < r.y + r.h; k++) {
        const step_sequence* q = &rec->sequences[k];
        draw_table_line(s, r, y++, e, rec, q);
        if (y >= r.y + r.h) break;
        y = draw_table_cells(s, r, y, rec, q);
    }
}

// ---- Block pool ------------------------------------------------------------------------

// Where block b stands after the last step: the record's blocks, or free
// before the first step (a block is taken only inside a step).
static block_state block_state_of(const step_record* rec, int b) {
    return rec && rec->blocks ? rec->blocks[b].state : BLOCK_STATE_FREE;
}

static void draw_block_pool(ui_screen* s, ui_rect r, const dashboard* d) {
    const engine* e = paged_view(s, r, d);
    if (!e) return;
    const step_record* rec = dashboard_view_record(d, KV_LAYOUT_PAGED);
    int n_blocks = rec ? rec->blocks_total : (int)(engine_pool_slots(e) / e->config.block_size);
    int used = 0, shared = 0, cached = 0, free_blocks = 0;
    for (int b = 0; b < n_blocks; b++) {
        block_state state = block_state_of(rec, b);
        free_blocks += state == BLOCK_STATE_FREE;
        cached += state == BLOCK_STATE_CACHED;
        shared += state == BLOCK_STATE_SHARED;
        used += state == BLOCK_STATE_USED || state == BLOCK_STATE_SHARED;
    }
    ui_line counts;
    ui_line_init(&counts);
    ui_line_number(&counts, 9, false, "used ", used, 1, "");
    ui_line_number(&counts, 8, false, " shared ", shared, 1, "");
    ui_line_number(&counts, 7, false, " cached ", cached, 1, "");
    ui_line_number(&counts, 9, false, " free ", free_blocks, 1, "");
    ui_line_number(&counts, 9, false, " /", n_blocks, 1, "");
    ui_line_put(s, r.x, r.y, text_w(r), UI_DEFAULT, UI_BOLD, &counts);
    int x = r.x, right = r.x + text_w(r), w = 0;
    static const char* const LEGEND[] = {"legend: ", "a-z owner ", "S shared ", "c cached ", ". free"};
    static const ui_color LEGEND_COLORS[] = {UI_DEFAULT, UI_OWNER0, UI_SHARED, UI_CACHED, UI_FREE};
    static const int LEGEND_ATTRS[] = {0, UI_BOLD, UI_BOLD, 0, UI_DIM};
    for (int i = 0; i < 5 && w >= 0; i++)
        if ((w = put_whole(s, x, r.y + 1, right, LEGEND_COLORS[i], LEGEND_ATTRS[i], LEGEND[i])) >= 0) x += w;
    // Owner of each block from the step record's tables (the first holder).
    int cells = (r.h - 2) * r.w;
    for (int b = 0; b < n_blocks && b < cells; b++) {
        block_state state = block_state_of(rec, b);
        int cx = r.x + b % r.w, cy = r.y + 2 + b / r.w;
        if (state == BLOCK_STATE_FREE)
            ui_put(s, cx, cy, 1, UI_FREE, UI_DIM, ".");
        else if (state == BLOCK_STATE_CACHED)
            ui_put(s, cx, cy, 1, UI_CACHED, 0, "c");
        else if (state == BLOCK_STATE_SHARED)
            ui_put(s, cx, cy, 1, UI_SHARED, UI_BOLD | UI_REVERSE, "S");
        else {
            int32_t owner = -1;
            for (int q = 0; q < rec->n_sequences && owner < 0; q++)
                for (int i = 0; i < rec->sequences[q].n_table; i++)
                    if (rec->block_ids[rec->sequences[q].table_offset + i] == b) owner = rec->sequences[q].id;
            char letter[2] = {owner >= 0 ? owner_letter(owner) : '?', 0};
            ui_put(s, cx, cy, 1, owner >= 0 ? owner_color(owner) : UI_DEFAULT, UI_REVERSE, letter);
        }
    }
    if (n_blocks > cells) {
        char more[32];
        snprintf(more, sizeof more, " +%d more ", n_blocks - cells);
        int w_more = ui_text_columns(more);
        put_whole(s, r.x + r.w - w_more, r.y + r.h - 1, right, UI_DEFAULT, 0, more);
    }
}

// ---- Fragmentation ---------------------------------------------------------------------

static void fragmentation_rows(ui_screen* s, ui_rect r, int y, const char* label, const dashboard* d,
                               kv_layout layout) {
    const step_record* rec = dashboard_view_record(d, layout);
    ui_printf(s, r.x, y, r.w, UI_DEFAULT, UI_BOLD, "%s", label);
    if (!rec) {
        put_whole(s, r.x + 12, y, r.x + text_w(r), UI_DEFAULT, 0,
                  dashboard_view_engine(d, layout) ? "(idle)"
                  : d->serve_address[0]            ? "(not in the server's engine)"
                                                   : "(not in the lesson's engine)");
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
        ui_line figures;
        ui_line_init(&figures);
        char count[32];
        snprintf(count, sizeof count, "%7lld", (long long)values[i]);
        ui_line_text(&figures, 9, count, NULL);
        char precise[32], rough[32];
        snprintf(precise, sizeof precise, " %5.1f%%", pct);
        snprintf(rough, sizeof rough, " %.0f%%", pct);
        ui_line_text(&figures, 5, precise, rough, "", NULL);
        ui_line_put(s, x + width + 1, y + 1 + i, r.x + text_w(r) - x - width - 1, UI_DEFAULT, 0, &figures);
    }
}

static void draw_fragmentation(ui_screen* s, ui_rect r, const dashboard* d) {
    fragmentation_rows(s, r, r.y, "paged", d, KV_LAYOUT_PAGED);
    if (r.h >= 10) fragmentation_rows(s, r, r.y + 5, "contiguous", d, KV_LAYOUT_CONTIGUOUS);
    const engine* paged = dashboard_view_engine(d, KV_LAYOUT_PAGED);
    const engine* contiguous = dashboard_view_engine(d, KV_LAYOUT_CONTIGUOUS);
    if (r.h >= 11 && paged && contiguous) {
        ui_line slots;
        ui_line_init(&slots);
        ui_line_text(&slots, 9, "slots in pool:", "slots:", NULL);
        ui_line_number(&slots, 8, false, " paged ", (double)engine_pool_slots(paged), 1, ",");
        ui_line_number(&slots, 8, false, " contiguous ", (double)engine_pool_slots(contiguous), 1, "");
        ui_line_text(&slots, 2, " (same bytes)", "", NULL);
        ui_line_put(s, r.x, r.y + 10, text_w(r), UI_DEFAULT, UI_DIM, &slots);
    }
}

// ---- Memory traffic --------------------------------------------------------------------

// Bytes the step moved: weights and KV cache read, KV written, activations.
static uint64_t traffic_bytes(const kernel_traffic* t) {
    return t->weight_bytes_read + t->kv_bytes_read + t->kv_bytes_written + t->activation_bytes;
}

// Row 0: the step's bytes as one bar in four parts; rows 1-2: their legend,
// two parts a row.
static void traffic_parts(ui_screen* s, ui_rect r, const kernel_traffic* t) {
    uint64_t parts[4] = {t->weight_bytes_read, t->kv_bytes_read, t->kv_bytes_written, t->activation_bytes};
    const char* names[4] = {"W weights", "R KV read", "K KV written", "A activations"};
    const char* glyphs[4] = {s->glyphs->full, s->glyphs->shade, s->glyphs->light, s->glyphs->dots};
    ui_color colors[4] = {UI_OWNER0, UI_OWNER1, UI_OWNER2, UI_OWNER3};
    uint64_t total = traffic_bytes(t);
    int x = r.x;
    for (int i = 0; i < 4; i++) {
        int w = total ? (int)lround((double)parts[i] / (double)total * r.w) : 0;
        for (int k = 0; k < w && x < r.x + r.w; k++)
            ui_put(s, x++, r.y, 1, colors[i], 0, glyphs[i]);
    }
    for (int i = 0; i < 4; i++) {
        ui_line legend;
        ui_line_init(&legend);
        char glyph[16], padded[32], name[32], letter[4];
        snprintf(glyph, sizeof glyph, "%s ", glyphs[i]);
        snprintf(padded, sizeof padded, " %-13s", names[i]);
        snprintf(name, sizeof name, " %s", names[i]);
        snprintf(letter, sizeof letter, " %c", names[i][0]);
        ui_line_text(&legend, 9, glyph, NULL);
        ui_line_text(&legend, 2, padded, name, letter, NULL);
        line_bytes(&legend, 8, false, " ", (double)parts[i], "");
        ui_line_put(s, r.x + (i % 2) * (r.w / 2), r.y + 1 + i / 2, i % 2 ? text_w(r) - r.w / 2 : r.w / 2 - 1, colors[i],
                    0, &legend);
    }
}

// Row 3: the step's bytes, wall time, rate and tokens.
static void traffic_step_line(ui_screen* s, ui_rect r, const step_record* rec, uint64_t total, double seconds) {
    ui_line step;
    ui_line_init(&step);
    char text[128];
    snprintf(text, sizeof text, "step %llu:", (unsigned long long)rec->step);
    ui_line_text(&step, 9, text, NULL);
    line_bytes(&step, 8, false, " ", (double)total, "");
    ui_line_si(&step, 6, true, " in ", seconds, "s", "");
    ui_line_si(&step, 7, true, " = ", seconds > 0 ? (double)total / seconds : 0.0, "B/s", "");
    char tokens_long[64], tokens_short[64];
    snprintf(tokens_long, sizeof tokens_long, "  (%d prefill + %d decode tok)", rec->prefill_tokens,
             rec->decode_tokens);
    snprintf(tokens_short, sizeof tokens_short, "  (%dP+%dD)", rec->prefill_tokens, rec->decode_tokens);
    ui_line_text(&step, 3, tokens_long, tokens_short, "", NULL);
    ui_line_put(s, r.x, r.y + 3, text_w(r), UI_DEFAULT, UI_BOLD, &step);
}

// Row 4: the machine the step ran on: the forward pass timed on the GPU
// (--backend cuda, CUDA events), else the step's share of this CPU's
// measured bandwidth and ridge, else why there is no measurement.
static void traffic_machine_line(ui_screen* s, ui_rect r, const dashboard* d, const step_record* rec, uint64_t total,
                                 double seconds, double intensity) {
    double machine_gb_s = 0, machine_gflop_s = 0;
    ui_line machine;
    ui_line_init(&machine);
    if (rec->device_ns > 0) {
        double device_seconds = (double)rec->device_ns * 1e-9;
        ui_line_si(&machine, 9, false, "GPU: forward ", device_seconds, "s", "");
        ui_line_text(&machine, 2, " (CUDA events)", "", NULL);
        ui_line_si(&machine, 8, true, " = ", (double)total / device_seconds, "B/s", "");
        ui_line_put(s, r.x, r.y + 4, text_w(r), UI_DEFAULT, 0, &machine);
    } else if (dashboard_machine_figures(d, &machine_gb_s, &machine_gflop_s)) {
        double machine_ridge = machine_gflop_s / machine_gb_s;
        ui_line_text(&machine, 9, "this CPU:", "CPU:", NULL);
        ui_line_number(&machine, 8, false, " ",
                       seconds > 0 ? round(100.0 * (double)total / seconds / 1e9 / machine_gb_s) : 0.0, 1, "%");
        ui_line_si(&machine, 7, false, " of ", machine_gb_s * 1e9, "B/s", "");
        ui_line_text(&machine, 1, " measured", "", NULL);
        // Named as this CPU's, at every width: the device's ridge is on the
        // row below (153 FLOP/B on an A100 against about 8 here).
        ui_line_number(&machine, 5, false, "; CPU ridge ", machine_ridge, 3, " FLOP/B");
        ui_line_si(&machine, 3, true, " (", machine_gflop_s * 1e9, "FLOP/s", ")");
        ui_line_put(s, r.x, r.y + 4, text_w(r), intensity < machine_ridge ? UI_BAD : UI_GOOD, 0, &machine);
    } else {
        ui_line_text(&machine, 9,
                     d->machine ? "this CPU: measuring its bandwidth and peak FMA rate..."
                                : "this CPU: not measured (--measure-machine in headless runs)",
                     d->machine ? "this CPU: measuring..." : "this CPU: not measured", NULL);
        ui_line_put(s, r.x, r.y + 4, text_w(r), UI_DEFAULT, UI_DIM, &machine);
    }
}

// A device model's name without its variant: "A100 80GB SXM" -> "A100",
// "H200 SXM" -> "H200"; a first word without a digit keeps the next one
// ("RTX 4090").
static void device_short_name(const device_model* dev, char* out, size_t size) {
    const char* end = strchr(dev->name, ' ');
    if (end && !strpbrk(dev->name, "0123456789"))
        end = NULL;
    else if (end && strcspn(dev->name, "0123456789") > (size_t)(end - dev->name))
        end = strchr(end + 1, ' ');
    snprintf(out, size, "%.*s", end ? (int)(end - dev->name) : (int)strlen(dev->name), dev->name);
}

// Rows 5-6: the step on the chosen device model (d cycles): memory- or
// compute-bound against its ridge, and the time it would take there.
static void traffic_device_lines(ui_screen* s, ui_rect r, const device_model* dev, uint64_t total, uint64_t flops,
                                 double intensity) {
    char text[128];
    double ridge = device_ridge_point(dev, 0);
    ui_line bound;
    ui_line_init(&bound);
    ui_line_number(&bound, 9, false, "intensity ", intensity, 3, " FLOP/B");
    // The ridge always says whose it is (the CPU's is on the row above); a
    // ridge is a whole number of FLOP/B (153 to 412 for the models), so
    // only the name shortens.
    char ridge_long[UI_LINE_FORM_BYTES], ridge_short[UI_LINE_FORM_BYTES], short_name[64];
    device_short_name(dev, short_name, sizeof short_name);
    snprintf(ridge_long, sizeof ridge_long, " vs %s ridge %.0f", dev->name, round(ridge));
    snprintf(ridge_short, sizeof ridge_short, " vs %s ridge %.0f", short_name, round(ridge));
    ui_line_text(&bound, 7, ridge_long, ridge_short, NULL);
    ui_line_text(&bound, 8, intensity < ridge ? ": memory-bound" : ": compute-bound",
                 intensity < ridge ? ": memory" : ": compute", NULL);
    ui_line_put(s, r.x, r.y + 5, text_w(r), intensity < ridge ? UI_BAD : UI_GOOD, 0, &bound);
    double projected = device_step_seconds(dev, total, flops, 0);
    ui_line device;
    ui_line_init(&device);
    snprintf(text, sizeof text, "on %s", dev->name);
    ui_line_text(&device, 9, text, NULL);
    ui_line_text(&device, 1, " (d cycles)", "", NULL);
    ui_line_si(&device, 9, false, ": ", projected, "s", "");
    ui_line_si(&device, 6, true, "  ", dev->bandwidth_bytes_per_s, "B/s", "");
    ui_line_number(&device, 5, true, ", ", dev->capacity_bytes / 1073741824.0, 3,
                   " GiB"); // binary, as the card holds it
    ui_line_si(&device, 4, true, ", ", dev->peak_fp16_flops, "FLOPS", " fp16");
    ui_line_si(&device, 3, true, ", ", dev->peak_int8_ops, "OPS", " int8");
    ui_line_put(s, r.x, r.y + 6, text_w(r), UI_DEFAULT, 0, &device);
}

// Rows 0-6: the last step's traffic.
static void traffic_step(ui_screen* s, ui_rect r, const dashboard* d, const step_record* rec, const device_model* dev) {
    const kernel_traffic* t = &rec->traffic;
    uint64_t total = traffic_bytes(t);
    uint64_t flops = t->matmul_flops + t->attention_flops;
    double seconds = (double)rec->wall_ns * 1e-9;
    double intensity = total ? (double)flops / (double)total : 0;
    traffic_parts(s, r, t);
    traffic_step_line(s, r, rec, total, seconds);
    traffic_machine_line(s, r, d, rec, total, seconds, intensity);
    traffic_device_lines(s, r, dev, total, flops, intensity);
}

// Rows 7 on: bytes per step (P prefill, D decode) and tokens per step, the
// last steps that fit, each chart half the rows left.
static void traffic_history(ui_screen* s, ui_rect r, const step_history* h) {
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
    ui_line bytes_label, tokens_label;
    ui_line_init(&bytes_label);
    ui_line_text(&bytes_label, 9, "bytes/step", NULL);
    line_bytes(&bytes_label, 8, true, " (max ", (double)max_bytes, ")");
    ui_line_text(&bytes_label, 3, "  P=prefill D=decode", "", NULL);
    ui_line_put(s, r.x, r.y + 7, text_w(r), UI_DEFAULT, UI_BOLD, &bytes_label);
    ui_line_init(&tokens_label);
    ui_line_text(&tokens_label, 9, "tokens/step", NULL);
    ui_line_number(&tokens_label, 8, true, " (max ", max_tokens, 1, ")");
    ui_line_put(s, r.x, r.y + 8 + height, text_w(r), UI_DEFAULT, UI_BOLD, &tokens_label);
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

// Row 7 while speculating: the draft model's bytes beside the target's
// (rec->traffic is the target's pass alone), the verify rows and the tokens
// they gave. The charts below move down a row.
static void traffic_speculation_line(ui_screen* s, ui_rect r, const step_record* rec) {
    ui_line spec;
    ui_line_init(&spec);
    line_bytes(&spec, 9, false, "draft ", (double)traffic_bytes(&rec->spec_draft_traffic), "");
    ui_line_number(&spec, 5, true, " (", rec->spec_draft_passes, 1,
                   rec->spec_draft_passes == 1 ? " pass)" : " passes)");
    line_bytes(&spec, 9, false, " + target ", (double)traffic_bytes(&rec->traffic), "");
    char verify_long[96], verify_short[64];
    snprintf(verify_long, sizeof verify_long, "  verify %d rows: %d of %d guesses kept, %d tokens",
             rec->spec_verify_tokens, rec->spec_accepted, rec->spec_drafted, rec->spec_emitted);
    snprintf(verify_short, sizeof verify_short, "  kept %d/%d", rec->spec_accepted, rec->spec_drafted);
    ui_line_text(&spec, 7, verify_long, verify_short, "", NULL);
    ui_line_put(s, r.x, r.y + 7, text_w(r), UI_DEFAULT, UI_BOLD, &spec);
}

static void draw_traffic(ui_screen* s, ui_rect r, const dashboard* d, const ui_view* v) {
    const step_record* rec = dashboard_primary_record(d);
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    const device_model* dev = &devices[v->device % n_devices];
    if (!rec)
        put_whole(s, r.x, r.y, r.x + text_w(r), UI_DEFAULT, 0, "no step yet");
    else
        traffic_step(s, r, d, rec, dev);
    if (rec && rec->spec_k > 0 && r.h > 8) {
        traffic_speculation_line(s, r, rec);
        r.y++;
        r.h--;
    }
    traffic_history(s, r, &d->history);
}

// ---- Step size -------------------------------------------------------------------------

// Row 0: the tensor, its shape and the scheme.
static void step_size_head(ui_screen* s, ui_rect r, const step_size_view* v) {
    static const char* const GRANULARITY[] = {"per-tensor", "per-channel", "per-group"};
    char text[128];
    ui_line head;
    ui_line_init(&head);
    ui_line_text(&head, 9, v->name, NULL);
    snprintf(text, sizeof text, " (%d x %d)", v->rows, v->cols);
    ui_line_text(&head, 3, text, "", NULL);
    snprintf(text, sizeof text, "  b=%d %s %s%s", v->scheme.bits, v->scheme.symmetric ? "sym" : "asym",
             GRANULARITY[v->scheme.granularity], v->scheme.granularity == QUANT_PER_GROUP ? ":32" : "");
    ui_line_text(&head, 8, text, NULL);
    ui_line_put(s, r.x, r.y, text_w(r), UI_DEFAULT, UI_BOLD, &head);
}

// Rows 1-3: the shown set's scale, zero point and range; its error against
// half a step; the whole tensor's error.
static void step_size_errors(ui_screen* s, ui_rect r, const step_size_view* v) {
    const quant_params* p = &v->params[v->set_index];
    const quant_stats* st = &v->set_stats;
    char text[128];
    ui_line set, error, whole;
    ui_line_init(&set);
    snprintf(text, sizeof text, "set %d/%d:", v->set_index, v->n_params);
    ui_line_text(&set, 9, text, NULL);
    ui_line_number(&set, 8, false, " s=", p->scale, 6, "");
    ui_line_number(&set, 7, false, " z=", p->zero_point, 1, "");
    snprintf(text, sizeof text, " range [%.4g, %.4g]", p->range_min, p->range_max);
    char rough[64];
    snprintf(rough, sizeof rough, " range [%.2g, %.2g]", p->range_min, p->range_max);
    ui_line_text(&set, 5, text, rough, "", NULL);
    ui_line_put(s, r.x, r.y + 1, text_w(r), UI_DEFAULT, 0, &set);
    ui_line_init(&error);
    ui_line_number(&error, 9, false, "max error ", st->max_abs_error, 4, "");
    ui_line_number(&error, 8, false, " vs s/2 ", p->scale / 2, 4, "");
    ui_line_text(&error, 8, st->within_half_step ? " (within)" : " (OVER)", NULL);
    ui_line_number(&error, 5, true, "  clipped ", (double)st->n_clipped, 1, "");
    ui_line_number(&error, 6, true, "  mse ", st->mse, 3, "");
    ui_line_put(s, r.x, r.y + 2, text_w(r), st->within_half_step ? UI_GOOD : UI_BAD, 0, &error);
    ui_line_init(&whole);
    ui_line_text(&whole, 9, "whole tensor:", "tensor:", NULL);
    ui_line_number(&whole, 8, false, " mean s ", v->matrix_stats.scale, 4, "");
    ui_line_number(&whole, 7, true, "  max error ", v->matrix_stats.max_abs_error, 4, "");
    ui_line_number(&whole, 6, true, "  mse ", v->matrix_stats.mse, 3, "");
    ui_line_put(s, r.x, r.y + 3, text_w(r), UI_DEFAULT, UI_DIM, &whole);
}

// The histogram's value range: the set's values and its lowest and highest
// quantization levels, never empty.
static void step_size_range(const step_size_view* v, float* low, float* high) {
    const quant_params* p = &v->params[v->set_index];
    float level_low = quant_dequantize(quant_code_min(v->scheme.bits, v->scheme.symmetric), p);
    float level_high = quant_dequantize(quant_code_max(v->scheme.bits, v->scheme.symmetric), p);
    *low = v->set_min;
    *high = v->set_max;
    if (level_low < *low) *low = level_low;
    if (level_high > *high) *high = level_high;
    if (*high <= *low) *high = *low + 1e-6f;
}

enum { STEP_SIZE_MAX_BINS = 512 }; // histogram columns, at most

// The set's values in `width` bins over [low, high], drawn as bars of
// `height` rows from row 4.
static void step_size_histogram(ui_screen* s, ui_rect r, const step_size_view* v, int width, int height, float low,
                                float high) {
    int counts[STEP_SIZE_MAX_BINS] = {0}; // (width) values per bin
    int most = 1;
    for (int row = 0; row < v->rows; row++)
        for (int c = 0; c < v->cols; c++) {
            if (quant_param_index(row, c, v->rows, v->cols, &v->scheme) != v->set_index) continue;
            float value = v->weights[(size_t)row * (size_t)v->cols + (size_t)c];
            int bin = (int)((value - low) / (high - low) * (width - 1) + 0.5f);
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
}

// The axis under the histogram (row `axis`) with the quantization levels
// s (q - z) as markers, and the range below it.
static void step_size_axis(ui_screen* s, ui_rect r, const step_size_view* v, int axis, int width, float low,
                           float high) {
    const quant_params* p = &v->params[v->set_index];
    int32_t qmin = quant_code_min(v->scheme.bits, v->scheme.symmetric);
    int32_t qmax = quant_code_max(v->scheme.bits, v->scheme.symmetric);
    for (int x = 0; x < width; x++)
        ui_put(s, r.x + x, axis, 1, UI_FREE, UI_DIM, s->glyphs->horizontal);
    for (int32_t q = qmin; q <= qmax; q++) {
        int x = (int)((quant_dequantize(q, p) - low) / (high - low) * (width - 1) + 0.5f);
        ui_put(s, r.x + x, axis, 1, q == p->zero_point ? UI_GOOD : UI_BAD, UI_BOLD, s->glyphs->marker);
    }
    // The range under the axis: low at the left, high at the right with one
    // column to the frame (a figure never touches it), the level count in
    // between where it has room; each whole or not at all.
    char left[32], right[32], levels[32];
    int third = (r.w - 3) / 3;
    int left_w = ui_format_number(left, sizeof left, low, 4, third);
    int right_w = ui_format_number(right, sizeof right, high, 4, third);
    snprintf(levels, sizeof levels, "%d levels", qmax - qmin + 1);
    if (left_w > 0) ui_put(s, r.x, axis + 1, left_w, UI_DEFAULT, UI_DIM, left);
    if (right_w > 0) ui_put(s, r.x + r.w - 1 - right_w, axis + 1, right_w, UI_DEFAULT, UI_DIM, right);
    int levels_w = ui_text_columns(levels), levels_x = r.x + (r.w - levels_w) / 2;
    if (levels_x > r.x + left_w + 1 && levels_x + levels_w < r.x + r.w - 2 - right_w)
        ui_put(s, levels_x, axis + 1, levels_w, UI_DEFAULT, UI_DIM, levels);
}

static void draw_step_size(ui_screen* s, ui_rect r, const dashboard* d) {
    const step_size_view* v = &d->step_size;
    step_size_head(s, r, v);
    if (v->error[0] || v->n_params == 0) {
        ui_line error;
        ui_line_init(&error);
        ui_line_text(&error, 9, v->error[0] ? v->error : "no tensor", "the scheme does not apply (see the key help)",
                     NULL);
        ui_line_put(s, r.x, r.y + 1, text_w(r), UI_BAD, 0, &error);
        return;
    }
    step_size_errors(s, r, v);
    // Histogram of the set's values over the rows left under the four text rows.
    int height = r.h - 6, width = r.w;
    if (height < 2 || width < 8) return;
    if (width > STEP_SIZE_MAX_BINS) width = STEP_SIZE_MAX_BINS;
    float low, high;
    step_size_range(v, &low, &high);
    step_size_histogram(s, r, v, width, height, low, high);
    step_size_axis(s, r, v, r.y + 4 + height, width, low, high);
}

// ---- Lesson, header, key bar, help -----------------------------------------------------

// Bytes of the next row of `text` wrapped at w columns: whole words where
// the line goes on (a word longer than the row is broken), the rest where
// it ends. *next: where the row after starts (the breaking space skipped).
static int wrap_row(const char* text, int w, const char** next) {
    const char* p = text;
    const char* last_space = NULL;
    int col = 0;
    while (*p && col < w) {
        if (*p == ' ') last_space = p;
        for (p++; (*(const unsigned char*)p & 0xC0) == 0x80; p++) {
        }
        col++;
    }
    if (!*p) {
        *next = p;
        return (int)(p - text);
    }
    if (*p == ' ') { // the row ends exactly at a word's end
        *next = p + 1;
        return (int)(p - text);
    }
    if (last_space && last_space > text) {
        *next = last_space + 1;
        return (int)(last_space - text);
    }
    *next = p;
    return (int)(p - text);
}

static int wrapped_rows(const char* text, int w) {
    int rows = 0;
    const char* p = text;
    do {
        wrap_row(p, w, &p);
        rows++;
    } while (*p);
    return rows;
}

// The lesson pane's rows: the log wrapped at w, how many, where the newest
// entry starts, and how many rows show below the title and state (`h`
// inside the frame) with `marked` (a "below" mark on the last row).
typedef struct lesson_rows {
    int total, last_start, visible;
} lesson_rows;

static lesson_rows lesson_measure(const lesson_log* log, int w, int h, bool marked) {
    lesson_rows m = {0, 0, h - 2 - (marked ? 1 : 0)};
    if (m.visible < 1) m.visible = 1;
    for (int i = 0; i < log->count; i++) {
        m.last_start = m.total;
        m.total += wrapped_rows(log->lines[(log->start + i) % LESSON_LOG_LINES], w);
    }
    return m;
}

// The first row shown while following the newest lines: the bottom, or the
// start of the newest entry when it is taller than the pane (so that a
// check line always shows its PASS or FAIL and its id).
static int follow_top(const lesson_rows* m) {
    int bottom = m->total - m->visible > 0 ? m->total - m->visible : 0;
    return m->last_start < bottom ? m->last_start : bottom;
}

// Follows the newest lines unless scrolled; writes the first row shown.
static int lesson_top(const lesson_log* log, const ui_view* v, int w, int h, lesson_rows* m, bool* marked) {
    *m = lesson_measure(log, w, h, false);
    int top = v->lesson_scrolled ? v->lesson_top : follow_top(m);
    // The mark takes the last row where there are two or more for the log
    // (at the smallest pane, 3 rows inside: title, state and one line, the line wins).
    *marked = top + m->visible < m->total && h - 3 >= 1;
    if (*marked) {
        *m = lesson_measure(log, w, h, true);
        top = v->lesson_scrolled ? v->lesson_top : follow_top(m);
    }
    int last = m->total - m->visible > 0 ? m->total - m->visible : 0;
    if (top > last) top = last;
    if (top < 0) top = 0;
    return top;
}

void ui_lesson_scroll(const dashboard* d, ui_view* v, int cols, int rows, int pages) {
    ui_layout l = ui_layout_compute(cols, rows, v->page);
    if (l.mode == LAYOUT_TOO_SMALL) return;
    if (!l.visible[PANE_LESSON]) { // scrolling shows the lesson first
        v->page = ui_pane_page(PANE_LESSON);
        v->focus = PANE_LESSON;
        l = ui_layout_compute(cols, rows, v->page);
    }
    ui_rect in = inner(l.panes[PANE_LESSON]);
    lesson_rows m;
    bool marked;
    int top = lesson_top(&d->lesson, v, text_w(in), in.h, &m, &marked);
    int step = m.visible > 1 ? m.visible - 1 : 1; // one row of overlap keeps the reader's place
    top += pages * step;
    int last = m.total - m.visible > 0 ? m.total - m.visible : 0;
    if (top >= last && pages > 0) { // the end: follow new lines again
        v->lesson_scrolled = false;
        return;
    }
    if (!v->lesson_scrolled) v->lesson_seen = d->lesson.appended;
    v->lesson_scrolled = true;
    v->lesson_top = top < 0 ? 0 : top;
}

static void draw_lesson(ui_screen* s, ui_rect r, const dashboard* d, const ui_view* v) {
    const lesson_log* log = &d->lesson;
    if (!log->file[0]) {
        put_whole(s, r.x, r.y, r.x + text_w(r), UI_DEFAULT, UI_DIM, "No lesson is running.");
        if (r.h > 1) {
            ui_line hint;
            ui_line_init(&hint);
            ui_line_text(&hint, 9, "(servelab lab --lesson FILE runs one here)", "(lab --lesson FILE runs one)", NULL);
            ui_line_put(s, r.x, r.y + 1, text_w(r), UI_DEFAULT, UI_DIM, &hint);
        }
        return;
    }
    ui_line title, state;
    ui_line_init(&title);
    // The lesson's own title first, then its file, shortened to its name
    // and then dropped as the pane narrows.
    const char* base = strrchr(log->file, '/');
    base = base ? base + 1 : log->file;
    char full[sizeof log->title + sizeof log->file + 8], named[sizeof full];
    if (log->title[0]) {
        snprintf(full, sizeof full, "%s (%s)", log->title, log->file);
        snprintf(named, sizeof named, "%s (%s)", log->title, base);
        ui_line_text(&title, 9, full, named, log->title, NULL);
    } else {
        snprintf(full, sizeof full, "lesson %s", log->file);
        snprintf(named, sizeof named, "lesson %s", base);
        ui_line_text(&title, 9, full, named, NULL);
    }
    ui_line_put(s, r.x, r.y, text_w(r), UI_TITLE, UI_BOLD, &title);
    if (r.h > 1) {
        ui_line_init(&state);
        // "done: 3 passed, 0 failed; space returns ...": the part before ';' is the news.
        char head[sizeof log->state];
        snprintf(head, sizeof head, "%.*s", (int)strcspn(log->state, ";"), log->state);
        ui_line_text(&state, 9, log->state, head, NULL);
        ui_line_put(s, r.x, r.y + 1, text_w(r), UI_DEFAULT, UI_REVERSE, &state);
    }
    if (r.h < 3) return;
    lesson_rows m;
    bool marked;
    int top = lesson_top(log, v, text_w(r), r.h, &m, &marked);
    static const ui_color COLORS[] = {UI_DEFAULT, UI_GOOD, UI_BAD, UI_BAD, UI_DEFAULT};
    static const int ATTRS[] = {0, UI_BOLD, UI_BOLD, UI_BOLD, UI_DIM};
    int row = 0, y = r.y + 2;
    for (int i = 0; i < log->count && row < top + m.visible; i++) {
        int k = (log->start + i) % LESSON_LOG_LINES;
        const char* p = log->lines[k];
        do {
            const char* next;
            int bytes = wrap_row(p, text_w(r), &next);
            if (row >= top && row < top + m.visible) {
                char piece[LESSON_LOG_WIDTH];
                snprintf(piece, sizeof piece, "%.*s", bytes, p);
                ui_put(s, r.x, y++, text_w(r), COLORS[log->kinds[k]], ATTRS[log->kinds[k]], piece);
            }
            row++;
            p = next;
        } while (*p && row < top + m.visible);
    }
    if (marked) {
        uint64_t fresh = v->lesson_scrolled && log->appended > v->lesson_seen ? log->appended - v->lesson_seen : 0;
        char count[48];
        snprintf(count, sizeof count, "v %llu new lines below (PgDn)", (unsigned long long)fresh);
        ui_line mark;
        ui_line_init(&mark);
        if (fresh)
            ui_line_text(&mark, 9, count, "v new lines below", "v new", NULL);
        else
            ui_line_text(&mark, 9, "v more below (PgDn)", "v more", NULL);
        ui_line_put(s, r.x, r.y + r.h - 1, text_w(r), UI_TITLE, UI_REVERSE, &mark);
    }
}

// The help overlay: pairs of entries, two to a row where the terminal has
// the columns, else one; at 80x24 (the smallest lab) two columns need 70
// columns and 17 rows, so it always fits.
static const char* const HELP[][2] = {
    {"space/n  step, or continue a lesson", "r        run / pause"},
    {"+ / -    speed", "a        add a request (type, Enter)"},
    {"f        fork (shares; parent copies)", "x        cancel selected request"},
    {"p        add a system-prompt request", "[ / ]    block size, same KV (y)"},
    {"Tab      next pane / page", "1-5      page (small terminals)"},
    {"up/down  request, or layer (Step size)", "left/right  tensor (Step size)"},
    {"b  bits   g  granularity", "m  sym / asym   ,/.  parameter set"},
    {"PgUp/PgDn  scroll the lesson", "d        cycle device model"},
    {"z        quiz page (Esc returns)", "? / F1   this help   q  quit"},
    {"~N@P     N KV slots from P rolled back", "~[b]     block the rollback freed"},
};

// The overlay takes every row between the header and the key bar: a pane
// left showing beside its box had numbers cut by its frame ("block size 1"
// for 16), so the panes are blanked while it is open.
static void draw_help(ui_screen* s, const ui_layout* l) {
    ui_fill(s, (ui_rect){0, 1, s->cols, l->key_bar.y - 1}, " ", UI_DEFAULT, 0);
    int n = (int)(sizeof HELP / sizeof HELP[0]), left = 0, right = 0;
    for (int i = 0; i < n; i++) {
        int a = ui_text_columns(HELP[i][0]), b = ui_text_columns(HELP[i][1]);
        if (a > left) left = a;
        if (b > right) right = b;
    }
    int gap = 2, two_wide = left + gap + right + 4; // a frame and a space inside each side
    int area_h = l->key_bar.y - 1;                  // between the header and the key bar
    bool two = two_wide <= s->cols && n + 4 <= area_h;
    int w = two ? two_wide : (left > right ? left : right) + 4, h = (two ? n : 2 * n) + 4;
    if (w > s->cols) w = s->cols;
    if (h > area_h) h = area_h;
    ui_rect r = {(s->cols - w) / 2, 1 + (area_h - h) / 2, w, h};
    ui_box(s, r, "Help (any key closes)", true);
    ui_clip(s, inner(r));
    for (int i = 0, y = r.y + 2; i < n; i++) {
        if (two) {
            put_whole(s, r.x + 2, y, r.x + r.w - 2, UI_DEFAULT, 0, HELP[i][0]);
            put_whole(s, r.x + 2 + left + gap, y++, r.x + r.w - 2, UI_DEFAULT, 0, HELP[i][1]);
        } else
            for (int k = 0; k < 2; k++)
                put_whole(s, r.x + 2, y++, r.x + r.w - 2, UI_DEFAULT, 0, HELP[i][k]);
    }
    ui_clip_reset(s);
}

// The whole screen when the terminal is below UI_MIN_COLS x UI_MIN_ROWS.
static void draw_too_small(ui_screen* s) {
    char need[64], now[64];
    snprintf(need, sizeof need, "terminal too small: need at least %dx%d", UI_MIN_COLS, UI_MIN_ROWS);
    snprintf(now, sizeof now, "(now %dx%d; keys wait, q quits)", s->cols, s->rows);
    // Each line whole or, on a tiny terminal, in words that keep the figures whole.
    if (put_whole(s, 0, 0, s->cols, UI_BAD, UI_BOLD, need) < 0) {
        snprintf(need, sizeof need, "need %dx%d", UI_MIN_COLS, UI_MIN_ROWS);
        put_whole(s, 0, 0, s->cols, UI_BAD, UI_BOLD, need);
    }
    put_whole(s, 0, 1, s->cols, UI_DEFAULT, 0, now);
}

// The header's model: its path, else its file name, else nothing.
static void header_model(ui_line* header, const dashboard* d) {
    const char* model_text = d->serve_address[0] ? d->source.model_label
                             : d->lesson_engine  ? "(the lesson's engine)"
                                                 : d->source.model_label;
    const char* model_base = strrchr(model_text, '/');
    char model_long[UI_LINE_FORM_BYTES], model_short[UI_LINE_FORM_BYTES];
    // A path longer than a form is not shown in part: its file name is.
    if (snprintf(model_long, sizeof model_long, "  %s", model_text) >= (int)sizeof model_long) model_long[0] = '\0';
    if (snprintf(model_short, sizeof model_short, "  %.*s", UI_LINE_FORM_BYTES - 3,
                 model_base && (!d->lesson_engine || d->serve_address[0]) ? model_base + 1 : model_text) >=
        (int)sizeof model_short)
        model_short[0] = '\0';
    ui_line_text(header, 4, model_long, model_short, "", NULL);
}

// Serving: what a student runs curl against, and who is connected: these go
// only after the model path, like the step (a served lab is about them).
static void header_serving(ui_line* header, const dashboard* d) {
    char serve_long[UI_LINE_FORM_BYTES], serve_mid[UI_LINE_FORM_BYTES], serve_short[UI_LINE_FORM_BYTES];
    const char* plural = d->serve_clients == 1 ? "" : "s";
    snprintf(serve_long, sizeof serve_long, "  serving %s  %d client%s  %d queued", d->serve_address, d->serve_clients,
             plural, d->serve_submitted);
    const char* port = strrchr(d->serve_address, ':');
    port = port ? port : d->serve_address;
    snprintf(serve_mid, sizeof serve_mid, "  %s  %d client%s", port, d->serve_clients, plural);
    snprintf(serve_short, sizeof serve_short, "  %s %dcl", port, d->serve_clients);
    ui_line_text(header, 9, serve_long, serve_mid, serve_short, NULL);
}

// The header: the page and the step never go; the model path goes first.
static void draw_header(ui_screen* s, const dashboard* d, const ui_view* v, const ui_layout* l) {
    char speed_text[16], text[64];
    if (UI_SPEEDS[v->speed_index])
        snprintf(speed_text, sizeof speed_text, "%d/s", UI_SPEEDS[v->speed_index]);
    else
        snprintf(speed_text, sizeof speed_text, "max");
    ui_line header;
    ui_line_init(&header);
    ui_line_text(&header, 3, "servelab lab", "servelab", NULL);
    header_model(&header, d);
    if (d->serve_address[0]) header_serving(&header, d);
    if (fault_enabled_set) {
        // A deliberate bug (--fault) stays in sight as long as the step does:
        // every number on the screen is the broken engine's.
        char faults[UI_LINE_FORM_BYTES - 16], fault_text[UI_LINE_FORM_BYTES];
        fault_set_describe(fault_enabled_set, faults, sizeof faults);
        snprintf(fault_text, sizeof fault_text, "  FAULT %s", faults);
        ui_line_text(&header, 9, fault_text, "  FAULT", NULL);
    }
    ui_line_number(&header, 9, false, "  step ", (double)(d->lesson_engine ? d->lesson_engine->record.step : d->steps),
                   1, "");
    ui_line_text(&header, 8, v->running ? "  RUNNING" : "  paused", NULL);
    snprintf(text, sizeof text, "  speed %s", speed_text);
    ui_line_text(&header, 5, text, "", NULL);
    ui_line_number(&header, 7, true, "  block size ", dashboard_primary(d)->config.block_size, 1, "");
    if (l->mode == LAYOUT_PAGES) {
        snprintf(text, sizeof text, "  page %d/%d", l->page + 1, UI_PAGE_COUNT);
        ui_line_text(&header, 10, text, NULL);
    }
    ui_line_put(s, 0, 0, s->cols, UI_TITLE, UI_BOLD, &header);
}

// Every pane the layout shows, framed, each drawn clipped to its inside.
static void draw_panes(ui_screen* s, const dashboard* d, const ui_view* v, const ui_layout* l) {
    for (int p = 0; p < PANE_COUNT; p++) {
        if (!l->visible[p]) continue;
        ui_box(s, l->panes[p], ui_pane_title((ui_pane)p), v->focus == (ui_pane)p);
        ui_rect in = inner(l->panes[p]);
        ui_clip(s, in); // nothing a pane draws leaves it
        switch ((ui_pane)p) {
        case PANE_REQUESTS: draw_requests(s, in, d); break;
        case PANE_BLOCK_TABLES: draw_block_tables(s, in, d); break;
        case PANE_BLOCK_POOL: draw_block_pool(s, in, d); break;
        case PANE_FRAGMENTATION: draw_fragmentation(s, in, d); break;
        case PANE_TRAFFIC: draw_traffic(s, in, d, v); break;
        case PANE_STEP_SIZE: draw_step_size(s, in, d); break;
        case PANE_LESSON: draw_lesson(s, in, d, v); break;
        case PANE_COUNT: break;
        }
        ui_clip_reset(s);
    }
}

// The key bar while a prompt is typed: the end of a long prompt, where the typing is.
static void draw_edit_bar(ui_screen* s, const ui_view* v, int y) {
    ui_line edit;
    ui_line_init(&edit);
    ui_line_text(&edit, 9, "new prompt: ", NULL);
    char typed[sizeof v->edit + 2];
    int len = (int)strlen(v->edit), room = s->cols - 40 > 8 ? s->cols - 40 : 8;
    snprintf(typed, sizeof typed, "%s_", len > room ? v->edit + len - room : v->edit);
    ui_line_text(&edit, 9, typed, NULL);
    ui_line_text(&edit, 5, "  (Enter adds, Esc cancels)", "", NULL);
    ui_line_put(s, 0, y, s->cols, UI_TITLE, UI_REVERSE, &edit);
}

// The key bar's keys: every key is in the help. One row keeps "? help
// q quit" at any width; two rows (the page layouts under
// UI_KEY_BAR_ONE_ROW_COLS, 80x24 among them) show every key, "1-5 page"
// too, whole: the first row takes the keys in order while they fit.
static void draw_keys_bar(ui_screen* s, const dashboard* d, ui_rect bar, bool pages) {
    static const char* const KEYS[] = {
        "spc step",  "r run",  "+/- speed", "a add",    "p shared",         "f fork", "x cancel",
        "[/] block", "z quiz", "Tab focus", "1-5 page", "PgUp/PgDn lesson", "? help", "q quit"};
    static const int PRIORITY[] = {8, 7, 4, 6, 3, 5, 5, 3, 4, 6, 6, 2, 9, 9};
    enum { N_KEYS = (int)(sizeof KEYS / sizeof KEYS[0]), PAGE_KEYS = 10 };
    ui_line rows[2];
    ui_line_init(&rows[0]);
    ui_line_init(&rows[1]);
    int row = 0, used = 0;
    for (int i = 0; i < N_KEYS; i++) {
        // Serving, requests come from clients: a, p, f, x and [/] (indexes 3..7) act on
        // the lab's own engines, which are not drawn, so the bar leaves them out.
        if (d->serve_address[0] && i >= 3 && i <= 7) continue;
        if (i == PAGE_KEYS && !pages) continue; // the grid shows every pane: no pages to pick
        const char* gap = rows[row].n ? "  " : "";
        int columns = ui_text_columns(gap) + ui_text_columns(KEYS[i]);
        if (bar.h > 1 && row == 0 && used + columns > bar.w) {
            row = 1;
            used = 0;
            gap = "";
            columns = ui_text_columns(KEYS[i]);
        }
        char key[32];
        snprintf(key, sizeof key, "%s%s", gap, KEYS[i]);
        ui_line_text(&rows[row], PRIORITY[i], key, "", NULL);
        used += columns;
    }
    for (int k = 0; k < bar.h && k < 2; k++)
        ui_line_put(s, 0, bar.y + k, bar.w, UI_DEFAULT, UI_REVERSE, &rows[k]);
}

// "Restart with block size N?", with what the pool becomes: the KV memory
// stays, so 128 blocks of 16 become 64 of 32 (the same 2048 slots).
static void draw_confirm_bar(ui_screen* s, const dashboard* d, const ui_view* v, int y) {
    int block_size = v->pending_block_size, n_blocks = dashboard_blocks_for(d, block_size);
    int64_t slots_now = engine_pool_slots(&d->paged), slots_then = (int64_t)n_blocks * block_size;
    char pool_long[UI_LINE_FORM_BYTES], pool_short[UI_LINE_FORM_BYTES];
    if (slots_then == slots_now) {
        snprintf(pool_long, sizeof pool_long, ": same KV memory, %d blocks x %d = %lld slots", n_blocks, block_size,
                 (long long)slots_then);
        snprintf(pool_short, sizeof pool_short, ": same KV, %d blocks", n_blocks);
    } else { // the bytes do not divide into whole blocks of the new size
        snprintf(pool_long, sizeof pool_long, ": same KV memory, %d blocks x %d = %lld of %lld slots", n_blocks,
                 block_size, (long long)slots_then, (long long)slots_now);
        snprintf(pool_short, sizeof pool_short, ": %d blocks, %lld of %lld slots", n_blocks, (long long)slots_then,
                 (long long)slots_now);
    }
    ui_line confirm;
    ui_line_init(&confirm);
    ui_line_number(&confirm, 9, false, "restart both engines with block size ", block_size, 1, "");
    ui_line_text(&confirm, 8, pool_long, pool_short, NULL);
    ui_line_text(&confirm, 9, "? (y/n)", NULL);
    ui_line_put(s, 0, y, s->cols, UI_BAD, UI_REVERSE, &confirm);
}

// A message on the key bar's rows, broken at word ends (the next key clears it).
static void draw_message_bar(ui_screen* s, const char* message, ui_rect bar) {
    const char* p = message;
    for (int y = bar.y; y < bar.y + bar.h && *p; y++) {
        if (put_whole(s, 0, y, s->cols, UI_DEFAULT, UI_REVERSE, p) >= 0) return;
        char head[512];
        const char* rest;
        snprintf(head, sizeof head, "%.*s", wrap_row(p, s->cols, &rest), p);
        ui_put(s, 0, y, s->cols, UI_DEFAULT, UI_REVERSE, head);
        p = rest;
    }
}

// The bottom row(s): the prompt being typed, the block-size question, the
// last message, else the keys.
static void draw_key_bar(ui_screen* s, const dashboard* d, const ui_view* v, const ui_layout* l) {
    if (v->mode == UI_MODE_EDIT)
        draw_edit_bar(s, v, l->key_bar.y);
    else if (v->mode == UI_MODE_CONFIRM)
        draw_confirm_bar(s, d, v, l->key_bar.y);
    else if (v->message[0])
        draw_message_bar(s, v->message, l->key_bar);
    else
        draw_keys_bar(s, d, l->key_bar, l->mode == LAYOUT_PAGES);
}

void ui_draw(ui_screen* s, const dashboard* d, const ui_view* v) {
    ui_screen_clear(s);
    ui_layout l = ui_layout_compute(s->cols, s->rows, v->page);
    if (l.mode == LAYOUT_TOO_SMALL) {
        draw_too_small(s);
        return;
    }
    draw_header(s, d, v, &l);
    draw_panes(s, d, v, &l);
    draw_key_bar(s, d, v, &l);
    if (v->help) draw_help(s, &l);
}
