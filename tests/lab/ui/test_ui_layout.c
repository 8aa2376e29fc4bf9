// The dashboard layout as a pure function: over a range of terminal sizes
// panes never overlap, never leave the screen, and each gets its minimum,
// else the page layout (or the too-small message) is chosen.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include "lab/ui/layout.h"
#include "tests/test_support.h"

static bool overlap(ui_rect a, ui_rect b) {
    return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}

static void check_layout(int cols, int rows, int page) {
    ui_layout l = ui_layout_compute(cols, rows, page);
    if (cols < UI_MIN_COLS || rows < UI_MIN_ROWS) {
        assert_int_equal(l.mode, LAYOUT_TOO_SMALL);
        return;
    }
    assert_int_not_equal(l.mode, LAYOUT_TOO_SMALL);
    int shown = 0;
    for (int p = 0; p < PANE_COUNT; p++) {
        if (!l.visible[p]) continue;
        shown++;
        ui_rect r = l.panes[p];
        int min_cols, min_rows;
        ui_pane_minimum((ui_pane)p, &min_cols, &min_rows);
        assert_true(r.w >= min_cols && r.h >= min_rows);
        assert_true(r.x >= 0 && r.y >= 1 && r.x + r.w <= cols && r.y + r.h <= l.key_bar.y); // header and key bar kept
        if (l.mode == LAYOUT_PAGES) assert_int_equal(ui_pane_page((ui_pane)p), l.page);
        for (int q = p + 1; q < PANE_COUNT; q++)
            if (l.visible[q]) assert_false(overlap(r, l.panes[q]));
    }
    // The key bar is the last row, or the last two in a page layout too narrow for its keys in one.
    assert_int_equal(l.key_bar.y + l.key_bar.h, rows);
    assert_int_equal(l.key_bar.h, l.mode == LAYOUT_PAGES && cols < UI_KEY_BAR_ONE_ROW_COLS ? 2 : 1);
    if (l.mode == LAYOUT_GRID) assert_int_equal(shown, PANE_COUNT);
    else assert_true(shown >= 1);
}

static void test_layout_sizes(void** state) {
    (void)state;
    for (int cols = 20; cols <= 320; cols += 7)
        for (int rows = 5; rows <= 120; rows += 3)
            for (int page = 0; page < UI_PAGE_COUNT; page++) check_layout(cols, rows, page);
    for (int page = 0; page < UI_PAGE_COUNT; page++) check_layout(80, 24, page);
}

static void test_layout_modes(void** state) {
    (void)state;
    assert_int_equal(ui_layout_compute(80, 24, 0).mode, LAYOUT_PAGES);
    assert_int_equal(ui_layout_compute(79, 24, 0).mode, LAYOUT_TOO_SMALL);
    assert_int_equal(ui_layout_compute(80, 23, 0).mode, LAYOUT_TOO_SMALL);
    assert_int_equal(ui_layout_compute(200, 60, 0).mode, LAYOUT_GRID);
    // Every pane is on some page, so the page layout shows everything.
    bool seen[PANE_COUNT] = {false};
    for (int page = 0; page < UI_PAGE_COUNT; page++) {
        ui_layout l = ui_layout_compute(80, 24, page);
        for (int p = 0; p < PANE_COUNT; p++) seen[p] |= l.visible[p];
    }
    for (int p = 0; p < PANE_COUNT; p++) assert_true(seen[p]);
    // 80x24, page 2: fragmentation gets the 12 rows both layouts' bars need
    // (equal halves gave it 11, and the contiguous half was dropped).
    ui_layout l = ui_layout_compute(80, 24, 1);
    assert_true(l.visible[PANE_FRAGMENTATION] && l.panes[PANE_FRAGMENTATION].h >= 12);
    assert_true(l.visible[PANE_BLOCK_POOL]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_sizes),
        cmocka_unit_test(test_layout_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
