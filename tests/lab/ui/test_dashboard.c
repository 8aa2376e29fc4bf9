// The dashboard through its headless replay (servelab lab --keys ...
// --dump-frame): what the panes say after real engine steps on stories260K.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "engine/model_synth.h"
#include "engine/quant.h"
#include "engine/tokenizer.h"
#include "lab/common/model_source.h"
#include "tests/test_support.h"

// Runs the lab headless with `arguments` and returns the dumped frame (malloc'ed).
static char* dump_frame(const char* arguments) {
    char frame_path[512], command[4096];
    snprintf(frame_path, sizeof frame_path, "%s/frame.txt", test_scratch_dir());
    remove(frame_path);
    snprintf(command, sizeof command, "%s lab --size 160x50 --dump-frame %s %s </dev/null >/dev/null", test_servelab_binary(),
             frame_path, arguments);
    assert_int_equal(system(command), 0);
    char* text = test_read_text(frame_path);
    assert_non_null(text);
    assert_true(text[0] != '\0'); // the frame was written
    return text;
}

static int prompt_tokens(const char* text) {
    char path[512];
    assert_true(shared_model_path(path, sizeof path, "tok512.bin"));
    tokenizer* t = NULL;
    error_info err = {{0}};
    assert_int_equal(tok_load(&t, path, 512, &err), 0);
    int32_t ids[256];
    int n = 0;
    assert_int_equal(tok_encode(t, text, true, false, ids, 256, &n, &err), 0);
    tok_free(t);
    return n;
}

static void spaces(char* out, int n) {
    out[0] = '\0';
    for (int i = 0; i < n; i++) strcat(out, "<space>");
}

static void test_block_table_after_steps(void** state) {
    (void)state;
    char model_path[512], arguments[2048], keys[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    const char* prompt = "Once upon a time, there was a little girl named Lily.";
    int n_prompt = prompt_tokens(prompt);
    for (int n_steps = 1; n_steps <= 25; n_steps += 8) {
        spaces(keys, n_steps);
        snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --prompt '%s' --keys '%s'", model_path, prompt,
                 keys);
        char* frame = dump_frame(arguments);
        // Step 1 computes the prompt; each later step one more token.
        int context = n_prompt + n_steps - 1;
        int blocks = (context + 15) / 16, tail = context - 16 * (blocks - 1);
        char expect[128];
        snprintf(expect, sizeof expect, "a#0 %s ctx %d blocks %d tail %d/16", n_steps == 1 ? "prefill" : "decode",
                 context, blocks, tail);
        if (!strstr(frame, expect)) fail_msg("missing '%s' in\n%s", expect, frame);
        // The pool pane agrees: one sequence, its blocks in use, the rest free.
        snprintf(expect, sizeof expect, "used %d shared 0 cached 0 free %d /128", blocks, 128 - blocks);
        if (!strstr(frame, expect)) fail_msg("missing '%s' in\n%s", expect, frame);
        free(frame);
    }
}

static void test_fork_shares_then_copies(void** state) {
    (void)state;
    char model_path[512], arguments[2048];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    // 18 tokens computed after 3 steps: one full block and a tail of 2,
    // shared by parent and child right after the fork; the next step writes
    // token 19 in both, so the first writer copies the tail.
    snprintf(arguments, sizeof arguments,
             "--model %s --block-size 16 --prompt 'Once upon a time, there was a little girl named Lily.' "
             "--keys '<space><space><space>f<space>'",
             model_path);
    char* frame = dump_frame(arguments);
    // The samples share the full block (reference count 2 among the tables)
    // and the first one to write its tail copies it: copy-on-write.
    if (!strstr(frame, " x2]")) fail_msg("no block with reference count 2 in\n%s", frame);
    if (!strstr(frame, "COW 1->2(a)")) fail_msg("no copy-on-write event in\n%s", frame);
    if (!strstr(frame, "  [0 x2][2]") || !strstr(frame, "  [0 x2][1]"))
        fail_msg("parent and child do not share block 0 with private tails in\n%s", frame);
    if (!strstr(frame, "used 3 shared 1 ")) fail_msg("pool counts do not show the shared block in\n%s", frame);
    free(frame);
}

