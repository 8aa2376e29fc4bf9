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

#include "engine/devices.h"
#include "engine/kv_memory.h"
#include "engine/model_synth.h"
#include "engine/quant.h"
#include "engine/tokenizer.h"
#include "lab/common/model_source.h"
#include "lab/ui/dashboard.h"
#include "lab/ui/layout.h"
#include "lab/ui/panes.h"
#include "lab/ui/screen.h"
#include "tests/test_support.h"

// Runs the lab headless with `arguments` and returns the dumped frame (malloc'ed).
static char* dump_frame(const char* arguments) {
    char frame_path[512], command[4096];
    snprintf(frame_path, sizeof frame_path, "%s/frame.txt", test_scratch_dir());
    remove(frame_path);
    snprintf(command, sizeof command, "%s lab --size 160x50 --dump-frame %s %s </dev/null >/dev/null",
             test_servelab_binary(), frame_path, arguments);
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
    for (int i = 0; i < n; i++)
        strcat(out, "<space>");
}

static void test_block_table_after_steps(void** state) {
    (void)state;
    char model_path[512], arguments[2048], keys[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    const char* prompt = "Once upon a time, there was a little girl named Lily.";
    int n_prompt = prompt_tokens(prompt);
    for (int n_steps = 1; n_steps <= 25; n_steps += 8) {
        spaces(keys, n_steps);
        snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --prompt '%s' --keys '%s'", model_path,
                 prompt, keys);
        char* frame = dump_frame(arguments);
        // Step 1 computes the prompt; each later step one more token.
        int context = n_prompt + n_steps - 1;
        int blocks = (context + 15) / 16, tail = context - 16 * (blocks - 1);
        char expect[128];
        // The phase is the sequence's state now, as on its Requests row:
        // after step 1 the prompt is in the cache and the next step decodes.
        snprintf(expect, sizeof expect, "a#0 decode ctx %d blocks %d tail %d/16", context, blocks, tail);
        if (!strstr(frame, expect)) fail_msg("missing '%s' in\n%s", expect, frame);
        // The pool pane agrees: one sequence, its blocks in use, the rest free.
        snprintf(expect, sizeof expect, "used %d shared 0 cached 0 free %d /128", blocks, 128 - blocks);
        if (!strstr(frame, expect)) fail_msg("missing '%s' in\n%s", expect, frame);
        free(frame);
    }
}

