#include "base/terminal_text.h"

#include <string.h>

// Bytes in the UTF-8 character that `lead` starts; 0 for a byte that starts
// none (a continuation byte, C0/C1 = overlong, F5-FF = beyond U+10FFFF).
static int sequence_length(unsigned char lead) {
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

// Whether `byte` may come next after the pending bytes (RFC 3629's table:
// no overlong forms, no surrogates, nothing above U+10FFFF).
static bool continues(const unsigned char* pending, int n_pending, unsigned char byte) {
    if (byte < 0x80 || byte > 0xBF) return false;
    if (n_pending == 1) {
        switch (pending[0]) {
        case 0xE0: return byte >= 0xA0;
        case 0xED: return byte <= 0x9F;
        case 0xF0: return byte >= 0x90;
        case 0xF4: return byte <= 0x8F;
        default: break;
        }
    }
    return true;
}

size_t terminal_text_filter(terminal_text* state, const char* text, size_t length, char* out) {
    size_t n = 0;
    for (size_t i = 0; i < length; i++) {
        const unsigned char byte = (unsigned char)text[i];
        if (state->n_pending > 0) {
            if (continues(state->pending, state->n_pending, byte)) {
                state->pending[state->n_pending++] = byte;
                if (state->n_pending == sequence_length(state->pending[0])) {
                    // U+0080-U+009F (C1) are C2 80 - C2 9F.
                    if (state->pending[0] == 0xC2 && state->pending[1] <= 0x9F) {
                        out[n++] = '?';
                    } else {
                        memcpy(out + n, state->pending, (size_t)state->n_pending);
                        n += (size_t)state->n_pending;
                    }
                    state->n_pending = 0;
                }
                continue;
            }
            out[n++] = '?'; // a character cut short; this byte is read afresh below
            state->n_pending = 0;
        }
        if (byte < 0x80) {
            const bool kept_break = state->keep_line_breaks && (byte == '\n' || byte == '\t');
            out[n++] = (byte >= 0x20 && byte != 0x7F) || kept_break ? (char)byte : '?';
        } else if (sequence_length(byte) > 0) {
            state->pending[0] = byte;
            state->n_pending = 1;
        } else {
            out[n++] = '?';
        }
    }
    return n;
}

size_t terminal_text_finish(terminal_text* state, char* out) {
    if (state->n_pending == 0) return 0;
    state->n_pending = 0;
    out[0] = '?';
    return 1;
}

void terminal_text_clean(char* text) {
    terminal_text state = {0};
    size_t n = terminal_text_filter(&state, text, strlen(text), text);
    n += terminal_text_finish(&state, text + n);
    text[n] = '\0';
}

void terminal_text_write(terminal_text* state, const char* text, FILE* stream) {
    char out[256 + 4];
    for (size_t length = strlen(text); length > 0;) {
        size_t chunk = length < 256 ? length : 256;
        fwrite(out, 1, terminal_text_filter(state, text, chunk, out), stream);
        text += chunk;
        length -= chunk;
    }
}

void terminal_text_flush(terminal_text* state, FILE* stream) {
    char out[4];
    fwrite(out, 1, terminal_text_finish(state, out), stream);
}
