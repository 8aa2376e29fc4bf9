// ui_screen: a virtual screen, a grid of cells that the panes draw into.
//
// Every frame is drawn here first and then either flushed to ncurses or
// dumped as plain UTF-8 text (servelab lab --dump-frame), so the same
// drawing code runs with and without a terminal. A cell holds one
// character (its UTF-8 bytes, one column wide), a colour and attributes.
// Glyphs for boxes and bars come from ui_glyphs, with an ASCII set for
// terminals whose locale is not UTF-8.
#ifndef SERVELAB_UI_SCREEN_H
#define SERVELAB_UI_SCREEN_H

#include <stdbool.h>
#include <stdio.h>

typedef enum ui_color {
    UI_DEFAULT = 0,
    // Owners of blocks, chosen to stay apart under common colour blindness
    // (blue / orange(yellow) / magenta / cyan / green / white); letters a..z
    // are the shape cue that works without colour.
    UI_OWNER0, UI_OWNER1, UI_OWNER2, UI_OWNER3, UI_OWNER4, UI_OWNER5,
    UI_SHARED,  // a block held by more than one table
    UI_CACHED,  // cached but free (evictable)
    UI_FREE,    // dim
    UI_GOOD,
    UI_BAD,
    UI_TITLE,
    UI_COLOR_COUNT
} ui_color;

enum { UI_OWNER_COLORS = 6 };

typedef enum ui_attr { UI_PLAIN = 0, UI_BOLD = 1, UI_REVERSE = 2, UI_DIM = 4 } ui_attr;

typedef struct ui_cell {
    char text[5];  // one character, UTF-8, NUL-terminated
    unsigned char color; // ui_color
    unsigned char attr;  // ui_attr bits
} ui_cell;

typedef struct ui_glyphs {
    const char *horizontal, *vertical, *top_left, *top_right, *bottom_left, *bottom_right;
    const char* full;   // a filled bar cell
    const char* shade;  // a second bar fill (stacked bars)
    const char* light;  // a third bar fill
    const char* dots;   // a fourth
    const char* empty;  // an empty bar cell
    const char* eighths[9]; // vertical bar heights 0..8 eighths (histograms)
    const char* marker; // a quantization level under the histogram
} ui_glyphs;

typedef struct ui_screen {
    int cols, rows;
    ui_cell* cells;   // (rows, cols)
    bool utf8;        // box and block characters; else ASCII
    bool color;       // false with NO_COLOR or a monochrome terminal
    const ui_glyphs* glyphs;
} ui_screen;

typedef struct ui_rect {
    int x, y, w, h; // columns and rows, (x, y) the top-left cell
} ui_rect;

int ui_screen_init(ui_screen* s, int cols, int rows, bool utf8, bool color);
void ui_screen_free(ui_screen* s);
// Resizes (contents cleared). -1 on out of memory (the old grid is kept).
int ui_screen_resize(ui_screen* s, int cols, int rows);
void ui_screen_clear(ui_screen* s);

// Writes UTF-8 text from (x, y), at most max_cols columns (clipped at the
// screen edge too); control characters become '?'. Returns columns written.
int ui_put(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* text);
int ui_printf(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* format, ...)
    __attribute__((format(printf, 7, 8)));
// Fills a rectangle with one glyph.
void ui_fill(ui_screen* s, ui_rect r, const char* glyph, ui_color color, int attr);
// A frame around r with a title in its top edge (bold when focused).
void ui_box(ui_screen* s, ui_rect r, const char* title, bool focused);

// One line per row, trailing spaces trimmed, UTF-8. 0 or -1 on a write error.
int ui_screen_dump(const ui_screen* s, FILE* out);
// Copies the grid to the ncurses standard screen (caller owns initscr).
void ui_screen_flush_curses(const ui_screen* s);
// Sets up ncurses colour pairs for ui_color (after initscr, when s->color).
void ui_screen_init_curses_colors(void);

#endif
