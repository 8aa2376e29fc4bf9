// The commands the README and docs/*.md mark runnable work on a fresh
// clone (issue 47): each runs from a directory laid out like the clone
// (its files linked in) with no models/ and no ../shared beside it, so the
// default model is the `small` preset, under a time limit. A failure names
// the file, the line and the command.
//
// A block is runnable when the line before its ```sh fence is
// `<!-- runnable -->` (or the fence reads ```sh runnable). Each line of it is
// one command (a line ending in `\` continues on the next); comment lines
// and blank lines are skipped.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/test_support.h"

// 120 s: `generate --model medium` builds 100M parameters in 7-11 s alone,
// and this machine's two cores are shared; a command that hangs is what
// the limit is for.
#define COMMAND_LIMIT_S 120

typedef struct runnable_command {
    char file[128];
    int line;        // of the command's first line
    char text[2048]; // continuation lines joined
} runnable_command;

typedef struct command_list {
    runnable_command* items;
    int count, capacity;
} command_list;

static void add_command(command_list* list, const char* file, int line, const char* text) {
    if (list->count == list->capacity) {
        list->capacity = list->capacity ? 2 * list->capacity : 32;
        list->items = realloc(list->items, (size_t)list->capacity * sizeof *list->items);
        assert_non_null(list->items);
    }
    runnable_command* c = &list->items[list->count++];
    snprintf(c->file, sizeof c->file, "%s", file);
    c->line = line;
    snprintf(c->text, sizeof c->text, "%s", text);
}

static bool starts_with(const char* text, const char* prefix) { return strncmp(text, prefix, strlen(prefix)) == 0; }

static const char* skip_spaces(const char* text) {
    while (*text == ' ' || *text == '\t')
        text++;
    return text;
}

// Appends the runnable commands of one markdown file; returns how many blocks were marked.
static int extract_commands(const char* path, command_list* list) {
    char* text = test_read_text(path);
    int n_blocks = 0, line_number = 0;
    bool in_block = false, in_fence = false, marked = false;
    char pending[2048] = "";
    int pending_line = 0;
    for (char* line = text; line && *line;) {
        char* newline = strchr(line, '\n');
        if (newline) *newline = '\0';
        line_number++;
        const char* body = skip_spaces(line);
        if (starts_with(body, "```")) {
            if (in_fence) {
                if (in_block && pending[0]) fail_msg("%s:%d: a runnable command ends in '\\'", path, pending_line);
                in_fence = in_block = false;
            } else {
                in_fence = true;
                in_block = (marked && strcmp(body, "```sh") == 0) || strcmp(body, "```sh runnable") == 0;
                if (marked && !in_block)
                    fail_msg("%s:%d: <!-- runnable --> before a block that is not ```sh", path, line_number);
                n_blocks += in_block;
            }
            marked = false;
        } else if (in_block) {
            if (pending[0] == '\0' && (body[0] == '\0' || body[0] == '#')) {
                // a blank or comment line
            } else {
                if (pending[0] == '\0') pending_line = line_number;
                size_t length = strlen(body);
                bool continues = length > 0 && body[length - 1] == '\\';
                size_t used = strlen(pending);
                snprintf(pending + used, sizeof pending - used, "%.*s%s", (int)(continues ? length - 1 : length), body,
                         continues ? " " : "");
                if (!continues) {
                    add_command(list, path, pending_line, pending);
                    pending[0] = '\0';
                }
            }
        } else if (!in_fence) {
            marked = strcmp(body, "<!-- runnable -->") == 0;
        }
        line = newline ? newline + 1 : NULL;
    }
    free(text);
    return n_blocks;
}

// out = "a/b"; a path too long for out fails the test.
static void join_path(char* out, size_t capacity, const char* a, const char* b) {
    int written = snprintf(out, capacity, "%s/%s", a, b);
    if (written < 0 || (size_t)written >= capacity) fail_msg("path too long: %s/%s", a, b);
}

// A directory shaped like a fresh clone: every top-level entry of the
// repository linked in except models/, build/ and bin/ (bin/servelab is the
// binary under test), inside a parent with no shared/ beside it.
static void make_clone(char* clone, size_t capacity) {
    char parent[PATH_MAX], scratch[PATH_MAX], root[PATH_MAX];
    assert_non_null(realpath(test_scratch_dir(), scratch));
    assert_non_null(getcwd(root, sizeof root));
    join_path(parent, sizeof parent, scratch, "readme");
    mkdir(parent, 0755);
    join_path(clone, capacity, parent, "clone");
    mkdir(clone, 0755);
    DIR* dir = opendir(root);
    assert_non_null(dir);
    for (struct dirent* entry; (entry = readdir(dir));) {
        const char* name = entry->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strcmp(name, "models") == 0 ||
            strcmp(name, "build") == 0 || strcmp(name, "bin") == 0 || strcmp(name, ".git") == 0)
            continue;
        char target[PATH_MAX * 2], link_path[PATH_MAX * 2];
        snprintf(target, sizeof target, "%s/%s", root, name);
        snprintf(link_path, sizeof link_path, "%s/%s", clone, name);
        if (symlink(target, link_path) != 0) fail_msg("symlink %s: failed", link_path);
    }
    closedir(dir);
    char bin_dir[PATH_MAX * 2], binary[PATH_MAX], link_path[PATH_MAX * 2];
    snprintf(bin_dir, sizeof bin_dir, "%s/bin", clone);
    mkdir(bin_dir, 0755);
    if (!realpath(test_servelab_binary(), binary)) fail_msg("no servelab binary at %s", test_servelab_binary());
    join_path(link_path, sizeof link_path, bin_dir, "servelab");
    if (symlink(binary, link_path) != 0) fail_msg("symlink %s: failed", link_path);
    // What a fresh clone lacks.
    struct stat st;
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/models", clone);
    assert_int_not_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/../shared", clone);
    assert_int_not_equal(stat(path, &st), 0);
}

