// tokenizer: text <-> token ids.
//
// Two kinds, behind one type:
//   - a llama2.c tokenizer.bin (SentencePiece BPE exported with scores and
//     byte fallback), encoded and decoded exactly as llama2.c's run.c does,
//     so that prompts give the same ids as the reference implementation;
//   - a byte-level tokenizer for synthetic models (vocab 259: three special
//     tokens, then one id per byte value), which needs no file.
//
// Ids 0, 1, 2 are <unk>, BOS and EOS in both; byte b falls back to id b + 3.
//
// A third source, a vocabulary handed over as arrays (tok_from_vocab: what
// a GGUF file's tokenizer.ggml.* keys hold, read by engine/gguf_vocab.c),
// uses the same SentencePiece algorithm with its own special ids, byte
// pieces and add_bos / add_space_prefix flags.
#ifndef SERVELAB_TOKENIZER_H
#define SERVELAB_TOKENIZER_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { TOK_UNK_ID = 0, TOK_BOS_ID = 1, TOK_EOS_ID = 2, TOK_BYTE_OFFSET = 3 };

// A vocab needs the three special tokens and the 256 byte fallbacks.
enum { TOK_MIN_VOCAB_SIZE = TOK_BYTE_OFFSET + 256 };

// Longest piece tok_load accepts (bytes). Real tokenizers stay far below:
// tok512 has 7, Llama 2's 32000-token vocab 27. The bound turns a garbage
// header into an error instead of a huge allocation.
enum { TOK_MAX_TOKEN_LENGTH_LIMIT = 4096 };

typedef struct tokenizer tokenizer;

// Loads a llama2.c tokenizer.bin: little-endian int32 max_token_length, then
// for each of vocab_size tokens a float32 merge score, an int32 byte length
// (1..max_token_length) and the bytes. The file does not store vocab_size;
// it is the model's. The whole file is checked before anything is built:
// truncation, bad lengths, NaN scores and trailing bytes are errors that
// name the token index. *out is NULL on failure.
int tok_load(tokenizer** out, const char* path, int vocab_size, error_info* err);

// The number of tokens a tokenizer.bin holds (*vocab_size), for a model made
// to fit the tokenizer (a synthetic preset). The file gets the same checks
// as in tok_load, except that it may hold any number of tokens.
int tok_file_vocab_size(const char* path, int* vocab_size, error_info* err);

// The byte-level tokenizer of synthetic models: vocab 259, id 0 "<unk>",
// 1 "<s>" (BOS), 2 "</s>" (EOS), id 3 + b = byte b. Encoding is one id per
// byte of the text: no dummy space prefix, no merges.
int tok_byte_level(tokenizer** out, error_info* err);

// SentencePiece token types as GGUF stores them (tokenizer.ggml.token_type).
enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

// Largest vocabulary tok_from_vocab takes (Llama 3 has 128256, Gemma 256000).
enum { TOK_MAX_VOCAB_SIZE = 1 << 22 };

typedef struct tok_piece_bytes {
    const char* bytes; // not NUL-terminated
    size_t length;     // bytes
} tok_piece_bytes;

// How a byte-level BPE vocabulary splits text before merging (GGUF
// tokenizer.ggml.pre), each a split pattern of llama.cpp's llama-vocab.cpp:
typedef enum tok_pretokenizer {
    // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    TOK_PRE_GPT2 = 0,
    // Llama 3 ("llama-bpe"): contractions in either case, one non-letter before
    // letters ("(hello", " hello"), numbers in runs of 1-3 digits, symbols with
    // the newlines after them, newlines with the spaces before them:
    // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    // A pre-token that is itself a piece of the vocabulary is taken whole, unmerged
    // (llama.cpp's ignore_merges for this pre-tokenizer).
    TOK_PRE_LLAMA3 = 1,
    // Qwen2: Llama 3's pattern with \p{N} (every digit alone) for \p{N}{1,3}.
    TOK_PRE_QWEN2 = 2,
    // SmolLM: every number character alone first, then GPT-2's pattern on the rest.
    TOK_PRE_SMOLLM = 3,
} tok_pretokenizer;

typedef struct tok_vocab {
    int vocab_size;
    const tok_piece_bytes* pieces;  // (vocab_size) each token's text
    const float* scores;            // (vocab_size) merge scores, higher merges first
    const int32_t* types;           // (vocab_size) TOK_TYPE_*, or NULL
    int32_t bos_id, eos_id, unk_id; // -1: none
    bool add_bos;                   // a prompt starts with BOS
    bool add_space_prefix;          // text is encoded as if after a space
    bool sentencepiece_spaces;      // "▁" (U+2581) in a piece stands for ' '
    // Byte-level BPE (GGUF tokenizer.ggml.model "gpt2"): the merge rules
    // "LEFT RIGHT" in rank order. n_merges > 0 makes this a BPE vocabulary:
    // pieces spell bytes with GPT-2's printable stand-ins (' ' is "Ġ"), text
    // is split by GPT-2's pre-tokenizer pattern, each part merged by rank.
    const tok_piece_bytes* merges;  // (n_merges)
    int n_merges;
    tok_pretokenizer pretokenizer; // byte-level BPE only
} tok_vocab;

