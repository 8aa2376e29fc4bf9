#include "lab/ui_screen.h"

#include <curses.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const ui_glyphs UTF8_GLYPHS = {
    "\u2500", "\u2502", "\u250c", "\u2510", "\u2514", "\u2518",
    "\u2588", "\u2593", "\u2592", "\u2591", "\u00b7",
    {" ", "\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"},
    "\u2534",
};
static const ui_glyphs ASCII_GLYPHS = {
    "-", "|", "+", "+", "+", "+", "#", "=", "+", ":", ".",
    {" ", ".", ".", "_", "_", "o", "o", "O", "#"},
    "^",
};

int ui_screen_init(ui_screen* s, int cols, int rows, bool utf8, bool color) {
    memset(s, 0, sizeof *s);
    s->utf8 = utf8;
    s->color = color;
    s->glyphs = utf8 ? &UTF8_GLYPHS : &ASCII_GLYPHS;
    return ui_screen_resize(s, cols, rows);
}

void ui_screen_free(ui_screen* s) {
    free(s->cells);
    s->cells = NULL;
    s->cols = s->rows = 0;
}

int ui_screen_resize(ui_screen* s, int cols, int rows) {
    if (cols < 1) cols = 1;
    if (rows < 1) rows = 1;
    ui_cell* cells = calloc((size_t)cols * (size_t)rows, sizeof *cells);
    if (!cells) return -1;
    free(s->cells);
    s->cells = cells;
    s->cols = cols;
    s->rows = rows;
    ui_screen_clear(s);
    return 0;
}

void ui_screen_clear(ui_screen* s) {
    for (int i = 0; i < s->cols * s->rows; i++) {
        s->cells[i].text[0] = ' ';
        s->cells[i].text[1] = '\0';
        s->cells[i].color = UI_DEFAULT;
        s->cells[i].attr = UI_PLAIN;
    }
}

// Length of the UTF-8 sequence that starts with byte c (1 for a stray byte).
static int utf8_length(unsigned char c) {
    if (c >= 0xf0 && c < 0xf8) return 4;
    if (c >= 0xe0) return c < 0xf0 ? 3 : 1;
    if (c >= 0xc0) return 2;
    return 1;
}

int ui_put(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* text) {
    if (y < 0 || y >= s->rows || !text) return 0;
    int written = 0;
    const unsigned char* p = (const unsigned char*)text;
    while (*p && written < max_cols) {
        int n = utf8_length(*p);
        bool valid = true;
        for (int k = 1; k < n; k++)
            if ((p[k] & 0xc0) != 0x80) valid = false;
        if (!valid) n = 1;
        int col = x + written;
        if (col >= s->cols) break;
        if (col >= 0) {
            ui_cell* c = &s->cells[y * s->cols + col];
            if (n == 1 && (*p < 0x20 || *p == 0x7f || *p >= 0x80)) {
                c->text[0] = *p >= 0x80 ? '?' : (*p == '\n' || *p == '\t' ? ' ' : '?');
                c->text[1] = '\0';
            } else if (n > 1 && !s->utf8) {
                c->text[0] = '?';
                c->text[1] = '\0';
            } else {
                memcpy(c->text, p, (size_t)n);
                c->text[n] = '\0';
            }
            c->color = (unsigned char)color;
            c->attr = (unsigned char)attr;
        }
        p += n;
        written++;
    }
    return written;
}

int ui_printf(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* format, ...) {
    char line[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    return ui_put(s, x, y, max_cols, color, attr, line);
}

void ui_fill(ui_screen* s, ui_rect r, const char* glyph, ui_color color, int attr) {
    for (int y = r.y; y < r.y + r.h; y++)
        for (int x = r.x; x < r.x + r.w; x++) ui_put(s, x, y, 1, color, attr, glyph);
}

void ui_box(ui_screen* s, ui_rect r, const char* title, bool focused) {
    if (r.w < 2 || r.h < 2) return;
    const ui_glyphs* g = s->glyphs;
    int attr = focused ? UI_BOLD : UI_PLAIN;
    ui_color color = focused ? UI_TITLE : UI_DEFAULT;
    for (int x = r.x + 1; x < r.x + r.w - 1; x++) {
        ui_put(s, x, r.y, 1, color, attr, g->horizontal);
        ui_put(s, x, r.y + r.h - 1, 1, color, attr, g->horizontal);
    }
    for (int y = r.y + 1; y < r.y + r.h - 1; y++) {
        ui_put(s, r.x, y, 1, color, attr, g->vertical);
        ui_put(s, r.x + r.w - 1, y, 1, color, attr, g->vertical);
    }
    ui_put(s, r.x, r.y, 1, color, attr, g->top_left);
    ui_put(s, r.x + r.w - 1, r.y, 1, color, attr, g->top_right);
    ui_put(s, r.x, r.y + r.h - 1, 1, color, attr, g->bottom_left);
    ui_put(s, r.x + r.w - 1, r.y + r.h - 1, 1, color, attr, g->bottom_right);
    // The focused pane is told by '>' too, for monochrome terminals.
    if (title) ui_printf(s, r.x + 2, r.y, r.w - 4, color, attr | (focused ? UI_REVERSE : 0), "%s%s ", focused ? ">" : " ", title);
}

int ui_screen_dump(const ui_screen* s, FILE* out) {
    for (int y = 0; y < s->rows; y++) {
        int last = s->cols - 1;
        while (last >= 0 && strcmp(s->cells[y * s->cols + last].text, " ") == 0) last--;
        for (int x = 0; x <= last; x++) fputs(s->cells[y * s->cols + x].text, out);
        fputc('\n', out);
    }
    return ferror(out) ? -1 : 0;
}

void ui_screen_init_curses_colors(void) {
    start_color();
    use_default_colors();
    static const short FOREGROUND[UI_COLOR_COUNT] = {
        -1, COLOR_BLUE, COLOR_YELLOW, COLOR_MAGENTA, COLOR_CYAN, COLOR_GREEN, COLOR_WHITE,
        COLOR_RED, COLOR_CYAN, -1, COLOR_GREEN, COLOR_RED, COLOR_YELLOW,
    };
    for (int i = 1; i < UI_COLOR_COUNT; i++) init_pair((short)i, FOREGROUND[i], -1);
}

void ui_screen_flush_curses(const ui_screen* s) {
    for (int y = 0; y < s->rows && y < LINES; y++) {
        move(y, 0);
        for (int x = 0; x < s->cols && x < COLS; x++) {
            const ui_cell* c = &s->cells[y * s->cols + x];
            attr_t a = A_NORMAL;
            if (c->attr & UI_BOLD) a |= A_BOLD;
            if (c->attr & UI_REVERSE) a |= A_REVERSE;
            if (c->attr & UI_DIM) a |= A_DIM;
            if (s->color && c->color != UI_DEFAULT) a |= COLOR_PAIR(c->color);
            attrset(a);
            // The last cell of the last row would scroll the screen with addstr.
            if (y == LINES - 1 && x == COLS - 1) insstr(c->text);
            else addstr(c->text);
        }
    }
    attrset(A_NORMAL);
}