// Runs one command in the clone under the limit; fails naming where it came from.
static void run_in_clone(const char* clone, const runnable_command* c) {
    char script[PATH_MAX * 2], out[PATH_MAX * 2], shell[PATH_MAX * 8];
    snprintf(script, sizeof script, "%s/../command.sh", clone);
    snprintf(out, sizeof out, "%s/../command.out", clone);
    FILE* file = fopen(script, "w");
    assert_non_null(file);
    fprintf(file, "%s\n", c->text);
    fclose(file);
    snprintf(shell, sizeof shell, "cd '%s' && timeout -k 5 %d sh '%s' >'%s' 2>&1 </dev/null", clone, COMMAND_LIMIT_S,
             script, out);
    int raw = system(shell);
    int status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    if (status != 0) {
        char* output = test_read_text(out);
        size_t length = strlen(output);
        fail_msg("%s:%d: exit status %d%s from\n  %s\nlast output:\n%s", c->file, c->line, status,
                 status == 124 ? " (over the time limit)" : "", c->text, output + (length > 1500 ? length - 1500 : 0));
    }
    print_message("ok %s:%d: %s\n", c->file, c->line, c->text);
}

static void collect(command_list* list, int* readme_blocks) {
    *readme_blocks = extract_commands("README.md", list);
    DIR* dir = opendir("docs");
    assert_non_null(dir);
    for (struct dirent* entry; (entry = readdir(dir));) {
        size_t length = strlen(entry->d_name);
        if (length < 4 || strcmp(entry->d_name + length - 3, ".md") != 0) continue;
        char path[512];
        snprintf(path, sizeof path, "docs/%s", entry->d_name);
        extract_commands(path, list);
    }
    closedir(dir);
}

// Every runnable command is one a fresh clone can run: the binary under
// test or a bounded wrapper of it, and no file the clone lacks.
static void test_runnable_commands_are_fresh_clone_commands(void** state) {
    (void)state;
    command_list list = {0};
    int readme_blocks = 0;
    collect(&list, &readme_blocks);
    assert_true(readme_blocks >= 4); // the tour: dashboard, lesson, quiz, serve
    for (int i = 0; i < list.count; i++) {
        const runnable_command* c = &list.items[i];
        if (!starts_with(c->text, "bin/servelab") && !starts_with(c->text, "timeout "))
            fail_msg("%s:%d: a runnable command starts with bin/servelab or timeout: %s", c->file, c->line, c->text);
        if (strstr(c->text, "models/") || strstr(c->text, "../shared"))
            fail_msg("%s:%d: a runnable command names a file a fresh clone lacks: %s", c->file, c->line, c->text);
    }
    free(list.items);
}

static void test_runnable_commands_succeed_without_models(void** state) {
    (void)state;
    command_list list = {0};
    int readme_blocks = 0;
    collect(&list, &readme_blocks);
    char clone[PATH_MAX];
    make_clone(clone, sizeof clone);
    for (int i = 0; i < list.count; i++)
        run_in_clone(clone, &list.items[i]);
    print_message("%d runnable commands passed\n", list.count);
    free(list.items);
}

// Every relative link of a markdown file (`folder`: where the file lies,
// "" or "docs/") names a file that exists.
static void check_links(const char* file, const char* folder) {
    char* text = test_read_text(file);
    for (const char* p = text; (p = strstr(p, "](")); p += 2) {
        const char* target = p + 2;
        size_t length = strcspn(target, ")# ");
        if (starts_with(target, "http") || length == 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s%.*s", folder, (int)length, target);
        struct stat st;
        if (stat(path, &st) != 0) fail_msg("%s links to %.*s, which does not exist", file, (int)length, target);
    }
    free(text);
}

// Every page the README and docs/ link to exists, and every topic page of docs/ is
// linked from the README (the manual moved there, so nothing is lost from
// a newcomer's view), and the README stays short.
static void test_readme_links_and_length(void** state) {
    (void)state;
    char* readme = test_read_text("README.md");
    int lines = 0;
    for (const char* p = readme; *p; p++)
        lines += *p == '\n';
    if (lines > 210) fail_msg("README.md has %d lines; the manual belongs in docs/", lines);
    check_links("README.md", "");
    DIR* dir = opendir("docs");
    assert_non_null(dir);
    for (struct dirent* entry; (entry = readdir(dir));) {
        size_t length = strlen(entry->d_name);
        if (length < 4 || strcmp(entry->d_name + length - 3, ".md") != 0) continue;
        char page[512], link[512];
        snprintf(page, sizeof page, "docs/%s", entry->d_name);
        check_links(page, "docs/");
        snprintf(link, sizeof link, "](docs/%s)", entry->d_name);
        if (!strstr(readme, link)) fail_msg("README.md does not link to docs/%s", entry->d_name);
    }
    closedir(dir);
    free(readme);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_links_and_length),
        cmocka_unit_test(test_runnable_commands_are_fresh_clone_commands),
        cmocka_unit_test(test_runnable_commands_succeed_without_models),
    };
    return cmocka_run_group_tests_name("lab/cmd/readme_commands", tests, NULL, NULL);
}