static void test_shared_system_prompt_requests(void** state) {
    (void)state;
    char model_path[512], arguments[2048];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    // Two `p` requests: a 37-token system prompt plus a follow-up each, so
    // both tables start with the same two full blocks of 16.
    snprintf(arguments, sizeof arguments,
             "--model %s --block-size 16 --prompt 'The dog ran' --keys 'pp<space><space><space>'", model_path);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "  [1 x2][2 x2][3]")) fail_msg("first p request does not share two blocks in\n%s", frame);
    if (!strstr(frame, "  [1 x2][2 x2][4]")) fail_msg("second p request does not share the same blocks in\n%s", frame);
    if (!strstr(frame, "used 5 shared 2 ")) fail_msg("pool counts do not show the two shared blocks in\n%s", frame);
    // Headless replays do not measure the machine unless asked.
    if (!strstr(frame, "this CPU: not measured")) fail_msg("no machine line in\n%s", frame);
    free(frame);
}

// Writes a lesson into the scratch folder and returns its path (static buffer).
static const char* write_lesson(const char* name, const char* source) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_scratch_dir(), name);
    assert_true(test_write_file(path, source, strlen(source)));
    return path;
}

// The header says the lab's own engines (not the lesson's) took one step;
// the model's label in between is whatever model_source calls it.
static bool lab_engines_at_step_1(const char* frame) {
    const char* end = strchr(frame, '\n');
    const char* step = strstr(frame, "  step 1  ");
    const char* lesson = strstr(frame, "(the lesson's engine)");
    return strncmp(frame, "servelab lab  ", 14) == 0 && step && step < end && !(lesson && lesson < end);
}

static void test_lesson_runs_in_the_dashboard(void** state) {
    (void)state;
    const char* lesson = write_lesson(
        "pane-lesson.lua",
        "lab.lesson{title = 'pane', claims = {'k1'}}\n"
        "local e = lab.engine{model = 'tiny', block_size = 4, num_blocks = 16}\n"
        "e:add{prompt = 'abcdef', max_tokens = 4}\n"
        "local r = e:step()\n"
        "lab.say('prefilled ' .. r.prefill_tokens .. ' tokens')\n"
        "lab.pause()\n"
        "e:step()\n"
        "lab.check{id = 'k1', claim = 'one decode token', expected = true, verdict = e:totals().decode_tokens == 1,\n"
        "          evidence = 'decode tokens ' .. e:totals().decode_tokens}\n"
        "lab.pause()\n");
    char arguments[2048];
    // One space: the lesson runs to its first pause; the panes draw its engine.
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space>'", lesson);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "prefilled 7 tokens")) fail_msg("no narration in\n%s", frame);
    if (!strstr(frame, "paused: space continues the lesson")) fail_msg("not paused in\n%s", frame);
    if (!strstr(frame, "(the lesson's engine)  step 1 ")) fail_msg("header does not follow the lesson in\n%s", frame);
    if (!strstr(frame, "ctx 7 blocks 2 tail 3/4")) fail_msg("block tables do not show the lesson's engine in\n%s", frame);
    free(frame);
    // Two more: the check, then the end; a fourth returns to the lab's own engines.
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space><space><space>'", lesson);
    frame = dump_frame(arguments);
    // The line wraps in the pane after "measured: decode".
    if (!strstr(frame, "PASS k1 \"one decode token\": TRUE, as the lesson expects") || !strstr(frame, "tokens 1"))
        fail_msg("no check line in\n%s", frame);
    if (!strstr(frame, "done: 1 passed, 0 failed")) fail_msg("no summary in\n%s", frame);
    free(frame);
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space><space><space><space><space>'",
             lesson);
    frame = dump_frame(arguments);
    if (!lab_engines_at_step_1(frame)) fail_msg("the lab's engines did not step after the lesson in\n%s",
                                                          frame);
    free(frame);
}

