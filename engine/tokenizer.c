// tokenizer: llama2.c's BPE tokenizer (tokenizer.bin) and a byte-level one.
//
// The BPE side follows llama2.c run.c (encode, decode, safe_printf) step for
// step, so that a prompt gives the same ids here as there; where this file
// differs it is to refuse bad input instead of crashing, and each such place
// says so.
#include "engine/tokenizer.h"

#include "engine/gguf_unicode.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// The tokenizer

// One entry of the piece index: pieces sorted by strcmp (ties by id), so a
// piece is found by binary search, as llama2.c's str_lookup does.
typedef struct {
    const char* piece;  // NUL-terminated, points into tokenizer.piece_bytes
    int32_t id;
} piece_entry;

struct tokenizer {
    int vocab_size;            // tokens
    int max_token_length;      // bytes, the longest piece allowed by the file
    int max_text_per_id;       // bytes of text one id can stand for at most; 0: no bound known
    bool byte_level;           // true: one id per byte, no merges (tok_byte_level)
    char** pieces;             // (vocab_size) piece of each id, NUL-terminated
    float* scores;             // (vocab_size) merge score of each id; higher merges first
    char* piece_bytes;         // (sum of piece lengths + vocab_size) bytes: every piece and its NUL
    piece_entry* sorted;       // (vocab_size) the pieces in strcmp order; NULL when byte_level
    char byte_pieces[256][2];  // (256, 2) bytes: byte b then NUL, what "<0xXX>" decodes to
    int32_t byte_ids[256];     // (256) id of byte b's fallback piece "<0xXX>"; -1: none (unk_id is used)
    int32_t bos_id;            // begin-of-sequence id (1 in llama2.c files)
    int32_t eos_id;            // end-of-sequence id (2)
    int32_t unk_id;            // unknown id (0); -1: none
    bool add_bos;              // the vocabulary asks for BOS before a prompt
    bool add_space_prefix;     // SentencePiece's add_dummy_prefix: text starts as if after a space
    // Byte-level BPE (GPT-2's kind) only; NULL / 0 otherwise.
    struct bpe_merge* merges;  // (merge_capacity) open-addressing table: (left, right) -> rank, merged id
    size_t merge_capacity;     // a power of two, at least twice the merges
    char* decoded_bytes;       // every piece with its byte-to-character mapping undone, each NUL-ended
    char** decoded;            // (vocab_size) into decoded_bytes: the text each id stands for
    int32_t* special_ids;      // (n_special) CONTROL and USER_DEFINED tokens, what tok_encode_special matches
    int n_special;
    tok_pretokenizer pretokenizer; // byte-level BPE: how text is split before merging
};

// One merge rule of a byte-level BPE vocabulary: pieces `left` and `right`
// (by id) join into `merged`; a lower rank merges first.
typedef struct bpe_merge {
    int32_t left, right; // -1 left: an empty slot
    int32_t merged;
    int32_t rank;
} bpe_merge;

static size_t merge_slot(size_t capacity, int32_t left, int32_t right);
static const bpe_merge* find_merge(const tokenizer* t, int32_t left, int32_t right);

static int byte_piece_value(const char* piece);

// A score a merge must beat to happen at all: llama2.c starts its search
// from -1e10, so a pair whose piece scores lower is never merged.
static const float NO_MERGE_SCORE = -1e10f;

// Allocates a tokenizer with room for vocab_size pieces of piece_bytes_total
// bytes (NULs included); the arrays are zeroed.
static tokenizer* tokenizer_new(int vocab_size, size_t piece_bytes_total) {
    tokenizer* t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->vocab_size = vocab_size;
    t->pieces = calloc((size_t)vocab_size, sizeof *t->pieces);
    t->scores = calloc((size_t)vocab_size, sizeof *t->scores);
    t->piece_bytes = calloc(piece_bytes_total, 1);
    if (!t->pieces || !t->scores || !t->piece_bytes) {
        tok_free(t);
        return NULL;
    }
    for (int b = 0; b < 256; b++) {
        t->byte_pieces[b][0] = (char)b;  // [1] is already NUL
        t->byte_ids[b] = b + TOK_BYTE_OFFSET;
    }
    t->bos_id = TOK_BOS_ID;
    t->eos_id = TOK_EOS_ID;
    t->unk_id = TOK_UNK_ID;
    t->add_bos = true;
    t->add_space_prefix = true;
    return t;
}

void tok_free(tokenizer* t) {
    if (!t) return;
    free(t->pieces);
    free(t->scores);
    free(t->piece_bytes);
    free(t->sorted);
    free(t->merges);
    free(t->decoded_bytes);
    free(t->decoded);
    free(t->special_ids);
    free(t);
}

int tok_vocab_size(const tokenizer* t) { return t ? t->vocab_size : 0; }

bool tok_is_byte_level(const tokenizer* t) { return t && t->byte_level; }

int32_t tok_bos_id(const tokenizer* t) { return t ? t->bos_id : TOK_BOS_ID; }

int32_t tok_eos_id(const tokenizer* t) { return t ? t->eos_id : TOK_EOS_ID; }

bool tok_adds_bos(const tokenizer* t) { return t ? t->add_bos : true; }

const char* tok_kind(const tokenizer* t) {
    if (!t) return "none";
    return t->byte_level ? "byte-level (one id per byte)" : t->merges ? "byte-level BPE (GPT-2)" : "SentencePiece";
}

const char* tok_piece(const tokenizer* t, int32_t id) {
    if (!t || id < 0 || id >= t->vocab_size) return "";
    return t->pieces[id];
}

// ----------------------------------------------------------------------------
// The piece index

static int compare_entries(const void* a, const void* b) {
    const piece_entry* left = a;
    const piece_entry* right = b;
    int order = strcmp(left->piece, right->piece);
    if (order != 0) return order;
    return (left->id > right->id) - (left->id < right->id);
}

static int build_index(tokenizer* t) {
    t->sorted = malloc((size_t)t->vocab_size * sizeof *t->sorted);
    if (!t->sorted) return -1;
    for (int id = 0; id < t->vocab_size; id++) t->sorted[id] = (piece_entry){t->pieces[id], id};
    qsort(t->sorted, (size_t)t->vocab_size, sizeof *t->sorted, compare_entries);
    return 0;
}

// The id of `piece`, or -1 when the vocab has no such piece. When a file
// repeats a piece this returns its lowest id (llama2.c's bsearch returns
// whichever copy it lands on; real files have no repeats).
static int32_t lookup_piece(const tokenizer* t, const char* piece) {
    int low = 0, high = t->vocab_size;  // first entry >= piece lies in [low, high]
    while (low < high) {
        int middle = low + (high - low) / 2;
        if (strcmp(t->sorted[middle].piece, piece) < 0)
            low = middle + 1;
        else
            high = middle;
    }
    if (low < t->vocab_size && strcmp(t->sorted[low].piece, piece) == 0) return t->sorted[low].id;
    return -1;
}

// The id of the piece left+right, or -1. `joined` has room for two pieces
// and a NUL (2 * max_token_length + 1 bytes at least).
static int32_t lookup_pair(const tokenizer* t, int32_t left, int32_t right, char* joined) {
    size_t left_length = strlen(t->pieces[left]);
    size_t right_length = strlen(t->pieces[right]);
    memcpy(joined, t->pieces[left], left_length);
    memcpy(joined + left_length, t->pieces[right], right_length + 1);
    return lookup_piece(t, joined);
}