// Speculative decoding with a W4A16 draft: each table's cells say what the
// step drafted, accepted, rejected and gave as a bonus, and mark the
// rollback. The marks are checked against what they must agree with: the
// rejected guesses are the slots rolled back (r == N in "~N@P"), they sat
// right after the kept tokens (P == the table's ctx), accepted + rejected
// == drafted, a bonus only when nothing was rejected, and a freed block
// "~[b]" is one the table no longer holds, past the last slot kept. The
// traffic pane splits the draft's bytes from the target's.
static void test_speculation_marks_rollback(void** state) {
    (void)state;
    char model_path[512], arguments[2048], keys[1024];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    int rollbacks = 0, freed_blocks = 0;
    for (int n_steps = 2; n_steps <= 14; n_steps += 3) {
        spaces(keys, n_steps);
        snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --speculative draft:w4a16:g32:k4 --keys '%s'",
                 model_path, keys);
        char* frame = dump_frame(arguments);
        if (!strstr(frame, "draft ") || !strstr(frame, " + target "))
            fail_msg("no draft/target split in the traffic pane:\n%s", frame);
        for (const char* line = strstr(frame, "decode ctx "); line; line = strstr(line + 1, "decode ctx ")) {
            int ctx = 0, blocks = 0, drafted = 0, accepted = 0, rejected = 0, bonus = 0;
            if (sscanf(line, "decode ctx %d blocks %d", &ctx, &blocks) != 2) continue;
            const char* cells = strchr(line, '\n');
            assert_non_null(cells);
            const char* guesses = strstr(cells, " d");
            const char* end = strchr(cells + 1, '\n');
            if (!guesses || guesses > end) continue; // a prefill step: nothing drafted
            if (sscanf(guesses, " d%d a%d r%d b%d", &drafted, &accepted, &rejected, &bonus) != 4)
                fail_msg("unreadable guesses cell '%.40s' in\n%s", guesses, frame);
            assert_int_equal(accepted + rejected, drafted);
            assert_true(bonus == (rejected == 0 ? 1 : 0));
            const char* mark = strstr(cells, "~");
            if (rejected == 0) {
                if (mark && mark < end) fail_msg("a rollback mark with nothing rejected:\n%s", frame);
                continue;
            }
            int slots = 0, first = 0;
            if (!mark || mark > end || sscanf(mark, "~%d@%d", &slots, &first) != 2)
                fail_msg("%d rejected but no ~N@P mark:\n%s", rejected, frame);
            assert_int_equal(slots, rejected);
            assert_int_equal(first, ctx);
            rollbacks++;
            for (const char* b = strstr(mark, "~["); b && b < end; b = strstr(b + 1, "~[")) {
                int block = atoi(b + 2);
                char held[32];
                snprintf(held, sizeof held, "[%d]", block);
                const char* still = strstr(cells, held);
                if (still && still < mark) fail_msg("block %d marked freed but still in the table:\n%s", block, frame);
                // Freed blocks held only rejected slots: the kept ones fit in `blocks` blocks.
                assert_true((ctx + 15) / 16 == blocks);
                freed_blocks++;
            }
        }
        free(frame);
    }
    print_message("%d rollbacks seen, %d freed blocks\n", rollbacks, freed_blocks);
    assert_true(rollbacks >= 3);
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
    // The pane is headed by the lesson's declared title, then its file.
    if (!strstr(frame, "pane (") || !strstr(frame, "pane-lesson.lua)")) fail_msg("no lesson title in\n%s", frame);
    if (!strstr(frame, "paused: space continues the lesson")) fail_msg("not paused in\n%s", frame);
    if (!strstr(frame, "(the lesson's engine)  step 1 ")) fail_msg("header does not follow the lesson in\n%s", frame);
    if (!strstr(frame, "ctx 7 blocks 2 tail 3/4"))
        fail_msg("block tables do not show the lesson's engine in\n%s", frame);
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
    if (!lab_engines_at_step_1(frame)) fail_msg("the lab's engines did not step after the lesson in\n%s", frame);
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
    const char* runtime =
        write_lesson("runtime.lua", "lab.lesson{title = 'x', claims = {'k'}}\nlab.say('before')\nerror('boom')\n");
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
    // z opens the quiz in place of the panes; a wrong answer is graded (seed 3 asks tf4 first, whose answer is
    // false).
    snprintf(arguments, sizeof arguments, "--model tiny --quiz-seed 3 --keys 'zt<enter>'");
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "servelab quiz   question 1 of 10   right 0  wrong 1"))
        fail_msg("the quiz page did not grade the answer in\n%s", frame);
    free(frame);
    assert_int_equal(system(command), 0);
    // Esc goes back to the lab, which says what was saved where.
    snprintf(arguments, sizeof arguments, "--model tiny --quiz-seed 3 --keys 'zt<enter><esc>'");
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
    char* frames = dump_frame("--model tiny --quiz-seed 3 --keys 'zt<enter><resize:50x16><frame><down><frame>'");
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
    for (int r = 0; r < w->rows; r++)
        weight_row_to_f32(values + (size_t)r * (size_t)w->cols, w, r, NULL);
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
    if (!strstr(frame, "  step 0  ") || !strstr(frame, "block size 16"))
        fail_msg("keys acted behind the message:\n%s", frame);
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
    frame = dump_frame_at("160x50", "--model tiny --quiz-seed 3 --keys 'z<resize:40x9>t<enter><resize:160x50>'");
    if (!strstr(frame, "right 0  wrong 0")) fail_msg("an answer typed behind the message was graded:\n%s", frame);
    free(frame);
    unsetenv("XDG_DATA_HOME");
}