static void test_broken_lessons_leave_the_lab_running(void** state) {
    (void)state;
    char arguments[2048];
    const char* syntax = write_lesson("syntax.lua", "lab.lesson{title = 'x', claims = {'k'}}\nlocal = 3\n");
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space>'", syntax);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "syntax.lua:2:")) fail_msg("the syntax error is not named with its line in\n%s", frame);
    if (!lab_engines_at_step_1(frame)) fail_msg("the lab did not step in\n%s", frame);
    free(frame);
    const char* runtime = write_lesson("runtime.lua",
                                       "lab.lesson{title = 'x', claims = {'k'}}\nlab.say('before')\nerror('boom')\n");
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space><space>'", runtime);
    frame = dump_frame(arguments);
    if (!strstr(frame, "runtime.lua:3: boom")) fail_msg("the error is not shown in\n%s", frame);
    if (!strstr(frame, "failed: 0 passed, 1 failed")) fail_msg("no failure summary in\n%s", frame);
    // The first space ran the lesson into its error; the second stepped the lab.
    if (!lab_engines_at_step_1(frame)) fail_msg("the lab did not come back in\n%s", frame);
    free(frame);
}

static void test_quiz_page_in_the_lab(void** state) {
    (void)state;
    char home[600], cwd[256], arguments[512];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(home, sizeof home, "%s/%s/quiz-home", cwd, test_scratch_dir());
    char command[700];
    snprintf(command, sizeof command, "rm -rf '%s'", home);
    assert_int_equal(system(command), 0);
    setenv("XDG_DATA_HOME", home, 1);
    // z opens the quiz in place of the panes; a wrong answer is graded.
    snprintf(arguments, sizeof arguments, "--model tiny --quiz-seed 3 --keys 'z0<enter>'");
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "servelab quiz   question 1 of 10   right 0  wrong 1"))
        fail_msg("the quiz page did not grade the answer in\n%s", frame);
    free(frame);
    assert_int_equal(system(command), 0);
    // Esc goes back to the lab, which says what was saved where.
    snprintf(arguments, sizeof arguments, "--model tiny --quiz-seed 3 --keys 'z0<enter><esc>'");
    frame = dump_frame(arguments);
    if (!strstr(frame, "quiz: 0 right, 1 wrong; progress saved to ")) fail_msg("no quiz summary in\n%s", frame);
    if (!strstr(frame, "1 Requests")) fail_msg("the panes are not back in\n%s", frame);
    free(frame);
    char progress[700];
    snprintf(progress, sizeof progress, "%s/servelab/progress", home);
    char* saved = test_read_text(progress);
    assert_true(saved[0] != '\0');
    free(saved);
    unsetenv("XDG_DATA_HOME");
}

// The lab's quiz page passes the arrows on: a graded feedback too long for
// a 50x16 terminal scrolls down a row, and the frame says there is more above.
static void test_quiz_page_scrolls_in_the_lab(void** state) {
    (void)state;
    char home[600], cwd[256], command[700];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(home, sizeof home, "%s/%s/quiz-scroll-home", cwd, test_scratch_dir());
    snprintf(command, sizeof command, "rm -rf '%s'", home);
    assert_int_equal(system(command), 0);
    setenv("XDG_DATA_HOME", home, 1);
    char* frames = dump_frame("--model tiny --quiz-seed 3 --keys 'z0<enter><resize:50x16><frame><down><frame>'");
    unsetenv("XDG_DATA_HOME");
    // The frames in order: after the resize, after <down>, and the last.
    const char* first = strstr(frames, "more below (");
    const char* after_down = first ? strstr(first, "more above (") : NULL;
    if (!first || !after_down) fail_msg("the feedback did not scroll with <down> in\n%s", frames);
    const char* first_frame_end = strstr(frames, "more below (");
    if (strstr(frames, "more above (") < first_frame_end) fail_msg("more above before any scrolling in\n%s", frames);
    free(frames);
}

