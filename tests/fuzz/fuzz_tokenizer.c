// fuzz_tokenizer: the llama2.c tokenizer.bin loader (engine/tokenizer.c).
//
// The input is the whole file, as an in-memory file. tok_file_vocab_size
// counts its tokens; tok_load then loads it with that vocab size (or with
// the smallest allowed one when the count failed, for its error paths).
// A loaded tokenizer encodes a short fixed text (ASCII, multi-byte UTF-8,
// a piece-like "<0x41>", control bytes), decodes the ids back, and decodes
// every id once. Errors are expected; a crash, a leak or a sanitizer
// report is a bug.
//
// Seeds: nothing binary is committed. LLVMFuzzerInitialize writes them into
// the run's corpus folder when they are missing: the llama2.c layout (an
// int32 max token length, then per token an fp32 score, an int32 length and
// the bytes) with <unk>, BOS, EOS and the 256 byte pieces; the same with 18
// merges; an absurd max length; a NaN score; and a truncated copy.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/tokenizer.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static void put_token(fuzz_buffer* b, float score, const char* bytes, int32_t length) {
    fuzz_put(b, &score, sizeof score);
    fuzz_put(b, &length, sizeof length);
    fuzz_put(b, bytes, (size_t)length);
}

// <unk>, "\n<s>\n", "\n</s>\n" and <0x00>..<0xFF>, after max_token_length.
static fuzz_buffer byte_vocab(int32_t max_token_length) {
    fuzz_buffer b = {NULL, 0, 0};
    fuzz_put(&b, &max_token_length, sizeof max_token_length);
    put_token(&b, 0.0f, "<unk>", 5);
    put_token(&b, 0.0f, "\n<s>\n", 5);
    put_token(&b, 0.0f, "\n</s>\n", 6);
    for (int byte = 0; byte < 256; byte++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", byte);
        put_token(&b, 0.0f, piece, 6);
    }
    return b;
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    const char* folder = fuzz_seed_folder(*argc, *argv);
    if (!folder) return 0; // a reproducer run: no seeds needed
    fuzz_buffer bytes_only = byte_vocab(6);
    fuzz_write_seed(folder, "seed-bytes-only.bin", bytes_only.bytes, bytes_only.size);
    fuzz_write_seed(folder, "seed-truncated.bin", bytes_only.bytes, 1000);
    free(bytes_only.bytes);
    fuzz_buffer absurd = byte_vocab(100000);
    fuzz_write_seed(folder, "seed-bad-max-length.bin", absurd.bytes, absurd.size);
    free(absurd.bytes);
    fuzz_buffer nan_score = byte_vocab(6);
    put_token(&nan_score, NAN, "zz", 2);
    fuzz_write_seed(folder, "seed-nan-score.bin", nan_score.bytes, nan_score.size);
    free(nan_score.bytes);
    // Merges with falling scores, multi-byte UTF-8 among them, so encoding merges.
    static const char* const MERGES[] = {" ", "e", "t", "a", "o", "n", " t", "he", " the", "On", "ce", " a",
                                         "\xc3\xab", "\xe6\x97\xa5", " upon", "im", "ime", " time"};
    fuzz_buffer merges = byte_vocab(6);
    for (size_t i = 0; i < sizeof MERGES / sizeof MERGES[0]; i++)
        put_token(&merges, -1.0f - 0.5f * (float)i, MERGES[i], (int32_t)strlen(MERGES[i]));
    fuzz_write_seed(folder, "seed-bytes-and-merges.bin", merges.bytes, merges.size);
    free(merges.bytes);
    return 0;
}

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
