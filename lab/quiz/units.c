#include "lab/quiz/units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct unit_entry {
    const char* spelling;  // as accepted (case-insensitive)
    const char* canonical; // as shown
    quiz_dimension dim;
    double factor; // base units per unit
} unit_entry;

static const unit_entry UNITS[] = {
    {"B", "B", QUIZ_DIM_BYTES, 1.0},
    {"byte", "B", QUIZ_DIM_BYTES, 1.0},
    {"bytes", "B", QUIZ_DIM_BYTES, 1.0},
    {"KB", "KB", QUIZ_DIM_BYTES, 1e3},
    {"KiB", "KiB", QUIZ_DIM_BYTES, 1024.0},
    {"MB", "MB", QUIZ_DIM_BYTES, 1e6},
    {"MiB", "MiB", QUIZ_DIM_BYTES, 1048576.0},
    {"GB", "GB", QUIZ_DIM_BYTES, 1e9},
    {"GiB", "GiB", QUIZ_DIM_BYTES, 1073741824.0},
    {"TB", "TB", QUIZ_DIM_BYTES, 1e12},
    {"TiB", "TiB", QUIZ_DIM_BYTES, 1099511627776.0},
    {"%", "%", QUIZ_DIM_PERCENT, 1.0},
    {"x", "x", QUIZ_DIM_RATIO, 1.0},
    {"\xc3\x97", "x", QUIZ_DIM_RATIO, 1.0}, // the multiplication sign
    {"times", "x", QUIZ_DIM_RATIO, 1.0},
    {"ms", "ms", QUIZ_DIM_TIME, 1.0},
    {"s", "s", QUIZ_DIM_TIME, 1e3},
    {"us", "us", QUIZ_DIM_TIME, 1e-3},
    {"\xc2\xb5s", "us", QUIZ_DIM_TIME, 1e-3}, // micro sign + s
};
#define N_UNITS ((int)(sizeof UNITS / sizeof UNITS[0]))

static const char UNIT_LIST[] = "B, KB, KiB, MB, MiB, GB, GiB, TB, TiB, %, x, ms, s, us";

static const unit_entry* find_unit(const char* text) {
    for (int i = 0; i < N_UNITS; i++)
        if (strcasecmp(text, UNITS[i].spelling) == 0) return &UNITS[i];
    return NULL;
}

double quiz_unit_factor(const char* unit, quiz_dimension* dim) {
    const unit_entry* u = find_unit(unit);
    if (!u) return -1.0;
    if (dim) *dim = u->dim;
    return u->factor;
}

static const char* dimension_words(quiz_dimension dim) {
    switch (dim) {
    case QUIZ_DIM_BYTES: return "a size in bytes, such as 12.5 GiB";
    case QUIZ_DIM_PERCENT: return "a percentage, such as 12.5 %";
    case QUIZ_DIM_RATIO: return "a ratio, such as 17x";
    case QUIZ_DIM_TIME: return "a time, such as 3.2 ms";
    default: return "a plain number";
    }
}

int quiz_parse_quantity(const char* text, quiz_quantity* out, error_info* err) {
    memset(out, 0, sizeof *out);
    const char* p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '\0') return error_set(err, "no answer: type a number, such as 12.5 GiB");
    // strtod also reads "inf", "nan" and hex; accept only decimal digits.
    const char* digits = p + (*p == '-' || *p == '+');
    if (!isdigit((unsigned char)*digits) && !(*digits == '.' && isdigit((unsigned char)digits[1])))
        return error_set(err, "'%s' is not a number (expected a number such as 12.5 GiB)", text);
    // The decimal number's extent, [+-]digits[.digits][e[+-]digits], found
    // by hand: strtod alone would also take hex ("0x10") and "infinity".
    const char* end = digits;
    while (isdigit((unsigned char)*end))
        end++;
    if (*end == '.')
        for (end++; isdigit((unsigned char)*end);)
            end++;
    if ((*end == 'e' || *end == 'E')) {
        const char* exponent = end + 1 + (end[1] == '+' || end[1] == '-');
        if (isdigit((unsigned char)*exponent)) {
            for (end = exponent; isdigit((unsigned char)*end);)
                end++;
        }
    }
    char number[64];
    if ((size_t)(end - p) >= sizeof number) return error_set(err, "'%s': the number is too long", text);
    memcpy(number, p, (size_t)(end - p));
    number[end - p] = '\0';
    errno = 0;
    double value = strtod(number, NULL);
    if (errno == ERANGE || !isfinite(value)) return error_set(err, "'%s': the number is out of range", text);
    if (*end == ',' && isdigit((unsigned char)end[1]))
        return error_set(err, "'%s': write the number without ',' (use '.' for decimals, no thousands separators)",
                         text);
    const char* unit = end;
    while (isspace((unsigned char)*unit))
        unit++;
    char unit_text[32];
    size_t length = strlen(unit);
    while (length > 0 && isspace((unsigned char)unit[length - 1]))
        length--;
    if (length >= sizeof unit_text) return error_set(err, "'%s': unknown unit (expected one of %s)", text, UNIT_LIST);
    memcpy(unit_text, unit, length);
    unit_text[length] = '\0';
    out->typed_value = value;
    if (length == 0) {
        out->value = value;
        out->dim = QUIZ_DIM_NUMBER;
        return 0;
    }
    const unit_entry* u = find_unit(unit_text);
    if (!u) return error_set(err, "'%s': unknown unit '%s' (expected one of %s)", text, unit_text, UNIT_LIST);
    out->value = value * u->factor;
    out->dim = u->dim;
    out->has_unit = true;
    snprintf(out->unit, sizeof out->unit, "%s", u->canonical);
    return 0;
}