static void test_quiz_save_failure_is_told(void** state) {
    (void)state;
    // Nothing can be created under /proc: the progress file cannot be written
    // (it is missing at load, which is a first run).
    setenv("XDG_DATA_HOME", "/proc/servelab-test-no-such-folder", 1);
    char* frame = dump_frame_at("160x50", "--model tiny --quiz-seed 3 --keys 'zt<enter><esc>'");
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
    if (strstr(frame, "narration line 1\n") || strstr(frame, "narration line 1 "))
        fail_msg("no scrolling needed?\n%s", frame);
    free(frame);
    // PgUp reaches the first lines, and says there is more below.
    snprintf(arguments, sizeof arguments,
             "--model tiny --lesson %s --keys "
             "'<space><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup><pgup>'",
             lesson);
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
    snprintf(
        arguments, sizeof arguments,
        "--model tiny --lesson %s --keys '<space><pgup><space><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn><pgdn>'",
        lesson);
    frame = dump_frame(arguments);
    if (!strstr(frame, "after the pause 5")) fail_msg("PgDn did not reach the newest line in\n%s", frame);
    if (strstr(frame, "below (PgDn)")) fail_msg("still marked at the end in\n%s", frame);
    free(frame);
}

// ---- panes drawn in this process -------------------------------------------------------

