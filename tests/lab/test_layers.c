// The layers point one way (docs/design.md): base/ includes nothing of the
// project's above it; kernels/ only base/ and kernels/; engine/ never lab/;
// lab/ only the engine's public headers, listed below with the reason lab
// needs each; and in lab/lesson/ the lab module's parts (api_*.c) see the
// host only through lab/lesson/api.h; lab/ never names the engine's
// scheduler nor its sequence type. Every quoted #include of every .c, .h, .cu and .cuh file
// under base/, kernels/, engine/ and lab/ is read; a violation names the
// file, the line and the header (or the text).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

// What lab/ may include from engine/, and why.
static const char* const ENGINE_PUBLIC[] = {
    "engine/engine.h",        // the engine: configure, add requests, step, cancel, free
    "engine/step_record.h",   // what a step did: the one window the dashboard and lessons read
    "engine/kv_layout.h",     // paged or contiguous: a configuration choice
    "engine/model.h",         // a model's configuration and weights, to load and describe it
    "engine/model_synth.h",   // synthetic presets by name (tiny, small, ...) for a clone without models
    "engine/model_write.h",   // `synth` writes a checkpoint
    "engine/model_quant.h",   // quantizing a whole model (quant command, lab.quantize_model)
    "engine/model_eval.h",    // perplexity and KL of a model against another (quant command, lab.compare)
    "engine/reference_forward.h", // the forward pass written apart from the engine's (lab.reference_logits)
    "engine/quant.h",         // the quantizer on one matrix and its error statistics (lab.quantize)
    "engine/tokenizer.h",     // text to ids and back
    "engine/gguf.h",          // info prints a GGUF file's container
    "engine/gguf_model.h",    // loading a model from GGUF
    "engine/gguf_vocab.h",    // loading a tokenizer from GGUF
    "engine/chat_template.h", // the server's and info's chat prompts
    "engine/sampler.h",       // the sampler's seeded generator (lab.time's prompts, calibration)
    "engine/devices.h",       // device models: "how long on that card"
    "engine/fault.h",         // the faults --fault and the lesson runner switch on
    "engine/output_file.h",   // files written whole or not at all (traces, exports)
    "engine/kv_memory.h",     // the KV bytes of a slot and a block (calc, info); bench times attention on it
    "engine/forward.h",       // calibration and bench run the forward pass on one sequence, outside an engine
    NULL,
};

static bool listed(const char* header, const char* const* list) {
    for (const char* const* p = list; *p; p++)
        if (strcmp(*p, header) == 0) return true;
    return false;
}

static bool starts_with(const char* text, const char* prefix) { return strncmp(text, prefix, strlen(prefix)) == 0; }

static bool is_source(const char* name) {
    const char* dot = strrchr(name, '.');
    return dot && (strcmp(dot, ".c") == 0 || strcmp(dot, ".h") == 0 || strcmp(dot, ".cu") == 0 || strcmp(dot, ".cuh") == 0);
}

// A rule: given the including file and the included path, the reason it
// is forbidden, or NULL when it is allowed.
typedef const char* (*include_rule)(const char* file, const char* header);

// A rule on every line's text: why the line is forbidden, or NULL.
typedef const char* (*line_rule)(const char* line);

typedef struct scan {
    include_rule rule;
    line_rule text_rule; // or NULL: no rule on the text
    int files;      // source files read
    int includes;   // quoted includes seen
    int violations;
} scan;

static void scan_file(scan* s, const char* path) {
    FILE* f = fopen(path, "r");
    assert_non_null(f);
    s->files++;
    char line[1024];
    for (int number = 1; fgets(line, sizeof line, f); number++) {
        const char* text_why = s->text_rule ? s->text_rule(line) : NULL;
        if (text_why) {
            fprintf(stderr, "%s:%d: %s: %s", path, number, text_why, line);
            s->violations++;
        }
        const char* c = line;
        while (*c == ' ' || *c == '\t') c++;
        if (*c++ != '#') continue;
        while (*c == ' ' || *c == '\t') c++;
        if (!starts_with(c, "include")) continue;
        c += strlen("include");
        while (*c == ' ' || *c == '\t') c++;
        if (*c++ != '"') continue; // <system headers> are not the project's
        const char* end = strchr(c, '"');
        if (!end) continue;
        char header[512];
        snprintf(header, sizeof header, "%.*s", (int)(end - c), c);
        s->includes++;
        const char* why = s->rule(path, header);
        if (why) {
            fprintf(stderr, "%s:%d: includes \"%s\": %s\n", path, number, header, why);
            s->violations++;
        }
    }
    fclose(f);
}