// ----------------------------------------------------------------------------
// Loading tokenizer.bin

// A cursor over the file's bytes; reads are little-endian whatever the host.
typedef struct {
    const unsigned char* bytes;  // (size) the whole file
    size_t size;                 // bytes
    size_t offset;               // bytes read so far
} byte_reader;

static bool read_u32(byte_reader* reader, uint32_t* value) {
    if (reader->size - reader->offset < 4) return false;
    const unsigned char* p = reader->bytes + reader->offset;
    *value = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    reader->offset += 4;
    return true;
}

static bool read_i32(byte_reader* reader, int32_t* value) {
    uint32_t bits;
    if (!read_u32(reader, &bits)) return false;
    memcpy(value, &bits, sizeof *value);
    return true;
}

static bool read_f32(byte_reader* reader, float* value) {
    uint32_t bits;
    if (!read_u32(reader, &bits)) return false;
    memcpy(value, &bits, sizeof *value);
    return true;
}

// The largest file tok_file_vocab_size reads (bytes), when no vocab_size
// bounds it: Llama 2's 32000-token tokenizer.bin is 434 KB, so 256 MiB is
// far above any real file yet keeps a wrong path from taking all memory
// (and, at 9 bytes or more a token, the count far below INT_MAX).
#define TOK_MAX_FILE_BYTES ((uint64_t)256 << 20)

// Reads the whole file into a malloc'ed buffer. Files larger than
// max_file_bytes are refused before reading anything.
static int read_file(const char* path, uint64_t max_file_bytes, unsigned char** out_bytes,
                     size_t* out_size, error_info* err) {
    FILE* file = fopen(path, "rb");
    if (!file) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fileno(file), &info) != 0 || !S_ISREG(info.st_mode)) {
        fclose(file);
        return error_set(err, "%s: not a regular file", path);
    }
    if ((uint64_t)info.st_size > max_file_bytes) {
        fclose(file);
        return error_set(err, "%s: file is %lld bytes, too large for this tokenizer (limit %llu)",
                         path, (long long)info.st_size, (unsigned long long)max_file_bytes);
    }
    size_t size = (size_t)info.st_size;
    unsigned char* bytes = malloc(size > 0 ? size : 1);
    if (!bytes) {
        fclose(file);
        return error_set(err, "%s: out of memory reading %zu bytes", path, size);
    }
    size_t got = fread(bytes, 1, size, file);
    fclose(file);
    if (got != size) {
        free(bytes);
        return error_set(err, "%s: read failed after %zu of %zu bytes", path, got, size);
    }
    *out_bytes = bytes;
    *out_size = size;
    return 0;
}

// What check_file learns about a good file.
typedef struct {
    int n_tokens;              // tokens in the file
    int max_token_length;      // bytes, from the header
    size_t piece_bytes_total;  // bytes all pieces need, with a NUL each
} file_summary;

// Checks every field of the file without building anything, so that a bad
// file is refused with the first problem found and no allocation is sized
// by fields not yet known to be good. Expects exactly vocab_size tokens, or
// as many as the file holds when vocab_size is negative.
static int check_file(const char* path, const unsigned char* bytes, size_t size, int vocab_size,
                      file_summary* summary, error_info* err) {
    byte_reader reader = {bytes, size, 0};
    int32_t max_length;
    if (!read_i32(&reader, &max_length))
        return error_set(err, "%s: truncated: max_token_length missing (file is %zu bytes, need 4)",
                         path, size);
    if (max_length < 1 || max_length > TOK_MAX_TOKEN_LENGTH_LIMIT)
        return error_set(err, "%s: max_token_length is %d, expected 1..%d", path, (int)max_length,
                         TOK_MAX_TOKEN_LENGTH_LIMIT);
    size_t total = 0;
    int id = 0;
    for (; vocab_size < 0 ? reader.offset < size : id < vocab_size; id++) {
        float score;
        int32_t length;
        if (reader.offset == size)  // ends cleanly between tokens: a smaller vocab
            return error_set(err,
                             "%s: truncated: token %d missing, the file holds %d tokens but "
                             "vocab_size is %d",
                             path, id, id, vocab_size);
        if (!read_f32(&reader, &score))
            return error_set(err,
                             "%s: truncated: token %d score missing at offset %zu (file is %zu "
                             "bytes)",
                             path, id, reader.offset, size);
        if (isnan(score)) return error_set(err, "%s: token %d score is NaN", path, id);
        if (!read_i32(&reader, &length))
            return error_set(err,
                             "%s: truncated: token %d length field missing at offset %zu (file "
                             "is %zu bytes)",
                             path, id, reader.offset, size);
        // llama2.c does not check lengths; no real file has an empty piece
        // (tok512 has none), and an empty piece could never be looked up.
        if (length < 1 || length > max_length)
            return error_set(err, "%s: token %d length is %d, expected 1..%d (max_token_length)",
                             path, id, (int)length, (int)max_length);
        if (size - reader.offset < (size_t)length)
            return error_set(err,
                             "%s: truncated: token %d needs %d piece bytes at offset %zu, file is "
                             "%zu bytes",
                             path, id, (int)length, reader.offset, size);
        reader.offset += (size_t)length;
        total += (size_t)length + 1;
    }
    if (reader.offset != size)
        return error_set(err,
                         "%s: %zu trailing bytes after token %d, the last of vocab_size %d (file "
                         "is %zu bytes; is vocab_size right?)",
                         path, size - reader.offset, vocab_size - 1, vocab_size, size);
    summary->n_tokens = id;
    summary->max_token_length = (int)max_length;
    summary->piece_bytes_total = total;
    return 0;
}

// The most bytes of text one id can stand for, which bounds from below how
// many ids a text becomes (tok_encode's length check); 0 when there is no
// such bound. Every id's piece is at least as long as the text it stands
// for: a codepoint's piece is that text, a byte fallback's piece ("<0x41>")
// stands for one byte, and a merge's piece is its two pieces joined. So the
// longest piece bounds them all. The one exception is a fallback piece that
// is empty as a C string (a piece starting with a NUL byte, in no real
// file): "a" joined to it is "a" again, now standing for two bytes.
static int find_max_text_per_id(const tokenizer* t) {
    for (int byte = 1; byte < 256; byte++)  // byte 0 ends the text, it is never encoded
        if (t->byte_ids[byte] >= 0 && t->pieces[t->byte_ids[byte]][0] == '\0') return 0;
    int longest = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        int length = (int)strlen(t->pieces[id]);
        if (length > longest) longest = length;
    }
    return longest;
}

int tok_file_vocab_size(const char* path, int* vocab_size, error_info* err) {
    if (!vocab_size) return error_set(err, "tok_file_vocab_size: vocab_size is NULL");
    *vocab_size = 0;
    if (!path) return error_set(err, "tok_file_vocab_size: path is NULL");
    unsigned char* bytes = NULL;
    size_t size = 0;
    if (read_file(path, TOK_MAX_FILE_BYTES, &bytes, &size, err) != 0) return -1;
    file_summary summary;
    int status = check_file(path, bytes, size, -1, &summary, err);
    free(bytes);
    if (status != 0) return -1;
    *vocab_size = summary.n_tokens;
    return 0;
}

