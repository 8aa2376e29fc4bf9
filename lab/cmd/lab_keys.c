// lab_keys: what one key does in the lab, in each of its modes: the quiz
// page, "terminal too small", typing a prompt, confirming a block size, the
// help overlay, and the panes.
#include "lab/cmd/lab_app.h"

#include <stdio.h>
#include <string.h>

#include "engine/devices.h"
#include "lab/ui/layout.h"

static const int BLOCK_SIZES[] = {1, 2, 4, 8, 16, 32, 64, 128};

static void change_block_size(lab_app* a, int direction) {
    int n = (int)(sizeof BLOCK_SIZES / sizeof BLOCK_SIZES[0]), at = 0;
    for (int i = 0; i < n; i++)
        if (BLOCK_SIZES[i] == a->d.config.block_size) at = i;
    at += direction;
    if (at < 0 || at >= n) return;
    a->v.pending_block_size = BLOCK_SIZES[at];
    a->v.mode = UI_MODE_CONFIRM;
}

// Typing a prompt (a): Enter adds it as a request, Esc drops it.
static void edit_key(lab_app* a, int key) {
    ui_view* v = &a->v;
    error_info err = {{0}};
    size_t len = strlen(v->edit);
    if (key == KEY_CODE_ENTER) {
        v->mode = UI_MODE_NORMAL;
        if (len && dashboard_add_prompt(&a->d, v->edit, a->d.max_new_tokens, 1, 0.0f, &err))
            lab_set_message(a, err.message);
        v->edit[0] = '\0';
    } else if (key == KEY_CODE_ESC) {
        v->mode = UI_MODE_NORMAL;
        v->edit[0] = '\0';
    } else if (key == KEY_CODE_BACKSPACE) {
        if (len) v->edit[len - 1] = '\0';
    } else if (key >= 0x20 && key < 0x7f && len + 1 < sizeof v->edit) {
        v->edit[len] = (char)key;
        v->edit[len + 1] = '\0';
    }
}

// "Restart with block size N?": y restarts the engines, any other key keeps them.
static void confirm_key(lab_app* a, int key) {
    error_info err = {{0}};
    a->v.mode = UI_MODE_NORMAL;
    if (key != 'y' && key != 'Y') return;
    if (dashboard_set_block_size(&a->d, a->v.pending_block_size, &err)) {
        lab_set_message(a, err.message);
        return;
    }
    char text[160];
    snprintf(text, sizeof text,
             "engines restarted with block size %d: %d blocks, %lld slots of the same KV memory; "
             "requests replayed",
             a->d.config.block_size, a->d.config.num_blocks, (long long)engine_pool_slots(&a->d.paged));
    lab_set_message(a, text);
}

// After f: what the next step does to the shared blocks. The parent runs
// first (the child is queued after it), so when the shared tail block is
// partly filled the parent copies it and the child keeps the original
// (kv_layout_paged.c prepare_decode); a full tail is not written again.
static void say_who_copies(lab_app* a, int32_t parent, int32_t child) {
    step_sequence_status p;
    if (!engine_sequence_status(&a->d.paged, parent, &p)) return;
    int block_size = a->d.paged.config.block_size, tail = p.n_computed % block_size;
    // The panes' names: a letter per id (a..z) and the id.
    char parent_name[16], child_name[16], blocks[32], text[200];
    snprintf(blocks, sizeof blocks, "%d block%s", p.n_table, p.n_table == 1 ? "" : "s");
    snprintf(parent_name, sizeof parent_name, "%c#%d", 'a' + parent % 26, parent);
    snprintf(child_name, sizeof child_name, "%c#%d", 'a' + child % 26, child);
    if (p.state != SEQ_DECODE)
        snprintf(text, sizeof text, "forked %s into %s: they share %s", parent_name, child_name, blocks);
    else if (tail)
        snprintf(text, sizeof text,
                 "forked %s into %s, sharing %s: next step %s (run first) copies the shared tail (%d/%d), "
                 "%s keeps it",
                 parent_name, child_name, blocks, parent_name, tail, block_size, child_name);
    else
        snprintf(text, sizeof text,
                 "forked %s into %s, sharing %s: the tail is full, so each takes a new "
                 "block and nothing is copied",
                 parent_name, child_name, blocks);
    lab_set_message(a, text);
}

// a f p x [ ]: the keys that change the lab's own requests or engines.
static void request_key(lab_app* a, int key) {
    error_info err = {{0}};
    if (a->server) { // the panes draw the server's engine: its requests come from clients
        char text[sizeof a->v.message];
        snprintf(text, sizeof text,
                 "serving: requests come from clients, e.g. curl %s/v1/completions -d "
                 "'{\"model\":\"%.100s\",\"prompt\":\"Hi\",\"stream\":true}'",
                 a->d.serve_address, a->serve_model);
        lab_set_message(a, text);
        return;
    }
    if (key == 'a') {
        a->v.mode = UI_MODE_EDIT;
        a->v.edit[0] = '\0';
    }
    if (key == 'f') {
        int32_t parent = a->d.selected;
        if (dashboard_fork_selected(&a->d, &err))
            lab_set_message(a, err.message);
        else
            say_who_copies(a, parent, a->d.selected);
    }
    if (key == 'p' && dashboard_add_shared_prompt(&a->d, &err)) lab_set_message(a, err.message);
    if (key == 'x' && dashboard_cancel_selected(&a->d, &err)) lab_set_message(a, err.message);
    if (key == '[' || key == ']') change_block_size(a, key == '[' ? -1 : +1);
}

