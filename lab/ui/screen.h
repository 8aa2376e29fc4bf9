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

typedef struct ui_rect {
    int x, y, w, h; // columns and rows, (x, y) the top-left cell
} ui_rect;

// A test hook: called for every ui_put whose text did not fit whole, with
// the text, where it started, the columns shown and the columns it has.
typedef void (*ui_cut_hook)(void* user, const char* text, int x, int y, int shown, int columns);

typedef struct ui_screen {
    int cols, rows;
    ui_cell* cells;   // (rows, cols)
    bool utf8;        // box and block characters; else ASCII
    bool color;       // false with NO_COLOR or a monochrome terminal
    const ui_glyphs* glyphs;
    ui_rect clip;     // writes outside it are dropped (a pane's inside while it draws)
    ui_cut_hook cut_hook; // NULL unless a test watches this screen
    void* cut_hook_user;
} ui_screen;

int ui_screen_init(ui_screen* s, int cols, int rows, bool utf8, bool color);
void ui_screen_free(ui_screen* s);
// Resizes (contents cleared). -1 on out of memory (the old grid is kept).
int ui_screen_resize(ui_screen* s, int cols, int rows);
void ui_screen_clear(ui_screen* s);

// Writes UTF-8 text from (x, y), at most max_cols columns (clipped at the
// clip rectangle and the screen edge too); control characters become '?'.
// Returns columns written. Text that does not fit is cut: callers fit it
// first (ui_line, ui_format_*), and the cut hook lets tests catch the rest.
int ui_put(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* text);
int ui_printf(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* format, ...)
    __attribute__((format(printf, 7, 8)));
// Limits writes to r (intersected with the screen); ui_clip_reset: the screen.
void ui_clip(ui_screen* s, ui_rect r);
void ui_clip_reset(ui_screen* s);

// Watches s with a cut hook (kept across ui_screen_resize); NULL turns it off.
void ui_screen_set_cut_hook(ui_screen* s, ui_cut_hook hook, void* user);

// Columns of UTF-8 text (one per character).
int ui_text_columns(const char* text);

// ---- numbers that fit -------------------------------------------------------------------
// Each writes at most max_cols columns (and size bytes) and returns the
// columns used, or -1 when not even the shortest honest form fits: a
// number is never cut, it loses significant digits or takes a larger unit.

// value with up to `digits` significant digits (%g: 8.07e-05, 0.0283, 2048),
// fewer while it does not fit; an integer below 1e15 is written whole or not at all.
int ui_format_number(char* out, size_t size, double value, int digits, int max_cols);
// value in an SI-prefixed unit: 8.1e-05 "s" -> "81 µs", 1.2e9 "B/s" -> "1.2 GB/s"
// (prefixes from p to E; up to `digits` significant digits, fewer to fit).
int ui_format_si(char* out, size_t size, double value, const char* unit, int digits, int max_cols);
// bytes in binary units: "512 B", "1.5 KiB", "64 MiB".
int ui_format_bytes(char* out, size_t size, double bytes, int max_cols);

// ---- lines that fit ---------------------------------------------------------------------
// A line made of fields, each with a few forms from the longest to the
// shortest (a number's forms lose digits; a label's are shorter words; ""
// drops the field). ui_line_put shortens the field of lowest priority
// first (the later one on a tie) until the line fits; when even the
// shortest forms do not fit, it stops before the first field that would be
// cut, so no field is ever shown in part.
enum { UI_LINE_FIELDS = 16, UI_LINE_FORMS = 5, UI_LINE_FORM_BYTES = 200 };
typedef struct ui_line {
    char forms[UI_LINE_FIELDS][UI_LINE_FORMS][UI_LINE_FORM_BYTES];
    int n_forms[UI_LINE_FIELDS];
    int priority[UI_LINE_FIELDS];
    int n;
} ui_line;

void ui_line_init(ui_line* l);
// A text field; up to UI_LINE_FORMS forms, NULL-terminated, longest first.
void ui_line_text(ui_line* l, int priority, const char* form, ...);
// before + value (ui_format_number, `digits` down to 1) + after; droppable
// adds "" as the last form.
void ui_line_number(ui_line* l, int priority, bool droppable, const char* before, double value, int digits,
                    const char* after);
// before + value in an SI-prefixed unit (ui_format_si) + after.
void ui_line_si(ui_line* l, int priority, bool droppable, const char* before, double value, const char* unit,
                const char* after);
// The chosen forms, joined, into out; returns the columns.
int ui_line_fit(const ui_line* l, int max_cols, char* out, size_t size);
int ui_line_put(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const ui_line* l);

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