// A SentencePiece (or, with merges, byte-level BPE) tokenizer from a vocabulary: the llama2.c algorithm
// (tok_encode) with the vocabulary's special ids; byte b falls back to the
// piece "<0xXX>" (type BYTE or NORMAL), else to unk. Pieces are copied, with
// "▁" turned into ' ' when sentencepiece_spaces (so a literal U+2581 in a
// text is not taken for a space, unlike llama.cpp, which marks spaces
// instead of unmarking pieces). source names the file in messages.
int tok_from_vocab(tokenizer** out, const tok_vocab* vocab, const char* source, error_info* err);

void tok_free(tokenizer* t);

// The special ids and whether the vocabulary asks for BOS (llama2.c and
// byte-level: 1, 2, true).
int32_t tok_bos_id(const tokenizer* t);
int32_t tok_eos_id(const tokenizer* t);
bool tok_adds_bos(const tokenizer* t);

// "SentencePiece", "byte-level BPE (GPT-2)" or "byte-level (one id per byte)".
const char* tok_kind(const tokenizer* t);

// The piece of an id as stored ("" when out of range): for `tokenize`.
const char* tok_piece(const tokenizer* t, int32_t id);

// The pre-tokens of text (UTF-8, NUL-terminated) under `pre`: the byte
// offset where each piece ends goes to ends[0..capacity). Returns the number
// of pieces (only the first `capacity` are written), or -1 out of memory.
// For tests and for `tokenize`: tok_encode splits the same way.
int tok_pretokenize(tok_pretokenizer pre, const char* text, size_t* ends, int capacity);

int tok_vocab_size(const tokenizer* t);
bool tok_is_byte_level(const tokenizer* t);

// Encodes text (UTF-8, NUL-terminated) as llama2.c's encode() does: BOS if
// add_bos, a dummy " " token before non-empty text, each UTF-8 codepoint as
// its piece or else as its bytes (id = byte + 3), then merges the adjacent
// pair whose joined piece has the highest score (strictly higher: the
// leftmost wins a tie) until no pair joins; EOS last if add_eos. The ids are
// llama2.c's, but found in O(n log n) time rather than its O(n^2).
// ids has room for `capacity` ids (ids may be NULL when capacity is 0).
// On success *n_ids is the count. When the ids do not fit, nothing is written
// to ids, *n_ids gets the count needed, and it fails (like snprintf, so a
// caller can retry with a larger array).
// A text too long to fit in any case is refused before it is encoded: no id
// stands for more text than the longest piece, so B bytes of text need at
// least ceil((B + 1) / longest piece) ids (the + 1 is the dummy space), plus
// EOS. Then *n_ids gets that lower bound, not the exact count, and the
// message names both numbers. Only counting (ids NULL, capacity 0) is never
// refused early: it encodes the whole text to give the exact count. (A vocab
// with a byte piece that is empty as a C string has no such bound and skips
// this check; no real one has.)
int tok_encode(const tokenizer* t, const char* text, bool add_bos, bool add_eos, int32_t* ids,
               int capacity, int* n_ids, error_info* err);

// tok_encode, except that the text of a CONTROL or USER_DEFINED token
// (a vocabulary's "<|im_start|>", "</s>", ...: types from tok_from_vocab)
// becomes that token's id, the longest such text first, and the plain text
// between them is encoded as tok_encode does (a SentencePiece vocabulary
// gives each such part its leading space, as llama.cpp does after a special
// token). For chat templates; llama2.c and byte-level tokenizers have no
// special texts. Same capacity rules as tok_encode (no early refusal).
int tok_encode_special(const tokenizer* t, const char* text, bool add_bos, bool add_eos, int32_t* ids, int capacity,
                       int* n_ids, error_info* err);

// The text of `id` when it follows `prev_id`, as llama2.c's decode(): after
// BOS one leading space is stripped (it is the dummy prefix); a piece
// "<0xXX>" becomes that single raw byte. Byte-level: ids 3..258 give their
// byte and 0..2 give "". An out-of-range id gives "". The pointer stays
// valid until tok_free.
const char* tok_decode_piece(const tokenizer* t, int32_t prev_id, int32_t id);

// llama2.c's safe_printf() rule: false for "" and for a single ASCII byte
// that is neither printable nor whitespace (control codes); true otherwise.
// Unlike llama2.c, a single byte >= 0x80 counts as printable: it is one
// fragment of a UTF-8 character that byte fallback split, and dropping it
// (as llama2.c does) would garble every character that has no piece.
bool tok_piece_is_printable(const char* piece);

// Appends the printable pieces of ids[0..n) to out, decoding each with the id
// before it (the first with first_prev_id; pass TOK_BOS_ID for a prompt that
// followed BOS). out holds out_capacity bytes and is always NUL-terminated
// when out_capacity > 0; the text is cut there if it does not fit. Returns
// the length the whole text needs, not counting the NUL (like snprintf).
size_t tok_decode_text(const tokenizer* t, int32_t first_prev_id, const int32_t* ids, int n,
                       char* out, size_t out_capacity);

#endif
