// fuzz_tokenizer: the llama2.c tokenizer.bin loader (engine/tokenizer.c).
//
// The input is the whole file, as an in-memory file. tok_file_vocab_size
// counts its tokens; tok_load then loads it with that vocab size (or with
// the smallest allowed one when the count failed, for its error paths).
// A loaded tokenizer encodes a short fixed text (ASCII, multi-byte UTF-8,
// a piece-like "<0x41>", control bytes), decodes the ids back, and decodes
// every id once. Errors are expected; a crash, a leak or a sanitizer
// report is a bug.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/tokenizer.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static const char TEXT[] = "Once upon a time, Zoë saw 日本 <0x41> \t\x01\xff!";

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[64];
    int fd = fuzz_memory_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    error_info err = {{0}};
    int vocab_size = 0;
    if (tok_file_vocab_size(path, &vocab_size, &err) != 0) vocab_size = TOK_MIN_VOCAB_SIZE;
    tokenizer* tok = NULL;
    if (tok_load(&tok, path, vocab_size, &err) == 0) {
        FUZZ_CHECK(tok_vocab_size(tok) == vocab_size);
        int needed = 0;
        // Too small first (it must fail and say how many), then exactly right.
        FUZZ_CHECK(tok_encode(tok, TEXT, true, true, NULL, 0, &needed, &err) != 0 && needed >= 2);
        int32_t* ids = malloc((size_t)needed * sizeof *ids);
        int n = 0;
        if (ids && tok_encode(tok, TEXT, true, true, ids, needed, &n, &err) == 0) {
            // EOS comes after the merges; BOS does not always stay first: as
            // in llama2.c, merging runs over BOS too, and a vocab may hold
            // its piece joined with the next one.
            FUZZ_CHECK(n == needed && ids[n - 1] == TOK_EOS_ID);
            for (int i = 0; i < n; i++)
                FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab_size);
            char text[512];
            size_t length = tok_decode_text(tok, TOK_BOS_ID, ids + 1, n - 2, text, sizeof text);
            FUZZ_CHECK(strlen(text) == (length < sizeof text ? length : sizeof text - 1));
            tok_decode_text(tok, TOK_BOS_ID, ids, n, text, 1); // cut to nothing
        }
        free(ids);
        for (int32_t id = -1; id <= vocab_size; id++) {
            const char* piece = tok_decode_piece(tok, id == 0 ? TOK_BOS_ID : id - 1, id);
            FUZZ_CHECK(piece != NULL);
            (void)tok_piece_is_printable(piece);
        }
        tok_free(tok);
    } else {
        FUZZ_CHECK(tok == NULL && err.message[0] != '\0'); // *out is NULL on failure, and it says why
    }
    close(fd);
    return 0;
}