static void test_step_size_matches_quantizer(void** state) {
    (void)state;
    char model_path[512], arguments[2048];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model_source source;
    model_request request = {model_path, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
    error_info err = {{0}};
    assert_int_equal(model_source_open(&source, &request, &err), 0);
    // The pane after <down> (layer 1) and b (5 bits), asymmetric per tensor.
    const weight_matrix* w = model_matrix_by_name(&source.model, "layers.1.wq");
    assert_non_null(w);
    size_t count = (size_t)w->rows * (size_t)w->cols;
    float* values = malloc(count * sizeof *values);
    int32_t* codes = malloc(count * sizeof *codes);
    for (int r = 0; r < w->rows; r++) weight_row_to_f32(values + (size_t)r * (size_t)w->cols, w, r, NULL);
    quant_scheme scheme = {5, false, QUANT_PER_TENSOR, 32, false};
    quant_params params;
    assert_int_equal(quant_matrix_rtn(values, w->rows, w->cols, &scheme, codes, &params, &err), 0);
    char expect[128];
    snprintf(expect, sizeof expect, "s=%.6g z=%d", params.scale, params.zero_point);
    snprintf(arguments, sizeof arguments, "--model %s --keys '44<down>b'", model_path);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "layers.1.wq (64 x 64)  b=5 asym per-tensor")) fail_msg("wrong tensor or scheme in\n%s", frame);
    if (!strstr(frame, expect)) fail_msg("missing '%s' in\n%s", expect, frame);
    free(frame);
    free(values);
    free(codes);
    model_source_close(&source);
}

static void test_small_terminal_and_bad_keys(void** state) {
    (void)state;
    char* frame = dump_frame("--model tiny --size 60x20");
    assert_non_null(strstr(frame, "terminal too small: need at least 80x24"));
    free(frame);
    frame = dump_frame("--model tiny --size 80x24 --keys '3'");
    assert_non_null(strstr(frame, "3 Memory traffic"));
    assert_null(strstr(frame, "1 Requests"));
    free(frame);
    char command[1024];
    snprintf(command, sizeof command, "%s lab --model tiny --keys '<nope>' --dump-frame - >/dev/null 2>&1",
             test_servelab_binary());
    int raw = system(command);
    assert_int_equal(WEXITSTATUS(raw), 2);
}


// Runs the lab headless at `size` and returns the frame (malloc'ed).
static char* dump_frame_at(const char* size, const char* arguments) {
    char frame_path[512], command[4096];
    snprintf(frame_path, sizeof frame_path, "%s/frame.txt", test_scratch_dir());
    remove(frame_path);
    snprintf(command, sizeof command, "%s lab --size %s --dump-frame %s %s </dev/null >/dev/null 2>&1",
             test_servelab_binary(), size, frame_path, arguments);
    if (system(command) != 0) fail_msg("failed: %s", command);
    char* text = test_read_text(frame_path);
    assert_non_null(text);
    return text;
}

// Random weights write gibberish: the first screen says how to get real ones,
// at the smallest size too; a real checkpoint gets no such line.
static void test_first_screen_says_weights_are_random(void** state) {
    (void)state;
    char* frame = dump_frame_at("80x24", "--model tiny --keys ''");
    if (!strstr(frame, "random weights: `make models` fetches stories260K (or --model PATH)"))
        fail_msg("no word on the random weights in\n%s", frame);
    free(frame);
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(arguments, sizeof arguments, "--model %s --keys ''", model_path);
    frame = dump_frame_at("80x24", arguments);
    assert_null(strstr(frame, "random weights"));
    free(frame);
}