// "%.4g" without the exponent for ordinary magnitudes.
static void format_number(double value, char* out, int capacity) {
    double magnitude = fabs(value);
    if (value == floor(value) && magnitude < 1e15)
        snprintf(out, (size_t)capacity, "%.0f", value);
    else if (magnitude >= 1e-3 && magnitude < 1e6)
        snprintf(out, (size_t)capacity, "%.4g", value);
    else
        snprintf(out, (size_t)capacity, "%.4e", value);
}

// The same size in the other prefix family: GiB <-> GB, MiB <-> MB, ...
static const char* other_family(const char* unit) {
    static const char* const PAIRS[][2] = {{"KB", "KiB"}, {"MB", "MiB"}, {"GB", "GiB"}, {"TB", "TiB"}};
    for (int i = 0; i < 4; i++) {
        if (strcmp(unit, PAIRS[i][0]) == 0) return PAIRS[i][1];
        if (strcmp(unit, PAIRS[i][1]) == 0) return PAIRS[i][0];
    }
    return NULL;
}

void quiz_format_numeric(const quiz_numeric* n, char* out, int capacity) {
    char number[64];
    double factor = n->unit[0] ? quiz_unit_factor(n->unit, NULL) : 1.0;
    if (factor <= 0) factor = 1.0;
    format_number(n->value / factor, number, sizeof number);
    const char* other = n->dim == QUIZ_DIM_BYTES ? other_family(n->unit) : NULL;
    if (!other) {
        // "17x" and "45%" read as one word; "3.2 ms" with a space.
        bool attached = n->dim == QUIZ_DIM_RATIO || n->dim == QUIZ_DIM_PERCENT;
        snprintf(out, (size_t)capacity, "%s%s%s", number, n->unit[0] && !attached ? " " : "", n->unit);
        return;
    }
    char second[64];
    format_number(n->value / quiz_unit_factor(other, NULL), second, sizeof second);
    snprintf(out, (size_t)capacity, "%s %s (%s %s)", number, n->unit, second, other);
}

static bool within(double value, double expected, double rel_tolerance, double abs_tolerance) {
    double allowed = fmax(fabs(expected) * rel_tolerance, abs_tolerance);
    return fabs(value - expected) <= allowed;
}

// When `given` misses `expected` by exactly one decimal/binary prefix factor
// (2^30 / 10^9 for GB vs GiB, ...), says so in `out` and returns true.
static bool explain_prefix_mixup(double given, double expected, double rel_tolerance, char* out, int capacity) {
    static const struct {
        const char *decimal, *binary;
        double factor;
        const char* power;
    } PREFIXES[] = {
        {"KB", "KiB", 1.024, "2^10 = 1,024"},
        {"MB", "MiB", 1.048576, "2^20 = 1,048,576"},
        {"GB", "GiB", 1.073741824, "2^30 = 1,073,741,824"},
        {"TB", "TiB", 1.099511627776, "2^40 = 1,099,511,627,776"},
    };
    for (int i = 3; i >= 0; i--) { // the largest prefix first: GB/GiB is the common mix-up
        double f = PREFIXES[i].factor;
        if (within(given, expected * f, rel_tolerance, 0) || within(given, expected / f, rel_tolerance, 0)) {
            snprintf(out, (size_t)capacity,
                     "Your number is off by exactly the %s/%s factor: 1 %s = %s bytes but 1 %s = 10^%d bytes, "
                     "%.1f%% less. Check which of the two your result is in, and convert.",
                     PREFIXES[i].decimal, PREFIXES[i].binary, PREFIXES[i].binary, PREFIXES[i].power,
                     PREFIXES[i].decimal, 3 * (i + 1), (1.0 - 1.0 / f) * 100.0);
            return true;
        }
    }
    return false;
}

int quiz_check_numeric(const quiz_numeric* expected, const char* input, quiz_numeric_verdict* verdict,
                       error_info* err) {
    memset(verdict, 0, sizeof *verdict);
    quiz_quantity q;
    if (quiz_parse_quantity(input, &q, err)) return -1;
    double given = q.value;
    if (!q.has_unit) { // a bare number is in the unit the question asked for
        double factor = expected->unit[0] ? quiz_unit_factor(expected->unit, NULL) : 1.0;
        given = q.typed_value * (factor > 0 ? factor : 1.0);
    } else if (q.dim != expected->dim) {
        return error_set(err, "'%s' is %s; this question wants %s", input, dimension_words(q.dim),
                         dimension_words(expected->dim));
    }
    verdict->correct = within(given, expected->value, expected->rel_tolerance, expected->abs_tolerance);
    char answer[128], tolerance[64];
    quiz_format_numeric(expected, answer, sizeof answer);
    if (expected->rel_tolerance > 0)
        snprintf(tolerance, sizeof tolerance, "within %g%%", expected->rel_tolerance * 100);
    else if (expected->abs_tolerance > 0)
        snprintf(tolerance, sizeof tolerance, "within %g", expected->abs_tolerance);
    else
        snprintf(tolerance, sizeof tolerance, "exactly");
    int used = snprintf(verdict->feedback, sizeof verdict->feedback, "%s: the answer is %s (%s).",
                        verdict->correct ? "Correct" : "Not quite", answer, tolerance);
    if (!verdict->correct && expected->dim == QUIZ_DIM_BYTES && used < (int)sizeof verdict->feedback - 1) {
        verdict->feedback[used++] = ' ';
        verdict->unit_mixup = explain_prefix_mixup(given, expected->value, fmax(expected->rel_tolerance, 1e-3),
                                                   verdict->feedback + used, (int)sizeof verdict->feedback - used);
        if (!verdict->unit_mixup) verdict->feedback[used - 1] = '\0';
    }
    return 0;
}