int tok_load(tokenizer** out, const char* path, int vocab_size, error_info* err) {
    if (!out) return error_set(err, "tok_load: out is NULL");
    *out = NULL;
    if (!path) return error_set(err, "tok_load: path is NULL");
    if (vocab_size < TOK_MIN_VOCAB_SIZE)
        return error_set(err,
                         "%s: vocab_size is %d, expected at least %d (3 special tokens + 256 byte "
                         "fallbacks)",
                         path, vocab_size, TOK_MIN_VOCAB_SIZE);

    // Each token takes at most 4 (score) + 4 (length) + the longest piece.
    uint64_t max_file_bytes = 4 + (uint64_t)vocab_size * (8 + TOK_MAX_TOKEN_LENGTH_LIMIT);
    if (max_file_bytes > TOK_MAX_FILE_BYTES) max_file_bytes = TOK_MAX_FILE_BYTES;
    unsigned char* bytes = NULL;
    size_t size = 0;
    if (read_file(path, max_file_bytes, &bytes, &size, err) != 0) return -1;

    file_summary summary;
    if (check_file(path, bytes, size, vocab_size, &summary, err) != 0) {
        free(bytes);
        return -1;
    }

    // The file is known good: copy it out without further checks.
    tokenizer* t = tokenizer_new(vocab_size, summary.piece_bytes_total);
    if (!t) {
        free(bytes);
        return error_set(err, "%s: out of memory for %d tokens", path, vocab_size);
    }
    t->max_token_length = summary.max_token_length;
    byte_reader reader = {bytes, size, 4};
    char* next_piece = t->piece_bytes;
    for (int id = 0; id < vocab_size; id++) {
        int32_t length;
        read_f32(&reader, &t->scores[id]);
        read_i32(&reader, &length);
        // Pieces are C strings from here on, as in llama2.c: a piece with a
        // NUL byte inside (no real file has one) ends at that byte.
        memcpy(next_piece, bytes + reader.offset, (size_t)length);
        next_piece[length] = '\0';
        t->pieces[id] = next_piece;
        next_piece += length + 1;
        reader.offset += (size_t)length;
    }
    free(bytes);
    t->max_text_per_id = find_max_text_per_id(t);

    if (build_index(t) != 0) {
        tok_free(t);
        return error_set(err, "%s: out of memory for the piece index", path);
    }
    *out = t;
    return 0;
}

// ---- byte-level BPE (GPT-2) ---------------------------------------------------------------