// The step-size pane's keys: arrows pick the layer and tensor, b g m the
// scheme, , . the group or channel shown. False for any other key.
static bool step_size_key(lab_app* a, int key) {
    step_size_view* q = &a->d.step_size;
    switch (key) {
    case KEY_CODE_UP:
    case KEY_CODE_DOWN: q->layer += key == KEY_CODE_UP ? -1 : 1; break;
    case KEY_CODE_LEFT:
    case KEY_CODE_RIGHT: q->tensor += key == KEY_CODE_LEFT ? -1 : 1; break;
    case 'b': q->scheme.bits = q->scheme.bits >= 8 ? 2 : q->scheme.bits + 1; break; // bits 2..8, cycling
    case 'g':
        q->scheme.granularity = (quant_granularity)((q->scheme.granularity + 1) % 3);
        q->set_index = 0;
        break;
    case 'm': q->scheme.symmetric = !q->scheme.symmetric; break;
    case ',':
    case '.': q->set_index += key == ',' ? -1 : 1; break;
    default: return false;
    }
    dashboard_update_step_size(&a->d);
    return true;
}

// Up and down outside the step-size pane: the selected request.
static void select_key(lab_app* a, int key) {
    step_record now = {0}; // the ids handed out so far, those added since the last step included
    if (engine_snapshot(dashboard_primary(&a->d), &now)) {
        step_record_free(&now);
        return;
    }
    int n = now.n_sequence_ids;
    step_record_free(&now);
    a->d.selected += key == KEY_CODE_UP ? -1 : 1;
    if (a->d.selected < 0) a->d.selected = 0;
    if (a->d.selected >= n) a->d.selected = n > 0 ? n - 1 : 0;
}

// Tab and 1-5: the focused pane and the page it is on.
static void focus_key(lab_app* a, int key) {
    ui_view* v = &a->v;
    if (key == KEY_CODE_TAB) {
        v->focus = (ui_pane)((v->focus + 1) % PANE_COUNT);
        v->page = ui_pane_page(v->focus);
        return;
    }
    v->page = key - '1';
    for (int p = 0; p < PANE_COUNT; p++)
        if (ui_pane_page((ui_pane)p) == v->page) {
            v->focus = (ui_pane)p;
            break;
        }
}

// The panes' keys (the help overlay lists them).
static void panes_key(lab_app* a, int key) {
    ui_view* v = &a->v;
    v->message[0] = '\0';
    bool on_step_size = v->focus == PANE_STEP_SIZE;
    // The step-size keys b g m , . act whatever the focus; its arrows only with it.
    bool arrow = key == KEY_CODE_UP || key == KEY_CODE_DOWN || key == KEY_CODE_LEFT || key == KEY_CODE_RIGHT;
    if ((on_step_size || !arrow) && step_size_key(a, key)) return;
    int n_devices = 0;
    device_models(&n_devices);
    switch (key) {
    case ' ':
    case 'n': lab_step(a); break;
    case 'r':
        if (lab_lesson_active(a))
            lab_set_message(a, "a lesson is running: space continues it");
        else
            v->running = !v->running;
        a->next_step_at = 0;
        break;
    case '+':
    case '=':
        if (v->speed_index < 7) v->speed_index++;
        break;
    case '-':
        if (v->speed_index > 0) v->speed_index--;
        break;
    case 'a':
    case 'f':
    case 'p':
    case 'x':
    case '[':
    case ']': request_key(a, key); break;
    case 'd': v->device = (v->device + 1) % n_devices; break;
    case 'z': lab_open_quiz(a); break;
    case '?':
    case KEY_CODE_F1: v->help = true; break;
    case KEY_CODE_PGUP: ui_lesson_scroll(&a->d, v, a->cols, a->rows, -1); break;
    case KEY_CODE_PGDN: ui_lesson_scroll(&a->d, v, a->cols, a->rows, +1); break;
    case 'q': a->quit = true; break;
    case KEY_CODE_TAB:
    case '1':
    case '2':
    case '3':
    case '4':
    case '5': focus_key(a, key); break;
    case KEY_CODE_UP:
    case KEY_CODE_DOWN: select_key(a, key); break;
    default: break;
    }
}

void lab_handle_key(lab_app* a, int key) {
    ui_view* v = &a->v;
    if (a->quiz_open) {
        lab_quiz_key(a, key);
        return;
    }
    // Behind "terminal too small" nothing the student cannot see happens; q still quits.
    if (ui_layout_compute(a->cols, a->rows, v->page).mode == LAYOUT_TOO_SMALL) {
        if (key == 'q') a->quit = true;
        return;
    }
    if (v->mode == UI_MODE_EDIT)
        edit_key(a, key);
    else if (v->mode == UI_MODE_CONFIRM)
        confirm_key(a, key);
    else if (v->help)
        v->help = false; // any key closes the overlay
    else
        panes_key(a, key);
}
