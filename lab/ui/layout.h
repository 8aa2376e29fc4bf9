// ui_layout: where each pane goes, as a pure function of the terminal size.
//
// Large terminals get a grid of every pane; smaller ones (down to 80x24)
// get one page per pane group, switched with the number keys and Tab; below
// that a message says how big the terminal must be. Row 0 is the header
// and the last row the key bar in the grid and page layouts (the last two
// in page layouts narrower than UI_KEY_BAR_ONE_ROW_COLS).
#ifndef SERVELAB_UI_LAYOUT_H
#define SERVELAB_UI_LAYOUT_H

#include <stdbool.h>

#include "lab/ui/screen.h"

typedef enum ui_pane {
    PANE_REQUESTS = 0,
    PANE_BLOCK_TABLES,
    PANE_BLOCK_POOL,
    PANE_FRAGMENTATION,
    PANE_TRAFFIC,
    PANE_STEP_SIZE,
    PANE_LESSON,
    PANE_COUNT
} ui_pane;

typedef enum ui_layout_mode { LAYOUT_GRID = 0, LAYOUT_PAGES = 1, LAYOUT_TOO_SMALL = 2 } ui_layout_mode;

enum {
    UI_MIN_COLS = 80, // the page layout's minimum terminal
    UI_MIN_ROWS = 24,
    UI_PAGE_COUNT = 5,
    // The key bar's 14 keys in one row ("spc step  r run ... ? help  q quit",
    // panes.c) take 135 columns: narrower page layouts give it two rows.
    UI_KEY_BAR_ONE_ROW_COLS = 135,
};

typedef struct ui_layout {
    ui_layout_mode mode;
    int page;                    // LAYOUT_PAGES: the page shown, 0..UI_PAGE_COUNT-1
    bool visible[PANE_COUNT];
    ui_rect panes[PANE_COUNT];   // valid where visible
    ui_rect header;              // row 0
    ui_rect key_bar;             // the last row, or the last two
} ui_layout;

// The smallest rectangle (frame included) in which a pane still says what it must.
void ui_pane_minimum(ui_pane pane, int* cols, int* rows);
const char* ui_pane_title(ui_pane pane);
// The page a pane is on in the page layout.
int ui_pane_page(ui_pane pane);

// The layout for a cols x rows terminal; `page` is used in the page layout
// (taken modulo UI_PAGE_COUNT).
ui_layout ui_layout_compute(int cols, int rows, int page);

#endif