static void test_cancelled_request_says_cancelled(void** state) {
    (void)state;
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    snprintf(arguments, sizeof arguments, "--model %s --keys '<space>x<space>'", model_path);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, ">a#0 cancelled ")) fail_msg("the cancelled request does not say so in\n%s", frame);
    if (!strstr(frame, "cancelled 1")) fail_msg("the counts do not show the cancellation in\n%s", frame);
    free(frame);
}

static void test_block_size_change_keeps_forks_and_cancellations(void** state) {
    (void)state;
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    // Fork a#0 (c#2), cancel a#0, then restart with block size 32 and step once.
    snprintf(arguments, sizeof arguments,
             "--model %s --block-size 16 --keys '<space><space>f<space><up><up>x]y<space>'", model_path);
    char* frame = dump_frame_at("250x70", arguments);
    if (!strstr(frame, "block size 32")) fail_msg("no restart in\n%s", frame);
    if (!strstr(frame, "a#0 cancelled ")) fail_msg("the restart brought the cancelled a#0 back in\n%s", frame);
    if (!strstr(frame, "c#2 decode ") && !strstr(frame, "c#2 prefill ") && !strstr(frame, "c#2 waiting "))
        fail_msg("the fork c#2 is gone in\n%s", frame);
    if (!strstr(frame, "fork of a#0")) fail_msg("c#2 is no longer a fork of a#0 in\n%s", frame);
    free(frame);
}