// GPT-2 spells each byte with a printable character: byte b is U+00b for b
// in 33..126, 161..172 and 174..255, and the other 68 bytes (controls,
// space, DEL, NBSP, soft hyphen) are U+0100 + n, n counting them in byte
// order. So ' ' (the 33rd other byte, n = 32) is U+0120 "Ġ".
static void bpe_byte_codepoints(uint32_t codepoint_of_byte[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        codepoint_of_byte[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

// Decodes one UTF-8 character at text[0..length); returns its byte count
// (1 for a malformed byte, which stands for itself as U+FFFD would).
static int utf8_decode(const unsigned char* text, size_t length, uint32_t* codepoint) {
    unsigned char c = text[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || (size_t)n > length) {
        *codepoint = 0xFFFD;
        return 1;
    }
    uint32_t value = n == 1 ? c : c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((text[i] & 0xC0) != 0x80) {
            *codepoint = 0xFFFD;
            return 1;
        }
        value = value << 6 | (text[i] & 0x3F);
    }
    *codepoint = value;
    return n;
}

static int utf8_encode(uint32_t codepoint, char* out) {
    if (codepoint < 0x80) {
        out[0] = (char)codepoint;
        return 1;
    }
    if (codepoint < 0x800) {
        out[0] = (char)(0xC0 | codepoint >> 6);
        out[1] = (char)(0x80 | (codepoint & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | codepoint >> 12);
    out[1] = (char)(0x80 | ((codepoint >> 6) & 0x3F));
    out[2] = (char)(0x80 | (codepoint & 0x3F));
    return 3;
}

// The merge table and the decoded text of every piece. Rules whose pieces
// are not all in the vocabulary can never apply and are left out; a
// repeated pair keeps its first (lowest) rank.
static int bpe_build(tokenizer* t, const tok_vocab* vocab, const char* source, error_info* err) {
    size_t capacity = 16;
    while (capacity < 2 * (size_t)vocab->n_merges) capacity *= 2;
    t->merges = malloc(capacity * sizeof *t->merges);
    t->decoded = calloc((size_t)t->vocab_size, sizeof *t->decoded);
    size_t decoded_total = 0;
    for (int id = 0; id < t->vocab_size; id++) decoded_total += strlen(t->pieces[id]) + 1;
    t->decoded_bytes = malloc(decoded_total);
    char* joined = malloc(2 * (size_t)TOK_MAX_TOKEN_LENGTH_LIMIT + 2);
    if (!t->merges || !t->decoded || !t->decoded_bytes || !joined) {
        free(joined);
        return error_set(err, "%s: out of memory for %d merges", source, vocab->n_merges);
    }
    t->merge_capacity = capacity;
    for (size_t i = 0; i < capacity; i++) t->merges[i].left = -1;
    for (int rank = 0; rank < vocab->n_merges; rank++) {
        const tok_piece_bytes* rule = &vocab->merges[rank];
        const char* space = rule->length > 0 ? memchr(rule->bytes, ' ', rule->length) : NULL;
        if (!space || rule->length > 2 * (size_t)TOK_MAX_TOKEN_LENGTH_LIMIT) continue;
        size_t left_length = (size_t)(space - rule->bytes), right_length = rule->length - left_length - 1;
        memcpy(joined, rule->bytes, left_length);
        joined[left_length] = '\0';
        int32_t left = lookup_piece(t, joined);
        memcpy(joined, space + 1, right_length);
        joined[right_length] = '\0';
        int32_t right = lookup_piece(t, joined);
        memcpy(joined, rule->bytes, left_length);
        memcpy(joined + left_length, space + 1, right_length);
        joined[left_length + right_length] = '\0';
        int32_t merged = lookup_piece(t, joined);
        if (left < 0 || right < 0 || merged < 0 || find_merge(t, left, right)) continue;
        size_t slot = merge_slot(capacity, left, right);
        while (t->merges[slot].left >= 0) slot = (slot + 1) & (capacity - 1);
        t->merges[slot] = (bpe_merge){left, right, merged, rank};
    }
    free(joined);
    uint32_t codepoint_of_byte[256];
    bpe_byte_codepoints(codepoint_of_byte);
    int byte_of_codepoint[324]; // stand-ins run up to U+0143
    for (int c = 0; c < 324; c++) byte_of_codepoint[c] = -1;
    for (int b = 0; b < 256; b++) byte_of_codepoint[codepoint_of_byte[b]] = b;
    char* out = t->decoded_bytes;
    for (int id = 0; id < t->vocab_size; id++) {
        const unsigned char* piece = (const unsigned char*)t->pieces[id];
        size_t length = strlen(t->pieces[id]);
        t->decoded[id] = out;
        for (size_t i = 0; i < length;) {
            uint32_t codepoint;
            int n = utf8_decode(piece + i, length - i, &codepoint);
            if (codepoint < 324 && byte_of_codepoint[codepoint] >= 0) *out++ = (char)byte_of_codepoint[codepoint];
            else for (int k = 0; k < n; k++) *out++ = (char)piece[i + k]; // not a stand-in: kept as written
            i += (size_t)n;
        }
        *out++ = '\0';
    }
    return 0;
}

// ----------------------------------------------------------------------------
// A vocabulary given as arrays (a GGUF file's tokenizer.ggml.* keys)

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's stand-in for a space.
static const char SENTENCEPIECE_SPACE[] = "\xe2\x96\x81";

// Copies a piece into out, each "▁" as one ' ' (SentencePiece's marker back
// to the space it stands for, as llama2.c's tokenizer.bin has it); stops at
// a NUL byte (pieces are C strings here). Returns the bytes written.
static size_t copy_piece(char* out, const char* bytes, size_t length, bool sentencepiece_spaces) {
    size_t n = 0;
    for (size_t i = 0; i < length && bytes[i] != '\0';) {
        if (sentencepiece_spaces && length - i >= 3 && memcmp(bytes + i, SENTENCEPIECE_SPACE, 3) == 0) {
            out[n++] = ' ';
            i += 3;
        } else {
            out[n++] = bytes[i++];
        }
    }
    out[n] = '\0';
    return n;
}

int tok_from_vocab(tokenizer** out, const tok_vocab* vocab, const char* source, error_info* err) {
    if (!out) return error_set(err, "tok_from_vocab: out is NULL");
    *out = NULL;
    if (!vocab || !vocab->pieces || !vocab->scores) return error_set(err, "%s: tokenizer: no pieces or scores", source);
    if (vocab->vocab_size < 1 || vocab->vocab_size > TOK_MAX_VOCAB_SIZE)
        return error_set(err, "%s: tokenizer.ggml.tokens: %d tokens, expected 1..%d", source, vocab->vocab_size,
                         TOK_MAX_VOCAB_SIZE);
    const int32_t special[3] = {vocab->bos_id, vocab->eos_id, vocab->unk_id};
    const char* special_names[3] = {"bos_token_id", "eos_token_id", "unknown_token_id"};
    for (int k = 0; k < 3; k++)
        if (special[k] < -1 || special[k] >= vocab->vocab_size)
            return error_set(err, "%s: tokenizer.ggml.%s: %d, expected an id below %d (or none)", source,
                             special_names[k], (int)special[k], vocab->vocab_size);
    size_t total = 0;
    for (int id = 0; id < vocab->vocab_size; id++) {
        if (vocab->pieces[id].length > TOK_MAX_TOKEN_LENGTH_LIMIT)
            return error_set(err, "%s: tokenizer.ggml.tokens: token %d is %zu bytes, expected at most %d", source, id,
                             vocab->pieces[id].length, TOK_MAX_TOKEN_LENGTH_LIMIT);
        if (isnan(vocab->scores[id])) return error_set(err, "%s: tokenizer.ggml.scores: token %d score is NaN", source, id);
        total += vocab->pieces[id].length + 1;
    }
    tokenizer* t = tokenizer_new(vocab->vocab_size, total);
    if (!t) return error_set(err, "%s: out of memory for %d tokens", source, vocab->vocab_size);
    char* next_piece = t->piece_bytes;
    int longest = 1;
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    for (int id = 0; id < vocab->vocab_size; id++) {
        size_t length = copy_piece(next_piece, vocab->pieces[id].bytes, vocab->pieces[id].length,
                                   vocab->sentencepiece_spaces);
        t->pieces[id] = next_piece;
        t->scores[id] = vocab->scores[id];
        next_piece += length + 1;
        if ((int)length > longest) longest = (int)length;
        // A byte piece stands for its byte whatever its type says: the
        // llama2c converter marks them BYTE (6), older files NORMAL.
        int byte = byte_piece_value(t->pieces[id]);
        if (byte >= 0 && t->byte_ids[byte] < 0 && (!vocab->types || vocab->types[id] == TOK_TYPE_BYTE ||
                                                     vocab->types[id] == TOK_TYPE_NORMAL))
            t->byte_ids[byte] = id;
    }
    t->max_token_length = longest;
    t->bos_id = vocab->bos_id;
    t->eos_id = vocab->eos_id;
    t->unk_id = vocab->unk_id;
    t->add_bos = vocab->add_bos && vocab->bos_id >= 0;
    t->add_space_prefix = vocab->add_space_prefix;
    t->pretokenizer = vocab->pretokenizer;
    t->max_text_per_id = find_max_text_per_id(t);
    if (build_index(t) != 0) {
        tok_free(t);
        return error_set(err, "%s: out of memory for the piece index", source);
    }
    if (vocab->n_merges > 0 && bpe_build(t, vocab, source, err) != 0) {
        tok_free(t);
        return -1;
    }
    if (vocab->types) {
        t->special_ids = malloc((size_t)vocab->vocab_size * sizeof *t->special_ids);
        if (!t->special_ids) {
            tok_free(t);
            return error_set(err, "%s: out of memory for the special tokens", source);
        }
        for (int id = 0; id < vocab->vocab_size; id++)
            if ((vocab->types[id] == TOK_TYPE_CONTROL || vocab->types[id] == TOK_TYPE_USER_DEFINED) && t->pieces[id][0])
                t->special_ids[t->n_special++] = id;
    }
    *out = t;
    return 0;
}

// ----------------------------------------------------------------------------
// The byte-level tokenizer

int tok_byte_level(tokenizer** out, error_info* err) {
    if (!out) return error_set(err, "tok_byte_level: out is NULL");
    static const char* const special_pieces[TOK_BYTE_OFFSET] = {"<unk>", "<s>", "</s>"};
    size_t piece_bytes_total = 256 * 2;
    for (int id = 0; id < TOK_BYTE_OFFSET; id++)
        piece_bytes_total += strlen(special_pieces[id]) + 1;
    tokenizer* t = tokenizer_new(TOK_MIN_VOCAB_SIZE, piece_bytes_total);
    if (!t) {
        *out = NULL;
        return error_set(err, "byte-level tokenizer: out of memory");
    }
    t->byte_level = true;
    t->max_token_length = 5;  // "<unk>"; the byte pieces are 1 byte
    t->max_text_per_id = 1;   // one id per byte
    char* next_piece = t->piece_bytes;
    for (int id = 0; id < TOK_MIN_VOCAB_SIZE; id++) {
        const char* piece =
            id < TOK_BYTE_OFFSET ? special_pieces[id] : t->byte_pieces[id - TOK_BYTE_OFFSET];
        size_t length = id < TOK_BYTE_OFFSET ? strlen(piece) : 1;  // byte 0 still reads as ""
        memcpy(next_piece, piece, length);
        next_piece[length] = '\0';
        t->pieces[id] = next_piece;
        next_piece += length + 1;
    }
    *out = t;
    return 0;
}

// ----------------------------------------------------------------------------
// Merging
//
// llama2.c merges in rounds: each round scans every adjacent pair, merges the
// one whose joined piece scores highest (the leftmost of equal scores, as its
// scan keeps the first best it finds) and shifts the rest of the list left.
// That is O(n) a round and up to n rounds: O(n^2), tens of seconds for a
// 256 KB prompt and minutes for 1 MB.
// The code below makes the same merges in the same order in O(n log n):
//   - the symbols form a doubly linked list, so a merge unlinks one symbol
//     instead of shifting the array behind it;
//   - the candidate merges wait in a binary heap ordered by score, highest
//     first, then by the left symbol's position, leftmost first: its top is
//     the pair llama2.c's scan would pick. A symbol is known by its index in
//     the list encoding started with (a merged symbol by its left part's),
//     and merging never reorders symbols, so a lower index is further left;
//   - a merge changes only the pairs on either side of it, which get new
//     heap entries. Their old entries are not searched for and removed: they
//     stay in the heap and are dropped when they reach the top and no longer
//     match the list ("lazy invalidation").

// One symbol of the text being merged: one id, standing for one or more of
// the ids encoding started with.
typedef struct {
    int32_t id;    // token id; -1 once merged into the symbol on its left
    int32_t prev;  // index of the symbol on the left, -1 for the first
    int32_t next;  // index of the symbol on the right, -1 for the last
} merge_symbol;

// A possible merge, as it stood when pushed: symbol `left` with id left_id,
// followed by a symbol with id right_id, which join as merged_id. The ids
// decide the result, so while the list still holds that pair at `left` the
// entry is exact, however old it is.
typedef struct {
    float score;        // t->scores[merged_id]; higher merges first
    int32_t left;       // index of the left symbol; lower merges first on equal scores
    int32_t left_id;    // the two ids the entry was made from
    int32_t right_id;
    int32_t merged_id;  // the id of the two pieces joined
} merge_candidate;

// A binary max-heap of candidates: entries[0] comes first, and entries[i]
// comes before its children entries[2i + 1] and entries[2i + 2].
typedef struct {
    merge_candidate* entries;  // (capacity) candidates, the first `count` in use
    size_t count;
    size_t capacity;
} candidate_heap;

// Whether a merges before b: llama2.c's choice between them.
static bool comes_first(const merge_candidate* a, const merge_candidate* b) {
    if (a->score != b->score) return a->score > b->score;  // scores are never NaN (tok_load)
    return a->left < b->left;
}

static void heap_push(candidate_heap* heap, merge_candidate candidate) {
    // The new entry rises from the end while it comes before its parent.
    size_t i = heap->count++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!comes_first(&candidate, &heap->entries[parent])) break;
        heap->entries[i] = heap->entries[parent];
        i = parent;
    }
    heap->entries[i] = candidate;
}

static merge_candidate heap_pop(candidate_heap* heap) {
    merge_candidate top = heap->entries[0];
    // The last entry sinks from the root while a child comes before it.
    merge_candidate last = heap->entries[--heap->count];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= heap->count) break;
        size_t sibling = child + 1;
        if (sibling < heap->count && comes_first(&heap->entries[sibling], &heap->entries[child]))
            child = sibling;
        if (!comes_first(&heap->entries[child], &last)) break;
        heap->entries[i] = heap->entries[child];
        i = child;
    }
    if (heap->count > 0) heap->entries[i] = last;
    return top;
}

