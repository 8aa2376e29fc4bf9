// servelab tokenize: the ids (and pieces) a model's tokenizer gives a text,
// for students comparing tokenizers and for tests.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf_vocab.h"
#include "engine/model_synth.h"
#include "engine/tokenizer.h"
#include "lab/common/cli_args.h"
#include "lab/cmd/cli.h"
#include "lab/cmd/commands.h"
#include "lab/common/model_source.h"

static const char TOKENIZE_USAGE[] =
    "usage: servelab tokenize [--model FILE|PRESET] [--tokenizer FILE] [--ids] [--no-bos] TEXT\n"
    "\n"
    "Prints one line per token: the id and its piece (bytes outside printable ASCII\n"
    "as \\xNN), as the model's tokenizer encodes TEXT. A GGUF file's own tokenizer\n"
    "is read from its metadata without loading the weights.\n"
    "  --ids      only the ids, on one line separated by spaces\n"
    "  --no-bos   no BOS first, even where the vocabulary asks for it (llama.cpp's\n"
    "             tokenizer tests encode this way)\n";

// A piece with quotes, its bytes escaped where they would not print plainly.
static void print_escaped(const char* piece) {
    putchar('\'');
    for (const unsigned char* p = (const unsigned char*)piece; *p; p++) {
        if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '\t') fputs("\\t", stdout);
        else if (*p == '\\' || *p == '\'') printf("\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) printf("\\x%02x", *p);
        else putchar(*p); // UTF-8 bytes as they are: a terminal shows the character
    }
    putchar('\'');
}

int command_tokenize(int argc, char** argv) {
    model_request request = {NULL, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
    bool only_ids = false, no_bos = false;
    const char* text = NULL;
    error_info err = {{0}};
    arg_cursor cursor = {argc, argv, 1, "servelab tokenize", NULL};
    for (; cursor.index < argc; cursor.index++) {
        bool failed = false;
        const char* word = argv[cursor.index];
        if (arg_is_help(word)) { // in order: `--model -h` names a model
            fputs(TOKENIZE_USAGE, stdout);
            return 0;
        } else if (model_option_match(&cursor, &request, &failed, &err)) {
        } else if (arg_match(&cursor, "--ids", false, &failed, &err)) {
            only_ids = true;
        } else if (arg_match(&cursor, "--no-bos", false, &failed, &err)) {
            no_bos = true;
        } else if (word[0] == '-' && word[1] != '\0' && !text) {
            arg_unknown(&cursor, &err);
            return cli_usage_error(&err);
        } else if (!text) {
            text = word;
        } else {
            fprintf(stderr, "servelab tokenize: one TEXT expected, found a second: '%s' (quote the text)\n", word);
            return 2;
        }
        if (failed) {
            fprintf(stderr, "servelab tokenize: %s\n", err.message);
            return 2;
        }
    }
    if (!text) {
        fprintf(stderr, "servelab tokenize: no TEXT given (see servelab tokenize --help)\n");
        return 2;
    }
    tokenizer* tok = NULL;
    model_source source;
    memset(&source, 0, sizeof source);
    bool have_source = false;
    if (request.model_arg && !request.tokenizer_arg && model_source_is_gguf(request.model_arg)) {
        if (tok_load_gguf(&tok, request.model_arg, &err)) {
            fprintf(stderr, "servelab tokenize: %s\n", err.message);
            return 1;
        }
    } else {
        if (model_source_open(&source, &request, &err)) {
            fprintf(stderr, "servelab tokenize: %s\n", err.message);
            return 1;
        }
        have_source = true;
        tok = source.tokenizer;
        if (!tok) {
            fprintf(stderr, "servelab tokenize: %s has no tokenizer (give --tokenizer FILE)\n", source.model_label);
            model_source_close(&source);
            return 1;
        }
    }
    int n = 0;
    tok_encode(tok, text, !no_bos && tok_adds_bos(tok), false, NULL, 0, &n, NULL); // counts
    int32_t* ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    int status = ids && tok_encode(tok, text, !no_bos && tok_adds_bos(tok), false, ids, n, &n, &err) == 0 ? 0 : 1;
    if (status) fprintf(stderr, "servelab tokenize: %s\n", ids ? err.message : "out of memory");
    for (int i = 0; status == 0 && i < n; i++) {
        if (only_ids) {
            printf(i ? " %d" : "%d", (int)ids[i]);
        } else {
            printf("%6d  ", (int)ids[i]);
            print_escaped(tok_piece(tok, ids[i]));
            putchar('\n');
        }
    }
    if (status == 0 && only_ids) putchar('\n');
    free(ids);
    if (have_source) model_source_close(&source);
    else tok_free(tok);
    return status;
}