static void scan_folder(scan* s, const char* folder) {
    DIR* dir = opendir(folder);
    assert_non_null(dir); // tests run from the repository root
    struct dirent* entry;
    while ((entry = readdir(dir))) {
        if (entry->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) scan_folder(s, path);
        else if (S_ISREG(st.st_mode) && is_source(entry->d_name)) scan_file(s, path);
    }
    closedir(dir);
}

// Scans `folder` with `rule`, and every line with `text_rule` (NULL:
// none); fails on any violation, or when the folder held no includes
// at all (a scan of nothing proves nothing).
static void check_folder_text(const char* folder, include_rule rule, line_rule text_rule) {
    scan s = {rule, text_rule, 0, 0, 0};
    scan_folder(&s, folder);
    fprintf(stderr, "%s: %d files, %d project includes, %d against the layers\n", folder, s.files, s.includes,
            s.violations);
    assert_true(s.files > 0);
    assert_true(s.includes > 0);
    assert_int_equal(s.violations, 0);
}

static void check_folder(const char* folder, include_rule rule) { check_folder_text(folder, rule, NULL); }

// ---- the rules ---------------------------------------------------------------------------------

static const char* base_rule(const char* file, const char* header) {
    (void)file;
    return starts_with(header, "base/") ? NULL : "base/ is the bottom layer: it includes only base/";
}

static const char* kernels_rule(const char* file, const char* header) {
    (void)file;
    if (starts_with(header, "engine/")) return "kernels/ do arithmetic only: they never include engine/";
    if (starts_with(header, "lab/")) return "kernels/ never include lab/";
    if (starts_with(header, "base/") || starts_with(header, "kernels/")) return NULL;
    // A header beside the file (a .cu's own .cuh) names no folder.
    return strchr(header, '/') ? "kernels/ include only base/ and kernels/" : NULL;
}

static const char* engine_rule(const char* file, const char* header) {
    (void)file;
    return starts_with(header, "lab/") ? "engine/ never includes lab/: the engine never draws, reads keys or runs Lua"
                                       : NULL;
}

static const char* lab_rule(const char* file, const char* header) {
    (void)file;
    if (starts_with(header, "engine/") && !listed(header, ENGINE_PUBLIC))
        return "not one of the engine's public headers (tests/lab/test_layers.c lists them)";
    return NULL;
}

// The dashboard (lab/ui) and the Lua host (lab/lesson) see the engine
// through its record: not even the public headers that run the forward
// pass or lay out KV memory outside an engine.
static const char* const WINDOW_ONLY_EXCLUDED[] = {"engine/forward.h", "engine/kv_memory.h", NULL};

static const char* window_rule(const char* file, const char* header) {
    const char* why = lab_rule(file, header);
    if (why) return why;
    if (listed(header, WINDOW_ONLY_EXCLUDED))
        return "the dashboard and the Lua host read the step record, not the forward pass or KV memory";
    return NULL;
}

// The lesson room has no circle: the lab module's parts (api_*.c) see the
// host through lab/lesson/api.h, never the lesson's struct in internal.h.
static const char* lesson_parts_rule(const char* file, const char* header) {
    const char* name = strrchr(file, '/');
    name = name ? name + 1 : file;
    if (starts_with(name, "api") && strcmp(header, "lab/lesson/internal.h") == 0)
        return "the lab module's parts include lab/lesson/api.h, not the host's internals";
    return NULL;
}

static void test_base_includes_only_base(void** state) {
    (void)state;
    check_folder("base", base_rule);
}