// The lab's dashboard on stories260K (two requests, 128 blocks of 16) after
// `steps` steps, with this machine's figures set to fixed ones (62.1 GB/s,
// 448 GFLOP/s: a ridge of 7.21 FLOP/B) so the traffic pane draws them.
static void open_dashboard(dashboard* d, const char* model_path, int steps) {
    model_request request = {model_path, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
    engine_config config = engine_config_default();
    config.block_size = 16;
    config.num_blocks = 128;
    error_info err = {{0}};
    if (dashboard_init(d, &request, &config, KV_LAYOUT_PAGED, &err)) fail_msg("%s", err.message);
    d->max_new_tokens = 64;
    assert_int_equal(
        dashboard_add_prompt(d, "Once upon a time, there was a little girl named Lily.", 64, 1, 0.0f, &err), 0);
    assert_int_equal(dashboard_add_prompt(d, "The dog ran", 64, 1, 0.0f, &err), 0);
    for (int i = 0; i < steps; i++)
        assert_int_equal(dashboard_step(d, &err), 0);
    machine_figures* m = calloc(1, sizeof *m);
    assert_non_null(m);
    atomic_init(&m->owners, 1); // the dashboard's alone: dashboard_free frees it
    m->bandwidth_gb_s = 62.1;
    m->peak_gflop_s = 448.0;
    atomic_init(&m->measured, true);
    d->machine = m;
}

// Row y of the screen as UTF-8 text, trailing spaces kept.
static void screen_row(const ui_screen* s, int y, char* out, size_t size) {
    out[0] = '\0';
    for (int x = 0; x < s->cols; x++)
        strncat(out, s->cells[y * s->cols + x].text, size - strlen(out) - 1);
}

// The text of rows [r.y, r.y + r.h) between columns r.x and r.x + r.w, one line each.
static void screen_rect(const ui_screen* s, ui_rect r, char* out, size_t size) {
    out[0] = '\0';
    for (int y = r.y; y < r.y + r.h; y++) {
        for (int x = r.x; x < r.x + r.w; x++)
            strncat(out, s->cells[y * s->cols + x].text, size - strlen(out) - 1);
        strncat(out, "\n", size - strlen(out) - 1);
    }
}

// Both ridges on the traffic pane name their machine, at every size that
// shows the pane (60 to 100 columns in the grid, 80 to 149 as a page) and
// for every device model: the CPU's as "CPU ridge N", the device's as
// "vs NAME ridge N" with the device's name or its short form.
static void test_ridges_name_their_machine(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    static dashboard d;
    open_dashboard(&d, model_path, 2);
    // 150x50 is the narrowest grid (a 60-column pane); 149x30 the widest page.
    static const int SIZES[][2] = {{80, 24},  {100, 30}, {120, 40}, {149, 30},
                                   {150, 50}, {160, 50}, {200, 60}, {250, 70}};
    int n_devices = 0;
    const device_model* devices = device_models(&n_devices);
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 80, 24, true, false), 0);
    static char pane[64 * 1024];
    for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++)
        for (int device = 0; device < n_devices; device++) {
            assert_int_equal(ui_screen_resize(&screen, SIZES[k][0], SIZES[k][1]), 0);
            ui_view v = {0};
            v.page = ui_pane_page(PANE_TRAFFIC);
            v.device = device;
            ui_draw(&screen, &d, &v);
            ui_layout l = ui_layout_compute(SIZES[k][0], SIZES[k][1], v.page);
            assert_true(l.visible[PANE_TRAFFIC]);
            if (SIZES[k][0] == 150) assert_int_equal(l.panes[PANE_TRAFFIC].w, 60); // the pane's minimum
            screen_rect(&screen, l.panes[PANE_TRAFFIC], pane, sizeof pane);
            // "CPU ridge 7.21" (or 7.2, 7 where the pane is narrow).
            const char* cpu = strstr(pane, "; CPU ridge 7");
            if (!cpu) fail_msg("%dx%d: the CPU's ridge is not named in\n%s", SIZES[k][0], SIZES[k][1], pane);
            char name[64], expect_long[128], expect_short[128];
            snprintf(name, sizeof name, "%s", devices[device].name);
            if (strchr(name, ' ') && strncmp(name, "RTX", 3) != 0) *strchr(name, ' ') = '\0';
            double ridge = devices[device].peak_fp16_flops / devices[device].bandwidth_bytes_per_s;
            snprintf(expect_long, sizeof expect_long, " vs %s ridge %.0f", devices[device].name, ridge);
            snprintf(expect_short, sizeof expect_short, " vs %s ridge %.0f", name, ridge);
            if (!strstr(pane, expect_long) && !strstr(pane, expect_short))
                fail_msg("%dx%d: no '%s' (or '%s') in\n%s", SIZES[k][0], SIZES[k][1], expect_long, expect_short, pane);
            // No other ridge: every "ridge" is one of the two above.
            int n_ridges = 0;
            for (const char* p = pane; (p = strstr(p, "ridge")) != NULL; p++)
                n_ridges++;
            if (n_ridges != 2) fail_msg("%dx%d: %d ridges in\n%s", SIZES[k][0], SIZES[k][1], n_ridges, pane);
        }
    ui_screen_free(&screen);
    dashboard_free(&d);
}