// The merge rule for the pair (left, right), or NULL.
static size_t merge_slot(size_t capacity, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    key *= 0x9E3779B97F4A7C15ull; // Fibonacci hashing: the high bits are well mixed
    return (size_t)(key >> 32) & (capacity - 1);
}

static const bpe_merge* find_merge(const tokenizer* t, int32_t left, int32_t right) {
    for (size_t slot = merge_slot(t->merge_capacity, left, right);; slot = (slot + 1) & (t->merge_capacity - 1)) {
        const bpe_merge* entry = &t->merges[slot];
        if (entry->left < 0) return NULL;
        if (entry->left == left && entry->right == right) return entry;
    }
}

// Pushes the merge of symbols[left] with the symbol after it, if there is
// one: its joined piece must be in the vocab and score above NO_MERGE_SCORE
// (llama2.c's scan never picks a lower one). `joined` as in lookup_pair.
// A byte-level BPE vocabulary asks its merge table instead: score -rank.
static void push_pair(const tokenizer* t, candidate_heap* heap, const merge_symbol* symbols,
                      int32_t left, char* joined) {
    if (left < 0 || symbols[left].next < 0) return;
    int32_t left_id = symbols[left].id;
    int32_t right_id = symbols[symbols[left].next].id;
    if (t->merges) { // byte-level BPE: the merge table decides, the lowest rank first
        const bpe_merge* rule = find_merge(t, left_id, right_id);
        if (rule) heap_push(heap, (merge_candidate){-(float)rule->rank, left, left_id, right_id, rule->merged});
        return;
    }
    int32_t merged_id = lookup_pair(t, left_id, right_id, joined);
    if (merged_id < 0 || !(t->scores[merged_id] > NO_MERGE_SCORE)) return;
    heap_push(heap, (merge_candidate){t->scores[merged_id], left, left_id, right_id, merged_id});
}

// Whether the pair a candidate was made from is still in the list. A merge
// gives its left symbol a new id and ends its right one (id -1), so an entry
// for a pair that was merged, or whose either side has since grown, fails
// here; one that passes describes a pair of the list exactly.
static bool is_current(const merge_candidate* candidate, const merge_symbol* symbols) {
    const merge_symbol* left = &symbols[candidate->left];
    return left->id == candidate->left_id && left->next >= 0 &&
           symbols[left->next].id == candidate->right_id;
}

// Merges ids[0..n) as llama2.c's encode() does and writes the result back to
// the front of ids. Returns the new count, or -1 when out of memory.
static int merge_pairs(const tokenizer* t, int32_t* ids, int n, char* joined) {
    if (n < 2) return n;
    merge_symbol* symbols = malloc((size_t)n * sizeof *symbols);  // (n) the list, by first position
    // The heap starts with at most n - 1 pairs and each merge pops one entry
    // and pushes at most two; there are at most n - 1 merges, so it never
    // holds more than 2n - 2 entries (20 bytes each: 40 MB for a 1 MB text).
    candidate_heap heap = {malloc(2 * (size_t)n * sizeof *heap.entries), 0, 2 * (size_t)n};
    if (!symbols || !heap.entries) {
        free(symbols);
        free(heap.entries);
        return -1;
    }
    for (int i = 0; i < n; i++) symbols[i] = (merge_symbol){ids[i], i - 1, i + 1 < n ? i + 1 : -1};
    for (int i = 0; i + 1 < n; i++) push_pair(t, &heap, symbols, i, joined);

    while (heap.count > 0) {
        merge_candidate best = heap_pop(&heap);
        if (!is_current(&best, symbols)) continue;  // a merge changed this pair since
        // The left symbol takes the joined id; the right one leaves the list.
        merge_symbol* left = &symbols[best.left];
        int32_t right = left->next;
        left->id = best.merged_id;
        left->next = symbols[right].next;
        if (left->next >= 0) symbols[left->next].prev = best.left;
        symbols[right].id = -1;
        // Only the pairs either side of the new symbol changed.
        push_pair(t, &heap, symbols, left->prev, joined);
        push_pair(t, &heap, symbols, best.left, joined);
    }

    // Symbol 0 is never merged into a left neighbour: the list starts there.
    int count = 0;
    for (int32_t i = 0; i >= 0; i = symbols[i].next) ids[count++] = symbols[i].id;
    free(symbols);
    free(heap.entries);
    return count;
}

