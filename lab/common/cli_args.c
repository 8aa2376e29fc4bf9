#include "lab/common/cli_args.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool arg_match(arg_cursor* cursor, const char* flag, bool takes_value, bool* failed, error_info* err) {
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
    return error_set(err, "%s: unknown option '%s' (see %.*s --help)", command, cursor->argv[cursor->index],
                     top_length, command);
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