// The help overlay leaves nothing of the panes beside it: every cell
// between the header and the key bar outside its box is blank (a pane
// showing past the box had "block size 1" for 16 cut by its frame).
static void test_help_blanks_the_panes(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    static dashboard d;
    open_dashboard(&d, model_path, 1);
    static const int SIZES[][2] = {{80, 24}, {120, 30}, {160, 50}, {250, 70}};
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 80, 24, true, false), 0);
    char row[4096];
    for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++) {
        assert_int_equal(ui_screen_resize(&screen, SIZES[k][0], SIZES[k][1]), 0);
        ui_view v = {0};
        v.help = true;
        ui_draw(&screen, &d, &v);
        ui_layout l = ui_layout_compute(SIZES[k][0], SIZES[k][1], 0);
        // The box: the corners nearest its title "Help (any key closes)" (a
        // pane's frame may be drawn on either side of it).
        int box_x = -1, box_y = -1, box_right = -1, box_bottom = -1, title_x = -1;
        for (int y = 1; y < l.key_bar.y && box_y < 0; y++)
            for (int x = 0; x + 4 < screen.cols && box_y < 0; x++)
                if (strcmp(screen.cells[y * screen.cols + x].text, "H") == 0 &&
                    strcmp(screen.cells[y * screen.cols + x + 1].text, "e") == 0 &&
                    strcmp(screen.cells[y * screen.cols + x + 2].text, "l") == 0 &&
                    strcmp(screen.cells[y * screen.cols + x + 3].text, "p") == 0 &&
                    strcmp(screen.cells[y * screen.cols + x + 4].text, " ") == 0)
                    title_x = x, box_y = y;
        assert_true(box_y > 0);
        for (int x = title_x; x >= 0 && box_x < 0; x--)
            if (strcmp(screen.cells[box_y * screen.cols + x].text, "\u250c") == 0) box_x = x;
        for (int x = title_x; x < screen.cols && box_right < 0; x++)
            if (strcmp(screen.cells[box_y * screen.cols + x].text, "\u2510") == 0) box_right = x;
        for (int y = box_y; y < l.key_bar.y && box_bottom < 0; y++)
            if (box_x >= 0 && strcmp(screen.cells[y * screen.cols + box_x].text, "\u2514") == 0) box_bottom = y;
        assert_true(box_x >= 0 && box_right > box_x && box_bottom > box_y);
        for (int y = 1; y < l.key_bar.y; y++)
            for (int x = 0; x < screen.cols; x++) {
                bool in_box = x >= box_x && x <= box_right && y >= box_y && y <= box_bottom;
                if (in_box || strcmp(screen.cells[y * screen.cols + x].text, " ") == 0) continue;
                screen_row(&screen, y, row, sizeof row);
                fail_msg("%dx%d: a pane shows beside the help at (%d,%d): '%s'", SIZES[k][0], SIZES[k][1], x, y, row);
            }
    }
    ui_screen_free(&screen);
    dashboard_free(&d);
}

// The phase word of `id` on the Requests rows (" a#0 decode  ...") and on
// the Block tables lines ("a#0 decode ctx ..."); "" when not shown.
static void pane_phase(const char* pane, const char* label, bool table, char* out, size_t size) {
    out[0] = '\0';
    for (const char* p = pane; (p = strstr(p, label)) != NULL; p++) {
        const char* word = p + strlen(label);
        if (*word != ' ') continue;
        while (*word == ' ')
            word++;
        size_t n = strcspn(word, " \n");
        if (table && strncmp(word + n, " ctx ", 5) != 0) continue;
        if (!table && (p == pane || (p[-1] != ' ' && p[-1] != '>'))) continue;
        snprintf(out, size, "%.*s", (int)n, word);
        return;
    }
}

// Requests and Block tables give each sequence the same phase: after a
// prefill step, right after a fork, after a cancel and one step later.
static void test_panes_agree_on_phase(void** state) {
    (void)state;
    char model_path[512];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    static dashboard d;
    open_dashboard(&d, model_path, 1);
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 160, 50, true, false), 0);
    static char requests[32 * 1024], tables[32 * 1024];
    error_info err = {{0}};
    int compared = 0;
    for (int stage = 0; stage < 4; stage++) {
        if (stage == 1) assert_int_equal(dashboard_fork_selected(&d, &err), 0); // a#0 forked into c#2
        if (stage == 2) {
            d.selected = 1;
            assert_int_equal(dashboard_cancel_selected(&d, &err), 0); // b#1 cancelled
        }
        if (stage == 3) assert_int_equal(dashboard_step(&d, &err), 0);
        ui_view v = {0};
        ui_draw(&screen, &d, &v);
        ui_layout l = ui_layout_compute(160, 50, 0);
        screen_rect(&screen, l.panes[PANE_REQUESTS], requests, sizeof requests);
        screen_rect(&screen, l.panes[PANE_BLOCK_TABLES], tables, sizeof tables);
        for (int id = 0; id < 3; id++) {
            char label[16], in_requests[32], in_tables[32];
            snprintf(label, sizeof label, "%c#%d", 'a' + id, id);
            pane_phase(requests, label, false, in_requests, sizeof in_requests);
            pane_phase(tables, label, true, in_tables, sizeof in_tables);
            if (!in_tables[0]) continue; // not in the last step's record (a fork before its first step)
            if (strcmp(in_requests, in_tables) != 0)
                fail_msg("stage %d: %s is '%s' in Requests but '%s' in Block tables:\n%s\n%s", stage, label,
                         in_requests, in_tables, requests, tables);
            compared++;
        }
    }
    assert_true(compared >= 7); // a#0 and b#1 at stages 0-2, and c#2 too at stage 3
    ui_screen_free(&screen);
    dashboard_free(&d);
}