// ----------------------------------------------------------------------------
// Encoding

static bool is_utf8_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The id a byte without a piece of its own becomes: its "<0xXX>" piece, or
// the unknown token in a vocabulary without byte pieces (0 when it has none either).
static int32_t fallback_id(const tokenizer* t, unsigned char byte) {
    if (t->byte_ids[byte] >= 0) return t->byte_ids[byte];
    return t->unk_id >= 0 ? t->unk_id : 0;
}

static int encode_byte_level(const char* text, size_t text_bytes, bool add_bos, bool add_eos,
                             int32_t* ids, int capacity, int* n_ids, error_info* err) {
    int needed = (int)text_bytes + add_bos + add_eos;
    if (needed > capacity) {
        *n_ids = needed;
        return error_set(err, "tok_encode: text needs %d ids, capacity is %d", needed, capacity);
    }
    int n = 0;
    if (add_bos) ids[n++] = TOK_BOS_ID;
    for (size_t i = 0; i < text_bytes; i++) ids[n++] = (unsigned char)text[i] + TOK_BYTE_OFFSET;
    if (add_eos) ids[n++] = TOK_EOS_ID;
    *n_ids = n;
    return 0;
}

// The fewest ids a text of text_bytes (> 0) bytes can become, for a
// tokenizer with a bound (max_text_per_id > 0): every id stands for at most
// max_text_per_id bytes of the text and its dummy-prefix space, so the text
// needs at least ceil((text_bytes + 1) / max_text_per_id) of them, then EOS.
// BOS is not counted: a vocab could hold a piece that joins it to the text.
static int64_t min_ids_needed(const tokenizer* t, size_t text_bytes, bool add_eos) {
    int64_t per_id = t->max_text_per_id;
    return ((int64_t)text_bytes + 1 + per_id - 1) / per_id + add_eos;
}

// ---- byte-level BPE encoding --------------------------------------------------------------

// The end (character index) of the pre-token that starts at character i
// of cps[0..n), by GPT-2's split pattern, tried in its order:
//   's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
static int gpt2_pretoken_end(const uint32_t* cps, int n, int i) {
    if (cps[i] == '\'' && i + 1 < n) {
        uint32_t a = cps[i + 1], b = i + 2 < n ? cps[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    int k = cps[i] == ' ' && i + 1 < n ? i + 1 : i; // the optional single space before a run
    if (unicode_is_letter(cps[k])) {
        while (k < n && unicode_is_letter(cps[k])) k++;
        return k;
    }
    if (unicode_is_number(cps[k])) {
        while (k < n && unicode_is_number(cps[k])) k++;
        return k;
    }
    if (!unicode_is_whitespace(cps[k])) {
        while (k < n && !unicode_is_whitespace(cps[k]) && !unicode_is_letter(cps[k]) && !unicode_is_number(cps[k]))
            k++;
        return k;
    }
    // Whitespace: the run, less its last character when something other
    // than whitespace follows (that character starts the next pre-token).
    int end = i;
    while (end < n && unicode_is_whitespace(cps[end])) end++;
    if (end < n && end - i > 1) return end - 1;
    return end;
}

static bool is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

// \s, \p{L} and \p{N} excluded: the pattern's "[^\s\p{L}\p{N}]".
static bool is_symbol(uint32_t c) {
    return !unicode_is_whitespace(c) && !unicode_is_letter(c) && !unicode_is_number(c);
}

static uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c; }

// The end of the pre-token at character i by Llama 3's pattern (qwen2's
// with max_digits 1), its alternatives tried in order (tokenizer.h).
static int llama3_pretoken_end(const uint32_t* cps, int n, int i, int max_digits) {
    if (cps[i] == '\'' && i + 1 < n) { // contractions, either case
        uint32_t a = ascii_lower(cps[i + 1]), b = i + 2 < n ? ascii_lower(cps[i + 2]) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    int k = i; // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!is_newline(cps[k]) && !unicode_is_letter(cps[k]) && !unicode_is_number(cps[k]) && k + 1 < n &&
        unicode_is_letter(cps[k + 1]))
        k++;
    if (unicode_is_letter(cps[k])) {
        while (k < n && unicode_is_letter(cps[k]))
            k++;
        return k;
    }
    if (unicode_is_number(cps[i])) { // \p{N}{1,max_digits}
        k = i;
        while (k < n && k - i < max_digits && unicode_is_number(cps[k]))
            k++;
        return k;
    }
    k = cps[i] == ' ' && i + 1 < n ? i + 1 : i; // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if (is_symbol(cps[k])) {
        while (k < n && is_symbol(cps[k]))
            k++;
        while (k < n && is_newline(cps[k]))
            k++;
        return k;
    }
    // Whitespace from here (every other start matched above).
    int end = i;
    while (end < n && unicode_is_whitespace(cps[end]))
        end++;
    for (int j = end - 1; j >= i; j--) // \s*[\r\n]+: through the run's last newline
        if (is_newline(cps[j])) return j + 1;
    if (end < n && end - i > 1) return end - 1; // \s+(?!\S): leave one space for what follows
    return end;                                 // \s+
}

// The end of the pre-token starting at character i of cps[0..n) under pre.
static int pretoken_end(tok_pretokenizer pre, const uint32_t* cps, int n, int i) {
    switch (pre) {
    case TOK_PRE_LLAMA3: return llama3_pretoken_end(cps, n, i, 3);
    case TOK_PRE_QWEN2: return llama3_pretoken_end(cps, n, i, 1);
    case TOK_PRE_SMOLLM: {
        // Number characters split first, one each; GPT-2's pattern then runs
        // on the text between them as if each stretch were the whole text.
        if (unicode_is_number(cps[i])) return i + 1;
        int stretch_end = i;
        while (stretch_end < n && !unicode_is_number(cps[stretch_end]))
            stretch_end++;
        return gpt2_pretoken_end(cps, stretch_end, i);
    }
    case TOK_PRE_GPT2: break;
    }
    return gpt2_pretoken_end(cps, n, i);
}

// The code points of text[0..text_bytes) and the byte offset of each (starts:
// (characters + 1), the last text_bytes). Returns the character count.
static int decode_characters(const char* text, size_t text_bytes, uint32_t* cps, size_t* starts) {
    int n_chars = 0;
    for (size_t i = 0; i < text_bytes;) {
        starts[n_chars] = i;
        i += (size_t)utf8_decode((const unsigned char*)text + i, text_bytes - i, &cps[n_chars]);
        n_chars++;
    }
    starts[n_chars] = text_bytes;
    return n_chars;
}

int tok_pretokenize(tok_pretokenizer pre, const char* text, size_t* ends, int capacity) {
    const size_t text_bytes = strlen(text);
    uint32_t* cps = malloc((text_bytes + 1) * sizeof *cps);
    size_t* starts = malloc((text_bytes + 1) * sizeof *starts);
    if (!cps || !starts) {
        free(cps), free(starts);
        return -1;
    }
    const int n_chars = decode_characters(text, text_bytes, cps, starts);
    int n_pieces = 0;
    for (int begin = 0; begin < n_chars; n_pieces++) {
        const int end = pretoken_end(pre, cps, n_chars, begin);
        if (n_pieces < capacity) ends[n_pieces] = starts[end];
        begin = end;
    }
    free(cps), free(starts);
    return n_pieces;
}

