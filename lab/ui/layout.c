#include "lab/ui/layout.h"

#include <string.h>

// Minimums: the pane's fixed lines plus a few rows of content, so that
// nothing a test or a student reads is ever cut off.
static const int MINIMUM[PANE_COUNT][2] = {
    {40, 8},  // requests: counts + 5 sequences
    {40, 8},  // block tables: events + 5 sequences
    {40, 8},  // block pool: legend, counts, 3 rows of cells
    {40, 12}, // fragmentation: 2 layouts x (a label + 4 bars) inside the frame
    {60, 20}, // memory traffic: bar, figures, history, device
    {60, 20}, // step size: figures + histogram
    {30, 5},  // lesson
};
static const char* const TITLES[PANE_COUNT] = {
    "1 Requests", "1 Block tables", "2 Block pool", "2 Fragmentation", "3 Memory traffic", "4 Step size", "5 Lesson",
};
static const int PAGE_OF[PANE_COUNT] = {0, 0, 1, 1, 2, 3, 4};

void ui_pane_minimum(ui_pane pane, int* cols, int* rows) {
    *cols = MINIMUM[pane][0];
    *rows = MINIMUM[pane][1];
}

const char* ui_pane_title(ui_pane pane) { return TITLES[pane]; }
int ui_pane_page(ui_pane pane) { return PAGE_OF[pane]; }

static bool fits(const ui_layout* l) {
    for (int p = 0; p < PANE_COUNT; p++)
        if (l->visible[p] && (l->panes[p].w < MINIMUM[p][0] || l->panes[p].h < MINIMUM[p][1])) return false;
    return true;
}

static ui_rect rect(int x, int y, int w, int h) { return (ui_rect){x, y, w, h}; }

// Three columns: requests over block tables | pool over fragmentation |
// traffic over step size over lesson.
static void grid(ui_layout* l, int cols, int top, int height) {
    int w0 = cols * 3 / 10, w1 = cols * 3 / 10, w2 = cols - w0 - w1;
    int half = height / 2;
    l->panes[PANE_REQUESTS] = rect(0, top, w0, half);
    l->panes[PANE_BLOCK_TABLES] = rect(0, top + half, w0, height - half);
    l->panes[PANE_BLOCK_POOL] = rect(w0, top, w1, half);
    l->panes[PANE_FRAGMENTATION] = rect(w0, top + half, w1, height - half);
    int lesson = height / 6 < 5 ? 5 : height / 6;
    int traffic = (height - lesson) / 2;
    l->panes[PANE_TRAFFIC] = rect(w0 + w1, top, w2, traffic);
    l->panes[PANE_STEP_SIZE] = rect(w0 + w1, top + traffic, w2, height - lesson - traffic);
    l->panes[PANE_LESSON] = rect(w0 + w1, top + height - lesson, w2, lesson);
    for (int p = 0; p < PANE_COUNT; p++) l->visible[p] = true;
}

// Each pane of the page gets its minimum rows and an equal share of the
// rest: at 80x24 (21 rows under a two-row key bar) the block pool gets 8
// and fragmentation 13, both layouts' bars with a row to spare (equal
// halves would leave fragmentation 10, two short).
static void page(ui_layout* l, int cols, int top, int height, int which) {
    int members[PANE_COUNT], n = 0, needed = 0;
    for (int p = 0; p < PANE_COUNT; p++)
        if (PAGE_OF[p] == which) {
            members[n++] = p;
            needed += MINIMUM[p][1];
        }
    int spare = height > needed ? height - needed : 0;
    int y = top;
    for (int k = 0; k < n; k++) {
        int h = k == n - 1 ? top + height - y : MINIMUM[members[k]][1] + spare / n;
        l->panes[members[k]] = rect(0, y, cols, h);
        l->visible[members[k]] = true;
        y += h;
    }
}

ui_layout ui_layout_compute(int cols, int rows, int page_index) {
    ui_layout l;
    memset(&l, 0, sizeof l);
    l.page = ((page_index % UI_PAGE_COUNT) + UI_PAGE_COUNT) % UI_PAGE_COUNT;
    if (cols < UI_MIN_COLS || rows < UI_MIN_ROWS) {
        l.mode = LAYOUT_TOO_SMALL;
        return l;
    }
    l.header = rect(0, 0, cols, 1);
    l.key_bar = rect(0, rows - 1, cols, 1);
    int top = 1, height = rows - 2;
    l.mode = LAYOUT_GRID;
    grid(&l, cols, top, height);
    if (fits(&l)) return l;
    memset(l.visible, 0, sizeof l.visible);
    memset(l.panes, 0, sizeof l.panes);
    l.mode = LAYOUT_PAGES;
    if (cols < UI_KEY_BAR_ONE_ROW_COLS) { // every key whole, on two rows
        l.key_bar = rect(0, rows - 2, cols, 2);
        height--;
    }
    page(&l, cols, top, height, l.page);
    return l;
}