// Every key of the bar shows whole, at 80x24 and at each width up to the
// grid's (two rows below UI_KEY_BAR_ONE_ROW_COLS, one from it).
static void test_key_bar_shows_every_key(void** state) {
    (void)state;
    static const char* const KEYS[] = {
        "spc step",  "r run",  "+/- speed", "a add",    "p shared",         "f fork", "x cancel",
        "[/] block", "z quiz", "Tab focus", "1-5 page", "PgUp/PgDn lesson", "? help", "q quit"};
    static dashboard d;
    model_request request = {"tiny", NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
    engine_config config = engine_config_default();
    config.num_blocks = 128;
    error_info err = {{0}};
    assert_int_equal(dashboard_init(&d, &request, &config, KV_LAYOUT_PAGED, &err), 0);
    ui_screen screen;
    assert_int_equal(ui_screen_init(&screen, 80, 24, true, false), 0);
    char bar[2048], row[1024];
    for (int cols = 80; cols < 150; cols++) {
        assert_int_equal(ui_screen_resize(&screen, cols, 24), 0);
        ui_view v = {0};
        ui_draw(&screen, &d, &v);
        ui_layout l = ui_layout_compute(cols, 24, 0);
        assert_int_equal(l.mode, LAYOUT_PAGES);
        assert_int_equal(l.key_bar.h, cols < UI_KEY_BAR_ONE_ROW_COLS ? 2 : 1);
        bar[0] = '\0';
        for (int y = l.key_bar.y; y < l.key_bar.y + l.key_bar.h; y++) {
            screen_row(&screen, y, row, sizeof row);
            strcat(bar, row);
            strcat(bar, "\n");
        }
        for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++)
            if (!strstr(bar, KEYS[k])) fail_msg("%dx24: the key bar lost '%s':\n%s", cols, KEYS[k], bar);
        // And the panes end above it.
        for (int p = 0; p < PANE_COUNT; p++)
            if (l.visible[p]) assert_true(l.panes[p].y + l.panes[p].h <= l.key_bar.y);
    }
    ui_screen_free(&screen);
    dashboard_free(&d);
}