static int encode_bpe(const tokenizer* t, const char* text, size_t text_bytes, bool add_bos, bool add_eos, int32_t* ids,
                      int capacity, int* n_ids, error_info* err) {
    // At most one id per byte, plus BOS and EOS.
    int32_t* work = malloc((text_bytes + 2) * sizeof *work);
    uint32_t* cps = malloc((text_bytes + 1) * sizeof *cps);     // (characters) code points of the text
    size_t* starts = malloc((text_bytes + 1) * sizeof *starts); // (characters + 1) byte offset of each
    // (2 text_bytes + 1) a pre-token spelled in stand-in characters (U+0000..U+0143: <= 2 bytes each)
    char* whole_word = t->pretokenizer == TOK_PRE_LLAMA3 ? malloc(2 * text_bytes + 1) : NULL;
    if (!work || !cps || !starts || (t->pretokenizer == TOK_PRE_LLAMA3 && !whole_word)) {
        free(work), free(cps), free(starts), free(whole_word);
        return error_set(err, "tok_encode: out of memory for %zu bytes of text", text_bytes);
    }
    const int n_chars = decode_characters(text, text_bytes, cps, starts);
    uint32_t codepoint_of_byte[256];
    bpe_byte_codepoints(codepoint_of_byte);
    int n = 0;
    if (add_bos && t->bos_id >= 0) work[n++] = t->bos_id;
    char joined[8];
    for (int begin = 0; begin < n_chars;) {
        int end = pretoken_end(t->pretokenizer, cps, n_chars, begin);
        int first = n;
        if (t->pretokenizer == TOK_PRE_LLAMA3) {
            // ignore_merges: a pre-token spelled by one piece is that piece.
            char* end_of_word = whole_word;
            for (size_t i = starts[begin]; i < starts[end]; i++)
                end_of_word += utf8_encode(codepoint_of_byte[(unsigned char)text[i]], end_of_word);
            *end_of_word = '\0';
            int32_t whole = lookup_piece(t, whole_word);
            if (whole >= 0) {
                work[n++] = whole;
                begin = end;
                continue;
            }
        }
        for (size_t i = starts[begin]; i < starts[end]; i++) { // each byte as its stand-in's piece
            char piece[4];
            int length = utf8_encode(codepoint_of_byte[(unsigned char)text[i]], piece);
            piece[length] = '\0';
            int32_t id = lookup_piece(t, piece);
            if (id < 0) id = t->unk_id;
            if (id >= 0) work[n++] = id; // a vocabulary without that byte and without <unk> drops it
        }
        int merged = merge_pairs(t, work + first, n - first, joined);
        if (merged < 0) {
            free(work), free(cps), free(starts), free(whole_word);
            return error_set(err, "tok_encode: out of memory merging");
        }
        n = first + merged;
        begin = end;
    }
    if (add_eos && t->eos_id >= 0) work[n++] = t->eos_id;
    int status = 0;
    if (n > capacity) status = error_set(err, "tok_encode: text needs %d ids, capacity is %d", n, capacity);
    else if (n > 0) memcpy(ids, work, (size_t)n * sizeof *ids);
    *n_ids = n;
    free(work), free(cps), free(starts), free(whole_word);
    return status;
}

static int check_encode_arguments(const tokenizer* t, const char* text, const int32_t* ids, int capacity,
                                  int* n_ids, error_info* err) {
    if (!n_ids) return error_set(err, "tok_encode: n_ids is NULL");
    *n_ids = 0;
    if (!t || !text) return error_set(err, "tok_encode: %s is NULL", t ? "text" : "tokenizer");
    if (capacity < 0 || (capacity > 0 && !ids))
        return error_set(err, "tok_encode: capacity is %d with ids %s, expected >= 0 and ids set",
                         capacity, ids ? "set" : "NULL");
    return 0;
}

// A text that cannot fit whatever its merges is refused before any work
// (a 1 MB prompt for a 512-token context takes no time). Only counting
// (ids NULL, capacity 0) asks for the exact count, so it is not refused.
static int refuse_text_that_cannot_fit(const tokenizer* t, size_t text_bytes, bool add_eos, const int32_t* ids,
                                       int capacity, int* n_ids, error_info* err) {
    bool only_counting = !ids && capacity == 0;
    if (!only_counting && t->max_text_per_id > 0 && text_bytes > 0) {
        int64_t at_least = min_ids_needed(t, text_bytes, add_eos);
        if (at_least > capacity) {
            *n_ids = (int)at_least;
            return error_set(err,
                             "tok_encode: text of %zu bytes needs at least %lld ids (no piece "
                             "is longer than %d bytes), capacity is %d",
                             text_bytes, (long long)at_least, t->max_text_per_id, capacity);
        }
    }
    return 0;
}

// The ids before merging: BOS, the dummy prefix, then one id per UTF-8
// codepoint the vocab has, else one per byte. Returns how many; work holds
// text_bytes + 3, joined is scratch for one codepoint and its NUL.
static int unmerged_ids(const tokenizer* t, const char* text, size_t text_bytes, bool add_bos, int32_t* work,
                        char* joined) {
    int n = 0;
    if (add_bos && t->bos_id >= 0) work[n++] = t->bos_id;
    // SentencePiece's add_dummy_prefix: text starts as if after a space.
    // llama2.c stores -1 here (and later reads out of bounds) when the vocab
    // has no " "; the byte fallback for ' ' is the same text.
    if (text_bytes > 0 && t->add_space_prefix) {
        int32_t space_id = lookup_piece(t, " ");
        work[n++] = space_id >= 0 ? space_id : fallback_id(t, ' ');
    }
    // A codepoint is a byte and the continuation bytes (10xxxxxx) after it,
    // at most 4 bytes in all, grouped as llama2.c does, which also copes
    // with malformed UTF-8.
    for (size_t start = 0; start < text_bytes;) {
        size_t end = start + 1;
        while (end < text_bytes && end - start < 4 &&
               is_utf8_continuation((unsigned char)text[end]))
            end++;
        memcpy(joined, text + start, end - start);
        joined[end - start] = '\0';
        int32_t id = lookup_piece(t, joined);
        if (id >= 0) {
            work[n++] = id;
        } else {
            for (size_t i = start; i < end; i++) work[n++] = fallback_id(t, (unsigned char)text[i]);
        }
        start = end;
    }
    return n;
}

// SentencePiece-style encoding: codepoint ids, then merges as llama2.c does.
static int encode_sentencepiece(const tokenizer* t, const char* text, size_t text_bytes, bool add_bos,
                                bool add_eos, int32_t* ids, int capacity, int* n_ids, error_info* err) {
    size_t max_ids = text_bytes + 3;
    int32_t* work = malloc(max_ids * sizeof *work);  // (max_ids) ids being merged
    // Two pieces and a NUL; at least 5 bytes for a 4-byte codepoint and its
    // NUL, as llama2.c sizes it (2 * max_token_length + 1 + 2).
    char* joined = malloc((size_t)t->max_token_length * 2 + 3);
    if (!work || !joined) {
        free(work);
        free(joined);
        return error_set(err, "tok_encode: out of memory for %zu ids", max_ids);
    }

    int n = unmerged_ids(t, text, text_bytes, add_bos, work, joined);
    // llama2.c merges with BOS in the list too: BOS's piece ("\n<s>\n") joins
    // nothing in real vocabs, but the same list gives the same ids.
    n = merge_pairs(t, work, n, joined);
    if (n < 0) {
        free(work);
        free(joined);
        return error_set(err, "tok_encode: out of memory merging %zu ids", max_ids);
    }
    if (add_eos && t->eos_id >= 0) work[n++] = t->eos_id;

    int status = 0;
    if (n > capacity) {
        status = error_set(err, "tok_encode: text needs %d ids, capacity is %d", n, capacity);
    } else if (n > 0) {
        memcpy(ids, work, (size_t)n * sizeof *ids);
    }
    *n_ids = n;
    free(work);
    free(joined);
    return status;
}