static void test_kernels_include_no_engine_or_lab(void** state) {
    (void)state;
    check_folder("kernels", kernels_rule);
}

static void test_engine_includes_no_lab(void** state) {
    (void)state;
    check_folder("engine", engine_rule);
}

static void test_lab_includes_only_public_engine_headers(void** state) {
    (void)state;
    check_folder("lab", lab_rule);
}

static void test_dashboard_and_lua_host_see_the_record(void** state) {
    (void)state;
    check_folder("lab/ui", window_rule);
    check_folder("lab/lesson", window_rule);
}

// The engine's scheduler holds its queues and sequences; lab/ sees them only
// through step records (engine_step, engine_view, engine_snapshot), which
// also follow adds and cancels between steps.
static const char* scheduler_rule(const char* line) {
    return strstr(line, "->scheduler") || strstr(line, ".scheduler")
               ? "names the scheduler: lab/ reads the queues and sequences from step records"
               : NULL;
}

// The KV pool is the engine's too: lab/ reads its block counts from the
// record (engine_snapshot carries them), as serve's /health does.
static const char* pool_rule(const char* line) {
    return strstr(line, "->pool.") || strstr(line, "e.pool.") || strstr(line, "engine.pool.")
               ? "reads the engine's KV pool: lab/ reads block counts from step records (engine_snapshot)"
               : NULL;
}

static void test_lab_reads_the_pool_from_the_record(void** state) {
    (void)state;
    check_folder_text("lab", lab_rule, pool_rule);
}

static void test_lab_reads_queues_from_the_record(void** state) {
    (void)state;
    check_folder_text("lab", lab_rule, scheduler_rule);
}

static bool is_word_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

// True when the word that ends just before `at` (spaces skipped) is `word`.
static bool preceded_by(const char* line, const char* at, const char* word) {
    const char* end = at;
    while (end > line && (end[-1] == ' ' || end[-1] == '\t')) end--;
    size_t length = strlen(word);
    if ((size_t)(end - line) < length || strncmp(end - length, word, length) != 0) return false;
    return end - length == line || !is_word_char(end[-length - 1]);
}

// The engine's sequence struct is its own: lab/ reads a sequence as a
// step_sequence_status (engine_sequence_status, the record's live list).
// Named as a type: `sequence*`, `struct sequence`, `const sequence`, or a
// declaration opening a line with `sequence name`. The word alone (prose,
// a field called sequence) is no type.
static const char* sequence_type_rule(const char* line) {
    const char* first = line + strspn(line, " \t");
    for (const char* w = strstr(line, "sequence"); w; w = strstr(w + 1, "sequence")) {
        const char* after = w + strlen("sequence");
        if ((w > line && (is_word_char(w[-1]) || w[-1] == '.' || w[-1] == '>')) || is_word_char(*after)) continue;
        const char* next = after + strspn(after, " \t");
        if (*next == '*' || (w == first && is_word_char(*next)) || preceded_by(line, w, "struct") ||
            preceded_by(line, w, "const"))
            return "names the engine's sequence type: lab/ reads a sequence as a step_sequence_status";
    }
    return NULL;
}

static void test_lab_never_names_the_sequence_type(void** state) {
    (void)state;
    check_folder_text("lab", lab_rule, sequence_type_rule);
}

static void test_lesson_parts_see_only_the_api_header(void** state) {
    (void)state;
    check_folder("lab/lesson", lesson_parts_rule);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_includes_only_base),
        cmocka_unit_test(test_kernels_include_no_engine_or_lab),
        cmocka_unit_test(test_engine_includes_no_lab),
        cmocka_unit_test(test_lab_includes_only_public_engine_headers),
        cmocka_unit_test(test_dashboard_and_lua_host_see_the_record),
        cmocka_unit_test(test_lab_reads_queues_from_the_record),
        cmocka_unit_test(test_lab_reads_the_pool_from_the_record),
        cmocka_unit_test(test_lab_never_names_the_sequence_type),
        cmocka_unit_test(test_lesson_parts_see_only_the_api_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