// A block-size restart keeps the KV memory: blocks = bytes / (block_size x
// bytes per slot), from the model's shapes, not the 128 blocks kept.
static void test_block_size_change_keeps_kv_memory(void** state) {
    (void)state;
    char model_path[512], arguments[1024], expect[256];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    model_source source;
    model_request request = {model_path, NULL, MODEL_DTYPE_DEFAULT, SYNTH_DEFAULT_SEED, NULL};
    error_info err = {{0}};
    assert_int_equal(model_source_open(&source, &request, &err), 0);
    kv_dtype dtype = engine_config_default().kv_dtype;
    uint64_t kv_bytes = 128 * kv_memory_block_bytes(&source.model.config, dtype, 16); // the lab's 128 blocks of 16
    static const struct {
        const char* keys;
        int block_size;
    } CASES[] = {{"]", 32}, {"[", 8}};
    int n_blocks[2];
    for (int k = 0; k < 2; k++)
        n_blocks[k] = (int)(kv_bytes / kv_memory_block_bytes(&source.model.config, dtype, CASES[k].block_size));
    model_source_close(&source);
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        int bs = CASES[k].block_size, blocks = n_blocks[k];
        assert_int_equal(blocks * bs, 2048); // the same slots: 2048 = 128 x 16
        // The question says what the pool becomes.
        snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --keys '%s'", model_path, CASES[k].keys);
        char* frame = dump_frame(arguments);
        snprintf(expect, sizeof expect, "block size %d: same KV memory, %d blocks x %d = 2048 slots? (y/n)", bs, blocks,
                 bs);
        if (!strstr(frame, expect)) fail_msg("missing '%s' in\n%s", expect, frame);
        free(frame);
        // The restarted pool: that many blocks, the same slots in both engines.
        snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --keys '%sy<space>'", model_path,
                 CASES[k].keys);
        frame = dump_frame(arguments);
        snprintf(expect, sizeof expect, " /%d", blocks);
        if (!strstr(frame, expect)) fail_msg("the pool is not %d blocks in\n%s", blocks, frame);
        if (!strstr(frame, "slots in pool: paged 2048, contiguous 2048")) fail_msg("the slots changed in\n%s", frame);
        free(frame);
    }
}

// What the lab says after f, against what the engine then does: the
// parent (scheduled first) copies the shared tail, the child keeps it.
static void test_fork_message_names_the_copier(void** state) {
    (void)state;
    char model_path[512], arguments[2048];
    REQUIRE_SHARED_MODEL(model_path, "stories260K.bin");
    const char* keys = "<space><space><space>f";
    snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --keys '%s'", model_path, keys);
    char* frame = dump_frame(arguments);
    if (!strstr(frame, "forked a#0 into c#2, sharing 2 blocks: next step a#0 (run first) copies the shared tail"))
        fail_msg("the fork does not say who copies in\n%s", frame);
    free(frame);
    snprintf(arguments, sizeof arguments, "--model %s --block-size 16 --keys '%s<space>'", model_path, keys);
    frame = dump_frame(arguments);
    // The copy is a#0's (the letter in brackets), and its table holds the copy.
    const char* cow = strstr(frame, " COW ");
    int from = -1, to = -1;
    char who = 0;
    if (!cow || sscanf(cow, " COW %d->%d(%c)", &from, &to, &who) != 3) fail_msg("no COW event in\n%s", frame);
    if (who != 'a') fail_msg("the copy was made by %c, not a#0, in\n%s", who, frame);
    // Each table's cells are on the row under its line: a#0 ends in the copy, c#2 in the original.
    static const struct {
        const char* line;
        bool copy;
    } HOLDERS[] = {{"a#0 decode ctx ", true}, {"c#2 decode ctx ", false}};
    for (int k = 0; k < 2; k++) {
        const char* line = strstr(frame, HOLDERS[k].line);
        const char* cells = line ? strchr(line, '\n') : NULL;
        char last[32];
        snprintf(last, sizeof last, "x2][%d]", HOLDERS[k].copy ? to : from);
        const char* end = cells ? strchr(cells + 1, '\n') : NULL;
        const char* found = cells ? strstr(cells, last) : NULL;
        if (!found || found > end)
            fail_msg("%stable should end in block %d in\n%s", HOLDERS[k].line, HOLDERS[k].copy ? to : from, frame);
    }
    free(frame);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_table_after_steps),
        cmocka_unit_test(test_speculation_marks_rollback),
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
        cmocka_unit_test(test_ridges_name_their_machine),
        cmocka_unit_test(test_help_blanks_the_panes),
        cmocka_unit_test(test_panes_agree_on_phase),
        cmocka_unit_test(test_key_bar_shows_every_key),
        cmocka_unit_test(test_block_size_change_keeps_kv_memory),
        cmocka_unit_test(test_fork_message_names_the_copier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
