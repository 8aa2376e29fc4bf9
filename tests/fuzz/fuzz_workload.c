// fuzz_workload: the `sim --workload` JSON Lines reader (lab/bench/workload.c,
// Jansson underneath).
//
// The input is the file's text, read with the byte-level tokenizer (vocab
// 259) for a model of 64 positions. A workload that loads must keep the
// reader's promises: every prompt starts with BOS, its ids are tokens, it
// and its output fit the model, arrivals are sorted. Errors are expected
// (and must say why); a crash, a leak, a broken promise or a sanitizer
// report is a bug.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/tokenizer.h"
#include "lab/bench/workload.h"
#include "tests/fuzz/support.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

enum { VOCAB = TOK_MIN_VOCAB_SIZE, MAX_SEQ_LEN = 64 };

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0; // fmemopen needs a byte; the empty file is a unit test
    tokenizer* tok = NULL;
    error_info err = {{0}};
    FUZZ_CHECK(tok_byte_level(&tok, &err) == 0);
    FILE* file = fmemopen((void*)data, size, "r");
    FUZZ_CHECK(file != NULL);
    workload w;
    if (workload_read_stream(&w, file, "fuzz.jsonl", tok, VOCAB, MAX_SEQ_LEN, &err) == 0) {
        FUZZ_CHECK(w.n_requests >= 1);
        for (int r = 0; r < w.n_requests; r++) {
            const workload_request* q = &w.requests[r];
            FUZZ_CHECK(q->n_prompt >= 1 && q->prompt[0] == TOK_BOS_ID && q->max_tokens >= 1 &&
                       q->n_prompt + q->max_tokens <= MAX_SEQ_LEN && q->arrival_time >= 0);
            for (int t = 0; t < q->n_prompt; t++)
                FUZZ_CHECK(q->prompt[t] >= 0 && q->prompt[t] < VOCAB);
            FUZZ_CHECK(r == 0 || q->arrival_time >= w.requests[r - 1].arrival_time);
        }
        workload_free(&w);
    } else {
        FUZZ_CHECK(err.message[0] != '\0' && w.requests == NULL && w.n_requests == 0);
    }
    fclose(file);
    tok_free(tok);
    return 0;
}
