#include "lab/common/cli_args.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static const char* command_name;

void arg_set_command_name(const char* name) { command_name = name; }

const char* arg_command_name(void) { return command_name; }

int arg_edit_distance(const char* a, const char* b) {
    int n = (int)strnlen(a, 31), m = (int)strnlen(b, 31);
    int previous[32], current[32];
    for (int j = 0; j <= m; j++)
        previous[j] = j;
    for (int i = 1; i <= n; i++) {
        current[0] = i;
        for (int j = 1; j <= m; j++) {
            int substitute = previous[j - 1] + (a[i - 1] != b[j - 1]);
            int remove = previous[j] + 1, insert = current[j - 1] + 1;
            current[j] =
                substitute < remove ? (substitute < insert ? substitute : insert) : (remove < insert ? remove : insert);
        }
        memcpy(previous, current, sizeof current);
    }
    return previous[m];
}

const char* arg_nearest(const char* word, const char* const* candidates, int n, int max_edits) {
    const char* best = NULL;
    int best_distance = max_edits + 1;
    for (int i = 0; i < n; i++) {
        int distance = arg_edit_distance(word, candidates[i]);
        if (distance < best_distance) {
            best_distance = distance;
            best = candidates[i];
        }
    }
    if (best || strlen(word) < 2) return best;
    for (int i = 0; i < n; i++)
        if (strncmp(candidates[i], word, strlen(word)) == 0) return candidates[i];
    return NULL;
}

// The flags tried on one argument (argv[index] of one cursor): every flag
// of the command, once no flag matched. 96: more than any command has (sim
// with the engine's flags: about 40).
static struct {
    const arg_cursor* cursor;
    int index;
    const char* flags[96];
    int count;
} tried;

static void remember_flag(const arg_cursor* cursor, const char* flag) {
    if (tried.cursor != cursor || tried.index != cursor->index) {
        tried.cursor = cursor;
        tried.index = cursor->index;
        tried.count = 0;
    }
    for (int i = 0; i < tried.count; i++)
        if (strcmp(tried.flags[i], flag) == 0) return;
    if (tried.count < (int)(sizeof tried.flags / sizeof tried.flags[0])) tried.flags[tried.count++] = flag;
}

bool arg_match(arg_cursor* cursor, const char* flag, bool takes_value, bool* failed, error_info* err) {
    remember_flag(cursor, flag);
    const char* arg = cursor->argv[cursor->index];
    size_t flag_length = strlen(flag);
    if (strncmp(arg, flag, flag_length) != 0) return false;
    if (arg[flag_length] == '=' && takes_value) {
        cursor->value = arg + flag_length + 1;
        return true;
    }
    if (arg[flag_length] != '\0') return false;
    if (!takes_value) return true;
    if (cursor->index + 1 >= cursor->argc) {
        error_set(err, "%s: %s needs a value", cursor->command, flag);
        *failed = true;
        return true;
    }
    cursor->index++;
    cursor->value = cursor->argv[cursor->index];
    return true;
}

bool arg_is_help(const char* arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int arg_unknown(const arg_cursor* cursor, error_info* err) {
    const char* command = cursor->command;
    const char* second_space = strchr(command, ' ');
    if (second_space) second_space = strchr(second_space + 1, ' ');
    int top_length = second_space ? (int)(second_space - command) : (int)strlen(command);
    const char* arg = cursor->argv[cursor->index];
    // "--temprature=0.5" is compared without its value; "-x" and plain words
    // are not options that lost a letter, but "-temperature" may be.
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)strcspn(arg, "="), arg);
    bool known_here = tried.cursor == cursor && tried.index == cursor->index;
    const char* suggestion =
        known_here && arg[0] == '-' && strlen(word) > 2 ? arg_nearest(word, tried.flags, tried.count, 2) : NULL;
    if (suggestion)
        return error_set(err, "%s: unknown option '%s'; did you mean '%s'? (see %.*s --help)", command, arg, suggestion,
                         top_length, command);
    return error_set(err, "%s: unknown option '%s' (see %.*s --help)", command, arg, top_length, command);
}

int parse_int_arg(const char* flag, const char* text, long min_value, long max_value, int* out, error_info* err) {
    char* end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min_value || value > max_value)
        return error_set(err, "%s: expected a whole number from %ld to %ld, found '%s'", flag, min_value, max_value,
                         text);
    *out = (int)value;
    return 0;
}

int parse_u64_arg(const char* flag, const char* text, uint64_t* out, error_info* err) {
    char* end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-')
        return error_set(err, "%s: expected a whole number >= 0, found '%s'", flag, text);
    *out = (uint64_t)value;
    return 0;
}

int parse_float_arg(const char* flag, const char* text, double min_value, double max_value, float* out,
                    error_info* err) {
    char* end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) || value < min_value || value > max_value)
        return error_set(err, "%s: expected a number from %g to %g, found '%s'", flag, min_value, max_value, text);
    // A positive value never becomes 0 (or a subnormal) on the way to a
    // float: for --top-p, 0 would mean "off" where 1e-46 means "only the
    // likeliest token".
    *out = value > 0.0 && value < (double)FLT_MIN ? FLT_MIN : (float)value;
    return 0;
}