int tok_encode(const tokenizer* t, const char* text, bool add_bos, bool add_eos, int32_t* ids,
               int capacity, int* n_ids, error_info* err) {
    if (check_encode_arguments(t, text, ids, capacity, n_ids, err)) return -1;
    size_t text_bytes = strlen(text);
    // Before merging there is at most one id per byte, plus BOS, the dummy
    // prefix and EOS; that count must fit an int.
    if (text_bytes > (size_t)INT_MAX - 3)
        return error_set(err, "tok_encode: text is %zu bytes, more than %d", text_bytes,
                         INT_MAX - 3);
    if (t->byte_level)
        return encode_byte_level(text, text_bytes, add_bos, add_eos, ids, capacity, n_ids, err);
    if (t->merges) return encode_bpe(t, text, text_bytes, add_bos, add_eos, ids, capacity, n_ids, err);
    if (refuse_text_that_cannot_fit(t, text_bytes, add_eos, ids, capacity, n_ids, err)) return -1;
    return encode_sentencepiece(t, text, text_bytes, add_bos, add_eos, ids, capacity, n_ids, err);
}

// ----------------------------------------------------------------------------
// Decoding

static int hex_digit_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// The byte a piece "<0xXX>" stands for, or -1 for any other piece.
// llama2.c uses sscanf("<0x%02hhX>"), which also takes pieces such as "<0x4"
// or "<0x4A>junk"; real vocabs have only the exact form, which is all this
// accepts.
static int byte_piece_value(const char* piece) {
    if (strlen(piece) != 6 || strncmp(piece, "<0x", 3) != 0 || piece[5] != '>') return -1;
    int high = hex_digit_value(piece[3]);
    int low = hex_digit_value(piece[4]);
    if (high < 0 || low < 0) return -1;
    return high * 16 + low;
}

const char* tok_decode_piece(const tokenizer* t, int32_t prev_id, int32_t id) {
    if (!t || id < 0 || id >= t->vocab_size) return "";
    if (t->byte_level) return id >= TOK_BYTE_OFFSET ? t->byte_pieces[id - TOK_BYTE_OFFSET] : "";
    if (t->decoded) return t->decoded[id];
    const char* piece = t->pieces[id];
    // After BOS, SentencePiece's decoder drops the dummy prefix's space.
    if (prev_id == t->bos_id && piece[0] == ' ' && t->add_space_prefix) piece++;
    int byte = byte_piece_value(piece);
    if (byte >= 0) return t->byte_pieces[byte];  // byte 0 gives "": a C string cannot hold it
    return piece;
}

bool tok_piece_is_printable(const char* piece) {
    if (!piece || piece[0] == '\0') return false;
    if (piece[1] != '\0') return true;
    unsigned char byte = (unsigned char)piece[0];
    if (byte >= 0x80) return true;  // a UTF-8 fragment: see tokenizer.h
    // isprint || isspace in the C locale, spelled out so that a program's
    // setlocale() cannot change what is printed.
    bool is_print = byte >= 0x20 && byte < 0x7F;
    bool is_space = byte >= '\t' && byte <= '\r';
    return is_print || is_space;
}

size_t tok_decode_text(const tokenizer* t, int32_t first_prev_id, const int32_t* ids, int n,
                       char* out, size_t out_capacity) {
    size_t needed = 0;  // bytes of the whole text so far
    int32_t prev_id = first_prev_id;
    for (int i = 0; ids && i < n; i++) {
        const char* piece = tok_decode_piece(t, prev_id, ids[i]);
        prev_id = ids[i];
        if (!tok_piece_is_printable(piece)) continue;
        size_t length = strlen(piece);
        if (out && needed < out_capacity) {
            size_t room = out_capacity - 1 - needed;  // leaves the NUL's byte
            memcpy(out + needed, piece, length < room ? length : room);
        }
        needed += length;
    }
    if (out && out_capacity > 0) out[needed < out_capacity ? needed : out_capacity - 1] = '\0';
    return needed;
}

// ----------------------------------------------------------------------------
// Special tokens in the text (chat templates)

int tok_encode_special(const tokenizer* t, const char* text, bool add_bos, bool add_eos, int32_t* ids, int capacity,
                       int* n_ids, error_info* err) {
    if (!n_ids) return error_set(err, "tok_encode_special: n_ids is NULL");
    *n_ids = 0;
    if (!t || !text) return error_set(err, "tok_encode_special: %s is NULL", t ? "text" : "tokenizer");
    int n = 0;
    int32_t bos = t->bos_id;
    if (add_bos && bos >= 0) {
        if (n < capacity) ids[n] = bos;
        n++;
    }
    size_t length = strlen(text);
    char* segment = malloc(length + 1);
    if (!segment) return error_set(err, "tok_encode_special: out of memory for %zu bytes", length);
    size_t start = 0;
    for (size_t i = 0; i <= length;) {
        // The longest special piece that starts here (none at the end).
        int32_t match = -1;
        size_t match_length = 0;
        for (int k = 0; i < length && k < t->n_special; k++) {
            const char* piece = t->pieces[t->special_ids[k]];
            size_t piece_length = strlen(piece);
            if (piece_length > match_length && piece_length <= length - i && memcmp(text + i, piece, piece_length) == 0) {
                match = t->special_ids[k];
                match_length = piece_length;
            }
        }
        if (match < 0 && i < length) {
            i++;
            continue;
        }
        if (i > start) { // the plain text before this special token (or the end)
            memcpy(segment, text + start, i - start);
            segment[i - start] = '\0';
            int got = 0;
            int room = capacity - n > 0 ? capacity - n : 0;
            error_info ignored = {{0}};
            if (tok_encode(t, segment, false, false, room > 0 ? ids + n : NULL, room, &got, &ignored) != 0 && got == 0) {
                free(segment);
                return error_set(err, "tok_encode_special: %s", ignored.message);
            }
            if (got > room) { // count exactly what it needs
                tok_encode(t, segment, false, false, NULL, 0, &got, &ignored);
            }
            n += got;
        }
        if (match >= 0) {
            if (n < capacity) ids[n] = match;
            n++;
            i += match_length;
            start = i;
        } else {
            break; // i == length
        }
    }
    free(segment);
    if (add_eos && t->eos_id >= 0) {
        if (n < capacity) ids[n] = t->eos_id;
        n++;
    }
    *n_ids = n;
    if (n > capacity) return error_set(err, "tok_encode_special: text needs %d ids, capacity is %d", n, capacity);
    return 0;
}