static void test_keys_wait_behind_too_small(void** state) {
    (void)state;
    char model_path[512], arguments[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    // Steps and a block-size restart typed at 60x20 must not happen.
    snprintf(arguments, sizeof arguments, "--model %s --keys '<space><space>]y?<resize:160x50>'", model_path);
    char* frame = dump_frame_at("60x20", arguments);
    if (!strstr(frame, "  step 0  ") || !strstr(frame, "block size 16")) fail_msg("keys acted behind the message:\n%s", frame);
    if (strstr(frame, "Help (any key closes)")) fail_msg("the help opened behind the message:\n%s", frame);
    free(frame);
    // q still quits (the resize and the steps after it never come).
    snprintf(arguments, sizeof arguments, "--model %s --keys 'q<resize:160x50><space>'", model_path);
    frame = dump_frame_at("60x20", arguments);
    if (!strstr(frame, "terminal too small: need at least 80x24")) fail_msg("q did not quit at once:\n%s", frame);
    free(frame);
}

static void set_quiz_home(const char* name) {
    char home[600], cwd[256], command[700];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(home, sizeof home, "%s/%s/%s", cwd, test_scratch_dir(), name);
    snprintf(command, sizeof command, "rm -rf '%s'", home);
    assert_int_equal(system(command), 0);
    setenv("XDG_DATA_HOME", home, 1);
}

static void test_quiz_says_when_too_small(void** state) {
    (void)state;
    set_quiz_home("quiz-small");
    // The quiz page open, then the terminal shrinks to 40x9: the question does not fit.
    char* frame = dump_frame_at("160x50", "--model tiny --quiz-seed 3 --keys 'z<resize:40x9>'");
    if (!strstr(frame, "terminal too small: need at least 40x")) fail_msg("no size asked for in\n%s", frame);
    free(frame);
    // An answer typed blind is not graded.
    frame = dump_frame_at("160x50", "--model tiny --quiz-seed 3 --keys 'z<resize:40x9>0<enter><resize:160x50>'");
    if (!strstr(frame, "right 0  wrong 0")) fail_msg("an answer typed behind the message was graded:\n%s", frame);
    free(frame);
    unsetenv("XDG_DATA_HOME");
}

static void test_quiz_save_failure_is_told(void** state) {
    (void)state;
    // Nothing can be created under /proc: the progress file cannot be written
    // (it is missing at load, which is a first run).
    setenv("XDG_DATA_HOME", "/proc/servelab-test-no-such-folder", 1);
    char* frame = dump_frame_at("160x50", "--model tiny --quiz-seed 3 --keys 'z0<enter><esc>'");
    if (strstr(frame, "progress saved to")) fail_msg("claims a save that failed:\n%s", frame);
    if (!strstr(frame, "progress NOT saved")) fail_msg("does not say the save failed:\n%s", frame);
    free(frame);
    unsetenv("XDG_DATA_HOME");
}

static void test_lesson_pane_scrolls_back(void** state) {
    (void)state;
    const char* lesson = write_lesson(
        "scroll.lua",
        "lab.lesson{title = 'scroll', claims = {'k1'}}\n"
        "for i = 1, 20 do lab.say('narration line ' .. i) end\n"
        "lab.check{id = 'k1', claim = 'a check whose line is long enough to wrap over several rows of the "
        "lesson pane, so that its beginning could be lost', expected = true, verdict = true,\n"
        "          evidence = 'with evidence that goes on and on: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16'}\n"
        "lab.pause()\n"
        "for i = 1, 5 do lab.say('after the pause ' .. i) end\n"
        "lab.pause()\n");
    char arguments[2048];
    // Following the newest: the check shows from its start, the early narration is above.
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space>'", lesson);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "PASS k1 \"a check whose line")) fail_msg("the check lost its beginning in\n%s", frame);
    if (strstr(frame, "narration line 1\n") || strstr(frame, "narration line 1 ")) fail_msg("no scrolling needed?\n%s", frame);
    free(frame);
    // PgUp reaches the first lines, and says there is more below.
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup>'", lesson);
    frame = dump_frame(arguments);
    if (!strstr(frame, "narration line 1 ")) fail_msg("PgUp does not reach the first line in\n%s", frame);
    if (!strstr(frame, "v more below (PgDn)")) fail_msg("no mark of the lines below in\n%s", frame);
    free(frame);
    // Lines that arrive while scrolled back are counted on the mark.
    snprintf(arguments, sizeof arguments, "--model tiny --lesson %s --keys '<space><pgup><space>'", lesson);
    frame = dump_frame(arguments);
    if (!strstr(frame, "v 5 new lines below (PgDn)")) fail_msg("no new-lines mark in\n%s", frame);
    free(frame);
    // PgDn to the end follows the newest lines again.
    snprintf(arguments, sizeof arguments,
             "--model tiny --lesson %s --keys '<space><pgup><space><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn>'", lesson);
    frame = dump_frame(arguments);
    if (!strstr(frame, "after the pause 5")) fail_msg("PgDn did not reach the newest line in\n%s", frame);
    if (strstr(frame, "below (PgDn)")) fail_msg("still marked at the end in\n%s", frame);
    free(frame);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_table_after_steps),
        cmocka_unit_test(test_fork_shares_then_copies),
        cmocka_unit_test(test_step_size_matches_quantizer),
        cmocka_unit_test(test_small_terminal_and_bad_keys),
        cmocka_unit_test(test_shared_system_prompt_requests),
        cmocka_unit_test(test_lesson_runs_in_the_dashboard),
        cmocka_unit_test(test_broken_lessons_leave_the_lab_running),
        cmocka_unit_test(test_quiz_page_in_the_lab),
        cmocka_unit_test(test_quiz_page_scrolls_in_the_lab),
        cmocka_unit_test(test_cancelled_request_says_cancelled),
        cmocka_unit_test(test_first_screen_says_weights_are_random),
        cmocka_unit_test(test_block_size_change_keeps_forks_and_cancellations),
        cmocka_unit_test(test_keys_wait_behind_too_small),
        cmocka_unit_test(test_quiz_says_when_too_small),
        cmocka_unit_test(test_quiz_save_failure_is_told),
        cmocka_unit_test(test_lesson_pane_scrolls_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
