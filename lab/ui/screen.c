#include "lab/ui/screen.h"

#include <curses.h>
#include <math.h>
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
    ui_clip_reset(s);
    ui_screen_clear(s);
    return 0;
}

void ui_screen_clear(ui_screen* s) {
    ui_clip_reset(s);
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

void ui_screen_set_cut_hook(ui_screen* s, ui_cut_hook hook, void* user) {
    s->cut_hook = hook;
    s->cut_hook_user = user;
}

void ui_clip(ui_screen* s, ui_rect r) {
    int x0 = r.x < 0 ? 0 : r.x, y0 = r.y < 0 ? 0 : r.y;
    int x1 = r.x + r.w > s->cols ? s->cols : r.x + r.w, y1 = r.y + r.h > s->rows ? s->rows : r.y + r.h;
    s->clip = (ui_rect){x0, y0, x1 > x0 ? x1 - x0 : 0, y1 > y0 ? y1 - y0 : 0};
}

void ui_clip_reset(ui_screen* s) { s->clip = (ui_rect){0, 0, s->cols, s->rows}; }

int ui_text_columns(const char* text) {
    int columns = 0;
    for (const unsigned char* c = (const unsigned char*)text; *c; c++) columns += (*c & 0xc0) != 0x80;
    return columns;
}

int ui_put(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const char* text) {
    if (!text) return 0;
    bool row_shown = y >= s->clip.y && y < s->clip.y + s->clip.h;
    int right = s->clip.x + s->clip.w; // the first column past the clip
    int written = 0, shown = 0;
    const unsigned char* p = (const unsigned char*)text;
    while (*p && written < max_cols && row_shown) {
        int n = utf8_length(*p);
        bool valid = true;
        for (int k = 1; k < n; k++)
            if ((p[k] & 0xc0) != 0x80) valid = false;
        if (!valid) n = 1;
        int col = x + written;
        if (col >= right) break;
        if (col >= s->clip.x) {
            ui_cell* c = &s->cells[y * s->cols + col];
            if (n == 1 && (*p < 0x20 || *p == 0x7f || *p >= 0x80)) {
                c->text[0] = *p >= 0x80 ? '?' : (*p == '\n' || *p == '\t' ? ' ' : '?');
                c->text[1] = '\0';
            } else if (n > 1 && !s->utf8) {
                // The micro sign of "81 µs" reads as u in ASCII; anything else as ?.
                c->text[0] = n == 2 && p[0] == 0xc2 && p[1] == 0xb5 ? 'u' : '?';
                c->text[1] = '\0';
            } else {
                memcpy(c->text, p, (size_t)n);
                c->text[n] = '\0';
            }
            c->color = (unsigned char)color;
            c->attr = (unsigned char)attr;
            shown++;
        }
        p += n;
        written++;
    }
    if (s->cut_hook && *p) s->cut_hook(s->cut_hook_user, text, x, y, shown, ui_text_columns(text));
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

// ---- numbers that fit -------------------------------------------------------------------

static int fit_copy(char* out, size_t size, const char* text, int max_cols) {
    int columns = ui_text_columns(text);
    if (columns > max_cols || strlen(text) + 1 > size) return -1;
    memcpy(out, text, strlen(text) + 1);
    return columns;
}

int ui_format_number(char* out, size_t size, double value, int digits, int max_cols) {
    char text[64];
    if (size) out[0] = '\0';
    if (isfinite(value) && value == floor(value) && fabs(value) < 1e15) {
        snprintf(text, sizeof text, "%.0f", value == 0 ? 0.0 : value); // no "-0"
        return fit_copy(out, size, text, max_cols);
    }
    for (int p = digits < 1 ? 1 : digits; p >= 1; p--) {
        snprintf(text, sizeof text, "%.*g", p, value);
        if (fit_copy(out, size, text, max_cols) >= 0) return ui_text_columns(out);
    }
    return -1;
}

// A mantissa in [1, 1000) with up to `digits` significant digits (trailing
// zeros dropped); false when rounding reached 1000 (the caller takes the
// next prefix).
static bool mantissa(char* out, size_t size, double scaled, int digits) {
    double magnitude = fabs(scaled);
    int integer_digits = magnitude >= 100 ? 3 : magnitude >= 10 ? 2 : 1;
    int decimals = digits - integer_digits > 0 ? digits - integer_digits : 0;
    snprintf(out, size, "%.*f", decimals, scaled);
    if (strchr(out, '.')) {
        char* end = out + strlen(out) - 1;
        while (*end == '0') *end-- = '\0';
        if (*end == '.') *end = '\0';
    }
    const char* d = out[0] == '-' ? out + 1 : out;
    return strcspn(d, ".") <= 3;
}

int ui_format_si(char* out, size_t size, double value, const char* unit, int digits, int max_cols) {
    static const char* const PREFIXES[] = {"p", "n", "\u00b5", "m", "", "k", "M", "G", "T", "P", "E"};
    enum { SMALLEST = -12, COUNT = 11 };
    char text[96], number[48];
    if (size) out[0] = '\0';
    if (!isfinite(value)) {
        snprintf(text, sizeof text, "%g %s", value, unit);
        return fit_copy(out, size, text, max_cols);
    }
    int index = 4; // no prefix
    if (value != 0) {
        int exponent = (int)floor(log10(fabs(value)) / 3.0) * 3;
        index = (exponent - SMALLEST) / 3;
        if (index < 0) index = 0;
        if (index >= COUNT) index = COUNT - 1;
    }
    for (int p = digits < 1 ? 1 : digits; p >= 1; p--) {
        int at = index;
        double scaled = value / pow(10.0, SMALLEST + 3 * at);
        if (!mantissa(number, sizeof number, scaled, p) && at + 1 < COUNT) {
            at++;
            mantissa(number, sizeof number, value / pow(10.0, SMALLEST + 3 * at), p);
        }
        const char* prefix = value == 0 ? "" : PREFIXES[at];
        if (prefix[0] || unit[0]) snprintf(text, sizeof text, "%s %s%s", number, prefix, unit);
        else snprintf(text, sizeof text, "%s", number);
        if (fit_copy(out, size, text, max_cols) >= 0) return ui_text_columns(out);
    }
    return -1;
}

int ui_format_bytes(char* out, size_t size, double bytes, int max_cols) {
    static const char* const UNITS[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    char text[64];
    if (size) out[0] = '\0';
    int u = 0;
    while (fabs(bytes) >= 1024 && u < 5) {
        bytes /= 1024;
        u++;
    }
    // One decimal where the unit is scaled, none where it does not fit;
    // 1023.96 KiB rounds to "1024 KiB", still true.
    for (int decimals = u ? 1 : 0; decimals >= 0; decimals--) {
        snprintf(text, sizeof text, "%.*f %s", decimals, bytes, UNITS[u]);
        if (fit_copy(out, size, text, max_cols) >= 0) return ui_text_columns(out);
    }
    return -1;
}

// ---- lines that fit ---------------------------------------------------------------------

void ui_line_init(ui_line* l) { memset(l, 0, sizeof *l); }

// Adds a form to the last field unless it repeats the one before.
static void add_form(ui_line* l, const char* text) {
    int f = l->n - 1, k = l->n_forms[f];
    if (k == UI_LINE_FORMS || (k > 0 && strcmp(l->forms[f][k - 1], text) == 0)) return;
    snprintf(l->forms[f][k], UI_LINE_FORM_BYTES, "%s", text);
    l->n_forms[f]++;
}

static bool new_field(ui_line* l, int priority) {
    if (l->n == UI_LINE_FIELDS) return false;
    l->priority[l->n] = priority;
    l->n_forms[l->n] = 0;
    l->n++;
    return true;
}

void ui_line_text(ui_line* l, int priority, const char* form, ...) {
    if (!new_field(l, priority)) return;
    va_list forms;
    va_start(forms, form);
    for (const char* f = form; f; f = va_arg(forms, const char*)) add_form(l, f);
    va_end(forms);
}

void ui_line_number(ui_line* l, int priority, bool droppable, const char* before, double value, int digits,
                    const char* after) {
    if (!new_field(l, priority)) return;
    char number[64], text[UI_LINE_FORM_BYTES];
    for (int p = digits; p >= 1 && l->n_forms[l->n - 1] < UI_LINE_FORMS - (droppable ? 1 : 0); p--) {
        ui_format_number(number, sizeof number, value, p, 63);
        snprintf(text, sizeof text, "%s%s%s", before, number, after);
        add_form(l, text);
    }
    if (droppable) add_form(l, "");
}

void ui_line_si(ui_line* l, int priority, bool droppable, const char* before, double value, const char* unit,
                const char* after) {
    if (!new_field(l, priority)) return;
    char number[64], text[UI_LINE_FORM_BYTES];
    for (int p = 3; p >= 1; p--) {
        ui_format_si(number, sizeof number, value, unit, p, 63);
        snprintf(text, sizeof text, "%s%s%s", before, number, after);
        add_form(l, text);
    }
    if (droppable) add_form(l, "");
}

int ui_line_fit(const ui_line* l, int max_cols, char* out, size_t size) {
    int chosen[UI_LINE_FIELDS] = {0}, total = 0;
    for (int f = 0; f < l->n; f++) total += l->n_forms[f] ? ui_text_columns(l->forms[f][0]) : 0;
    while (total > max_cols) {
        int pick = -1;
        for (int f = 0; f < l->n; f++)
            if (chosen[f] + 1 < l->n_forms[f] && (pick < 0 || l->priority[f] <= l->priority[pick])) pick = f;
        if (pick < 0) break;
        total -= ui_text_columns(l->forms[pick][chosen[pick]]);
        chosen[pick]++;
        total += ui_text_columns(l->forms[pick][chosen[pick]]);
    }
    size_t used = 0;
    int columns = 0;
    if (size) out[0] = '\0';
    for (int f = 0; f < l->n; f++) {
        if (!l->n_forms[f]) continue;
        const char* text = l->forms[f][chosen[f]];
        int w = ui_text_columns(text);
        size_t bytes = strlen(text);
        if (columns + w > max_cols || used + bytes + 1 > size) break; // never a field in part
        memcpy(out + used, text, bytes + 1);
        used += bytes;
        columns += w;
    }
    return columns;
}

int ui_line_put(ui_screen* s, int x, int y, int max_cols, ui_color color, int attr, const ui_line* l) {
    char text[UI_LINE_FIELDS * UI_LINE_FORM_BYTES];
    ui_line_fit(l, max_cols, text, sizeof text);
    return ui_put(s, x, y, max_cols, color, attr, text);
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
