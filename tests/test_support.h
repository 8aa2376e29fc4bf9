// Shared helpers for the cmocka tests (include after <cmocka.h>).
//
// Tests run from the repository root (scripts/run-tests.sh). The reference
// model files live in ../shared/models beside the clone. In a user's clone
// without ../shared those tests are skipped with a message; when CI is set
// they fail instead, so that CI never reports a skipped check as a pass.
#ifndef SERVELAB_TEST_SUPPORT_H
#define SERVELAB_TEST_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernel_traffic.h"

// Writes the path of ../shared/models/<name>, or else ./models/<name>, into
// out and returns true when the file exists; false otherwise.
bool shared_model_path(char* out, size_t out_capacity, const char* name);

// A writable scratch directory for this test binary (created on first use,
// under build/test-tmp). Returns its path.
const char* test_scratch_dir(void);

// Reads a whole file into a malloc'ed buffer; returns NULL on failure.
unsigned char* test_read_file(const char* path, size_t* out_size);

// Reads a whole file as a NUL-terminated string (malloc'ed); a missing or
// unreadable file gives an empty string, so callers need no NULL check.
char* test_read_text(const char* path);

// True when the CPU has SIMD `level`. A missing level is skipped with a
// message in a user's build, and fails the test under CI (the CI machine
// has AVX-512 and VNNI). level is a cpu_simd_level from kernels/cpu/cpu_features.h.
bool test_simd_level_available(int level);

// The servelab binary under test: $SERVELAB_BIN (set by scripts/run-tests.sh)
// or bin/servelab.
const char* test_servelab_binary(void);

// Writes bytes to path; returns true on success.
bool test_write_file(const char* path, const void* bytes, size_t size);

// One run of the servelab binary ($SERVELAB_BIN, else bin/servelab) with
// `arguments` (shell words), stdin empty, stdout and stderr captured.
typedef struct command_result {
    int exit_status; // -1 when killed by a signal
    char* out;       // stdout (malloc'ed, never NULL)
    char* err;       // stderr (malloc'ed, never NULL)
} command_result;

command_result run_servelab(const char* arguments);
void free_result(command_result* result);

// ---- tmux, for tests that drive a program in a real terminal ----------------
// Each test uses its own server (tmux -L socket), so nothing reaches the
// user's sessions.

// Skips the test, naming the program, when `program` is not on the PATH
// (fails when CI is set: make test-deps installs the tests' programs).
void test_require_program(const char* program);
// Skips the test when tmux is missing (fails when CI is set: make test-deps installs it).
void test_tmux_require(void);
// Runs `tmux -L socket arguments`, output discarded; returns system()'s status.
int test_tmux(const char* socket, const char* arguments);
// The output of `tmux -L socket arguments` (malloc'ed, "" on failure).
char* test_tmux_output(const char* socket, const char* arguments);
// Polls pane `target` until it shows `text`, for up to timeout_ms; returns the
// capture (malloc'ed), or fails the test with the last capture.
char* test_tmux_wait_for_text(const char* socket, const char* target, const char* text, int timeout_ms);
// True while pane `target` is on the alternate screen (a full-screen program holds it).
bool test_tmux_alternate_screen_on(const char* socket, const char* target);
// Starts `sh -c command` with its stdout on a pipe (the child is killed
// when the test process dies) and reads that stdout until it names the
// local address, "127.0.0.1:PORT" followed by another character, or until
// timeout_s passes (the sanitizer build loads slowly: give it 60). Returns
// PORT, or 0 when none came; *pid gets the child either way and what was
// read is in line (line_capacity bytes, NUL-terminated). stdout_fd NULL:
// the pipe is closed (a child that writes more gets SIGPIPE); else it stays
// open, *stdout_fd gets its read end and the caller closes it.
int test_spawn_until_port(const char* command, double timeout_s, int* pid, int* stdout_fd, char* line,
                          size_t line_capacity);

void test_sleep_ms(int ms);

// ---- decoding through the engine ----------------------------------------------

struct model;

// What test_engine_generate saw of its one sequence.
typedef struct test_generation {
    int n_generated;               // ids written to out_ids (a stop token is not one of them)
    int stop;                      // the sequence's stop_reason: STOP_LENGTH, STOP_EOS, ...
    int n_decode_steps;            // steps after the prompt's, one token each
    kernel_traffic decode_traffic; // the kernels' counts, summed over those steps
} test_generation;

// Runs one request through a fresh engine until it finishes and copies its
// generated ids into out_ids (room for max_new_tokens). prompt_ids:
// (n_prompt) ids, BOS first. temperature 0 is greedy; top_p 0 is off. The
// KV cache is fp32, as llama2.c keeps it, so greedy ids equal its goldens
// bit for bit. An engine error fails the test.
test_generation test_engine_generate(const struct model* m, const int32_t* prompt_ids, int n_prompt,
                                     int max_new_tokens, float temperature, float top_p, uint64_t seed,
                                     int32_t* out_ids);

// A random fp32 model of stories260K's exact shape (dim 64, hidden 172, 5
// layers, 8 query heads, 4 KV heads, vocab 512, 512 positions; llama2.c
// stores it in fp32), the same on every run: for tests of shapes, splits,
// bytes and quantization error that do not need stories260K's trained
// weights, so they run in a clone without ../shared. Its weights are plain
// normals (sigma 1/sqrt(d_in), unit norm gains), without the synthetic
// presets' outlier channels (model_synth.h): those make a per-channel int8
// grid coarse on a 64-wide model (top-1 agreement 68% for w8a16), where a
// trained model's weights keep 99%.
void test_synthesize_stories260k_shape(struct model* out);

struct engine;
struct sequence;

// The engine's own sequence `id`, read from its scheduler (an engine test
// may look inside; lab/ sees engine_sequence_status only). NULL for an id
// never handed out or released (a released sequence has no tokens).
const struct sequence* test_sequence(const struct engine* e, int32_t id);

// Says why a test is skipped: the first time in a test binary, the file and
// the two ways to get it (`make models`, or ../shared/models beside the
// clone); after that, only the file. Fails instead when CI is set.
void test_report_missing_shared(const char* name);

// Resolves a shared model file into `path_buffer` or skips (fails under CI).
#define REQUIRE_SHARED_MODEL(path_buffer, name)                                                                        \
    do {                                                                                                               \
        if (!shared_model_path((path_buffer), sizeof(path_buffer), (name))) {                                          \
            test_report_missing_shared(name);                                                                          \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

#endif
