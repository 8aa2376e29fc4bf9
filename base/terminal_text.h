// terminal_text: text nobody here wrote, made safe to print on a terminal.
//
// A GGUF's metadata and vocabulary, and a server's answers, are data, not
// instructions to the terminal: ESC [ 2 J clears the screen, ESC ] 0 ; ... BEL
// sets the window title, and the C1 controls do the same in one character
// (U+009B is CSI, U+009D is OSC; a terminal may honour them as the UTF-8
// bytes C2 9B / C2 9D, or as the single raw bytes 0x9B / 0x9D). Each control
// becomes '?', so the reader still sees that something was there:
//   - C0 (0x00-0x1F), except '\n' and '\t' when the caller keeps them;
//   - DEL (0x7F);
//   - C1 written as UTF-8 (U+0080-U+009F);
//   - every byte that is not part of valid UTF-8 (raw 0x80-0x9F among
//     them), one '?' per invalid sequence.
// Valid printable UTF-8 passes unchanged. The output is never longer than
// the input, so text can be filtered in place.
#ifndef SERVELAB_TERMINAL_TEXT_H
#define SERVELAB_TERMINAL_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

// A UTF-8 character can arrive split across calls (a vocabulary spells some
// characters one byte per piece): its first bytes wait here.
typedef struct terminal_text {
    bool keep_line_breaks; // '\n' and '\t' pass (generated text); else they become '?' (one-line names)
    unsigned char pending[4];
    int n_pending;
} terminal_text;

// Filters text[0..length) into out, which must hold length + 4 bytes (the
// pending bytes of a character begun in an earlier call come out first).
// Returns the bytes written; out is not NUL-terminated.
size_t terminal_text_filter(terminal_text* state, const char* text, size_t length, char* out);

// What is still pending (an unfinished character, '?') into out (4 bytes);
// call once the text has ended. Returns the bytes written.
size_t terminal_text_finish(terminal_text* state, char* out);

// Filters a whole NUL-terminated string in place (line breaks become '?').
void terminal_text_clean(char* text);

// Filters text and writes it to stream, keeping a split character pending
// for the next call; terminal_text_flush writes what is left at the end.
void terminal_text_write(terminal_text* state, const char* text, FILE* stream);
void terminal_text_flush(terminal_text* state, FILE* stream);

#endif
