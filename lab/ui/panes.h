// ui_panes: draws the dashboard into a ui_screen from the step records and
// the engines' read-only views (dashboard.h). Nothing here changes state.
#ifndef SERVELAB_UI_PANES_H
#define SERVELAB_UI_PANES_H

#include <stdbool.h>

#include "lab/ui/dashboard.h"
#include "lab/ui/layout.h"
#include "lab/ui/screen.h"

typedef enum ui_mode { UI_MODE_NORMAL = 0, UI_MODE_EDIT = 1, UI_MODE_CONFIRM = 2 } ui_mode;

// What the controls decide and the panes show.
typedef struct ui_view {
    ui_pane focus;
    int page;
    bool running;
    int speed_index;      // into UI_SPEEDS
    bool help;
    int device;           // into device_models
    ui_mode mode;
    char edit[128];       // the prompt line being edited
    int pending_block_size; // UI_MODE_CONFIRM: the block size asked for
    char message[512];    // one-line status (errors, confirmations)
    // The lesson pane follows the newest lines unless scrolled (PgUp/PgDn):
    // then lesson_top is its first row shown and lesson_seen the log's
    // `appended` count when scrolling began (the "new lines below" mark).
    bool lesson_scrolled;
    int lesson_top;
    uint64_t lesson_seen;
} ui_view;

extern const int UI_SPEEDS[8]; // steps per second; 0 = as fast as the engine goes

void ui_draw(ui_screen* s, const dashboard* d, const ui_view* v);

// PgUp (pages < 0) / PgDn (pages > 0) in the lesson pane, as laid out on a
// cols x rows screen; shows the lesson's page first where it is not shown.
// Scrolling to the end follows new lines again.
void ui_lesson_scroll(const dashboard* d, ui_view* v, int cols, int rows, int pages);

#endif
